"""Where the lab's native tools (MNN `benchmark.out`, `benchncnn`, `llama-bench`) are found for the tests.

They live in `shared/lab-tools/` beside the repository (each with its BUILD.md), or where
$EDGEBENCH_LAB_TOOLS says. CI runs a fresh clone in a folder of its own with a read-only copy of shared/
beside it, so every ancestor of the repository and of the working directory is looked in, and a git
worktree's main checkout too (its shared/ sits beside the main repository, not beside the worktree).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV = "EDGEBENCH_LAB_TOOLS"


def candidate_roots(repo: Path, cwd: Path | None = None) -> list[Path]:
    """The folders that may hold the lab tools, in the order they are tried."""
    found: list[Path] = []
    if os.environ.get(ENV):
        found.append(Path(os.environ[ENV]))
    starts = [repo.resolve(), (cwd or Path.cwd()).resolve()]
    common = _git_common_dir(repo)
    if common is not None:
        starts.append(common.parent)
    for start in starts:
        for folder in (start, *start.parents):
            found.append(folder / "shared" / "lab-tools")
    return list(dict.fromkeys(found))  # first occurrence of each, in order


def find_tool(repo: Path, folder: str, binary: str) -> Path | None:
    """The first `<root>/<folder>` holding `binary` as a file, or None."""
    for root in candidate_roots(repo):
        if (root / folder / binary).is_file():
            return root / folder
    return None


def _git_common_dir(repo: Path) -> Path | None:
    """The repository's common git folder (a worktree's main .git), when git is there to say."""
    try:
        res = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(res.stdout.strip()) if res.returncode == 0 and res.stdout.strip() else None


def in_ci() -> bool:
    """True under CI (CI=1/true/yes), where the lab tools are part of the machine: their absence fails."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def tool_or_skip(repo: Path, folder: str, binary: str, what: str) -> Path:
    """The folder holding a lab tool, for a test: absent, the test fails under CI (the lab tools are part
    of the machine there) and is skipped elsewhere, saying where to put them."""
    import pytest

    found = find_tool(repo, folder, binary)
    if found is not None:
        return found
    why = (
        f"{what} not found: set {ENV} to the folder holding {folder}/ (built as its BUILD.md says) "
        "or put shared/lab-tools beside the repository"
    )
    if in_ci():
        pytest.fail(f"{why} (CI has the lab tools: ../shared/lab-tools)")
    pytest.skip(why)
