"""Where generated models (built-ins, converted and prepared files) are cached on the host."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # onnx is imported only where a model is generated
    import onnx


def models_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgebench" / "models"


def generated_once(folder: Path | None, filename: str, build: Callable[[], onnx.ModelProto]) -> Path:
    """The cached file `filename` of a generated ONNX model, built and saved the first time (through a
    temporary name, so a concurrent reader never sees half a file)."""
    import onnx

    folder = folder or models_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        onnx.save(build(), tmp)
        os.replace(tmp, path)
    return path
