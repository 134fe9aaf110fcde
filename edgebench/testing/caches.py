"""Where the test lab keeps what outlives a test session (a built rootfs, a fetched driver, a venv): one
rule for every such folder, so a CI machine points them all somewhere with the same variables."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_folder(variable: str, name: str) -> Path:
    """$`variable` when set, else the user's cache folder's edgebench/`name` ($XDG_CACHE_HOME, else
    ~/.cache)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgebench" / name


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the cache folder's lock (`root`/.lock): two test sessions never fill one folder at once."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
