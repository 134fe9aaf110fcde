"""Content hashes of host files, cached by (path, size, mtime) within one process object; and how long a
device may take to hash files of a given size."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class HashCache:
    """Remembers file hashes while the file's size and mtime are unchanged."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], str] = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._known:
            self._known[key] = sha256_file(path)
        return self._known[key]

    def content(self, files: Sequence[Path]) -> str:
        """The sha256 that names a model's content: its file's, or for a model in several files (an ncnn
        graph and its weights) the sha256 of their digests in order, so a change to any is a new model."""
        digests = [self.sha256(path) for path in files]
        return digests[0] if len(digests) == 1 else together_digest(digests)


def together_digest(digests: Sequence[str]) -> str:
    """One name for several files' contents (see HashCache.content)."""
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()


# The slowest hashing a device is planned for: sha256 in software on an in-order core, reading eMMC. Files a
# job's --timeout covers at this rate are hashed within --timeout; larger ones get the time they need.
HASH_BYTES_PER_S_FLOOR = 20e6


def hash_timeout(timeout: float, nbytes: int) -> tuple[float, str]:
    """(seconds, why): the call's own timeout for files it can hash at HASH_BYTES_PER_S_FLOOR, else the time
    `nbytes` take at that rate, with the reason in words (for the error if even that runs out)."""
    needed = nbytes / HASH_BYTES_PER_S_FLOOR
    if needed <= timeout:
        return timeout, ""
    return needed, (
        f"hashing {nbytes / 1e6:.0f} MB on the device was given {needed:.0f} s, the timeout of "
        f"{timeout:g} s scaled to the files' size at {HASH_BYTES_PER_S_FLOOR / 1e6:.0f} MB/s"
    )
