"""Content hashes of host files, cached by (path, size, mtime) within one process object."""

from __future__ import annotations

import hashlib
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
