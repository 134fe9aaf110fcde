"""Where the tests find the lab's native tools: beside a clean clone in a folder of its own (CI), above it,
or where $EDGEBENCH_LAB_TOOLS says."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebench.testing.labtools import find_tool, in_ci

TOOL = "mnn-3.6.1-linux-x86_64"


def tool_at(root: Path) -> Path:
    folder = root / "shared" / "lab-tools" / TOOL
    folder.mkdir(parents=True)
    (folder / "benchmark.out").write_bytes(b"\x7fELF")
    folder.chmod(0o555)  # CI's copy of shared/ has no write bits
    return folder


def test_a_clone_beside_shared_finds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEBENCH_LAB_TOOLS", raising=False)
    found = tool_at(tmp_path)
    (tmp_path / "main").mkdir()
    assert find_tool(tmp_path / "main", TOOL, "benchmark.out") == found


def test_a_clone_deeper_down_finds_it_above(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEBENCH_LAB_TOOLS", raising=False)
    found = tool_at(tmp_path)
    repo = tmp_path / "builds" / "42" / "edgebench"
    repo.mkdir(parents=True)
    assert find_tool(repo, TOOL, "benchmark.out") == found


def test_the_environment_wins_and_absence_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tool_at(tmp_path / "elsewhere").parent
    monkeypatch.setenv("EDGEBENCH_LAB_TOOLS", str(elsewhere))
    assert find_tool(tmp_path / "repo", TOOL, "benchmark.out") == elsewhere / TOOL
    monkeypatch.delenv("EDGEBENCH_LAB_TOOLS")
    assert find_tool(tmp_path / "repo", TOOL, "no-such-binary") is None


def test_ci_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert in_ci()
    monkeypatch.setenv("CI", "")
    assert not in_ci()
