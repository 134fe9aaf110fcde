"""Where generated models (built-ins, converted and prepared files) are cached on the host."""

from __future__ import annotations

import os
from pathlib import Path


def models_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgebench" / "models"
