"""What a runtime's C code prints while one call runs, caught at the process's descriptors.

Runtimes log from C, past Python's `sys.stdout`/`sys.stderr`: ncnn to stderr (fd 2), MNN through printf to
stdout (fd 1; in the agent fd 1 is the stderr file, its JSON channel being a copy made first). Some of those
lines are the only evidence of what happened (the layer that refused its params, "Can't Find type=3
backend, use 0 instead"), so the descriptors point at a temporary file for the call and are put back after
it. C's stdio buffers are flushed on both sides, so a printf line lands in the capture it belongs to.

Standard library only: it runs in the agent.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    """The C library the process runs with (its `fflush`), or None where ctypes cannot open it."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def flush_c_stdio() -> None:
    """Flush every C stdio stream (`fflush(NULL)`): printf output still buffered is written where its
    descriptor points now, not wherever it points when the buffer fills."""
    libc = _libc()
    flush = getattr(libc, "fflush", None) if libc is not None else None
    if flush is not None:
        flush(None)


def with_output(call: Callable[[], Any], fds: Sequence[int] = (1, 2)) -> tuple[Any, str]:
    """`call()` with the descriptors `fds` (stdout and stderr unless told) caught in one file: (its
    result, what was written to them while it ran)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    flush_c_stdio()  # what was printed before goes where it was going
    with tempfile.TemporaryFile() as log:
        saved = [os.dup(fd) for fd in fds]
        try:
            for fd in fds:
                os.dup2(log.fileno(), fd)
            try:
                result = call()
            finally:
                flush_c_stdio()
        finally:
            for fd, copy in zip(fds, saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
        log.seek(0)
        return result, log.read().decode(errors="replace")


def with_stderr(call: Callable[[], Any]) -> tuple[Any, str]:
    """`call()` with the process's stderr caught at the descriptor (ncnn logs from C): (its result, what
    it wrote)."""
    return with_output(call, (2,))
