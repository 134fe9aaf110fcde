"""The layers of the README's Layout, enforced: import-linter's contracts in pyproject.toml hold on the
package, and they break on a copy of it given one upward import (so the check can fail)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import edgebench

ROOT = Path(edgebench.__file__).resolve().parent.parent
LINT = ["-c", "from importlinter.cli import lint_imports_command; lint_imports_command()", "--no-cache"]


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts on the `edgebench` found first under package_parent."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [sys.executable, *LINT, "--config", str(ROOT / "pyproject.toml")],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_package_keeps_its_layers() -> None:
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 2 kept, 0 broken." in res.stdout, res.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # A lazy import inside a function counts as much as one at the top.
        (
            "probes/common.py",
            "def _upward():\n    from ..execution import session\n",
            "layers",
        ),
        ("jobs.py", "from .models import refs as _refs\n", "layers"),
        ("results/store.py", "from ..probes import registry as _registry\n", "layers"),
        ("agent/timing.py", "def _leak():\n    from ..records import Record\n", "the agent stands alone"),
    ],
)
def test_one_upward_import_breaks_the_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    copy = tmp_path / "edgebench"
    shutil.copytree(ROOT / "edgebench", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + "\n\n" + line)
    res = lint_imports(tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{broken}" in res.stdout and "BROKEN" in res.stdout, res.stdout
    assert "Contracts: 1 kept, 1 broken." in res.stdout, res.stdout


def test_no_function_is_over_100_lines() -> None:
    """A function longer than a screenful does several things: each gets a name of its own."""
    import ast

    long = []
    for path in sorted((ROOT / "edgebench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
