"""The edgebench command line as a user runs it, for tests: a fresh interpreter, captured text, bounded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def edgebench(
    *args: object, cwd: Path, timeout: float = 600, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`edgebench ARGS...` in `cwd` with this interpreter; stdin closed so nothing can wait on it."""
    return subprocess.run(
        [sys.executable, "-m", "edgebench", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
