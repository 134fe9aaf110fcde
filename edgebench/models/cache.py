"""Where generated models (built-ins, converted and prepared files) are cached on the host."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import seal

if TYPE_CHECKING:  # onnx is imported only where a model is generated
    import onnx


def models_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgebench" / "models"


def generated_once(folder: Path | None, filename: str, build: Callable[[], onnx.ModelProto]) -> Path:
    """The cached file `filename` of a generated ONNX model, built and saved the first time (through a
    temporary name, so a concurrent reader never sees half a file)."""
    import onnx

    return written_once(folder, filename, lambda tmp: onnx.save(build(), tmp))


def written_once(folder: Path | None, filename: str, write: Callable[[Path], None]) -> Path:
    """The cached file `filename`, written by `write(path)` the first time, for files that are not an ONNX
    protobuf (GGUF): through a temporary name, so a concurrent reader never sees half a file."""
    folder = folder or models_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            write(tmp)
            seal(tmp)  # never rewritten: shared by link with the local device's cache and the store
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed writer leaves no half file behind
            raise
        os.replace(tmp, path)
    return path
