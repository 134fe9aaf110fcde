"""A command a test starts imports this checkout's edgebench, not another clone's editable install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_started_interpreter_imports_this_checkout(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import edgebench; print(edgebench.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ), check=True,
    )  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    assert Path(out.stdout.strip()).resolve() == root / "edgebench" / "__init__.py", out.stdout
