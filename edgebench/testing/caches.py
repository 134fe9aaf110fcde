"""Where the test lab keeps what outlives a test session (a built rootfs, a fetched driver, a venv): one
rule for every such folder, so a CI machine points them all somewhere with the same variables."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(variable: str, name: str) -> Path:
    """$`variable` when set, else the user's cache folder's edgebench/`name` ($XDG_CACHE_HOME, else
    ~/.cache)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgebench" / name
