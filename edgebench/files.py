"""Sealed files: what edgebench writes once and never changes (a built-in or converted model, a model the
store keeps) is made read-only, and a sealed file is shared by a hard link where a copy would go on the same
file system (the local device's cache, the store's kept models), so a 1 GB GGUF measured in many runs costs
its bytes once.

A file somebody may still write is always copied: its owner could rewrite it in place and a link would follow
the new bytes. A sealed file is replaced, never rewritten (a new file renamed over its name), which leaves
every link to the old bytes intact.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def seal(path: Path) -> None:
    """Take every write permission off `path` (before it is renamed into place)."""
    os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) & ~_WRITE)


def is_sealed(path: Path) -> bool:
    """True when nobody has write permission on `path`."""
    return not os.stat(path).st_mode & _WRITE


def link_sealed(source: Path, dest: Path) -> bool:
    """Hard-link `dest` to a sealed `source`; False (the caller copies) when `source` is writable, or the
    file system will not link it there (another device, no hard links, too many links)."""
    try:
        if not is_sealed(source):
            return False
        os.link(source, dest)
    except OSError:
        return False
    return True
