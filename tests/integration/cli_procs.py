"""Processes the integration tests start and watch: the edgebench command line (or any argv) with its
output captured, stdin closed so nothing can wait on it, and extra environment on top of this one's."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def popen(argv: Sequence[object], cwd: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(a) for a in argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )


def start(*args: object, cwd: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """`edgebench ARGS...` started in `cwd`, not waited for."""
    return popen([sys.executable, "-m", "edgebench", *args], cwd, env)


def board_suite(
    board: Any, folder: Path, suite_text: str, name: str = "board", **descriptor: Any
) -> tuple[Path, Path]:
    """A lab folder holding the ssh board's descriptor (as `name`) and a suite file: (lab, suite)."""
    lab = folder / "lab"
    board.write_descriptor(lab, name=name, **descriptor)
    suite = folder / "suite.toml"
    suite.write_text(suite_text)
    return lab, suite


def store_rows(store: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Rows from a store another process is writing; none while that process is still making it."""
    try:
        with sqlite3.connect(store, timeout=30) as db:
            return db.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
