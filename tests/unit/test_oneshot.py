"""run_now: a run whose device cannot be reached is stored as failed, never left 'running'."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edgebench.descriptors import builtin_local
from edgebench.errors import LabError
from edgebench.execution.oneshot import run_now
from edgebench.jobs import Job
from edgebench.results.store import Store


def test_unreachable_device_marks_the_run_failed(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        builtin_local(), python=str(tmp_path / "no-python"), workdir=str(tmp_path / "w")
    )
    with pytest.raises(LabError, match="interpreter"):
        run_now(spec, [Job("local", "bench")], tmp_path / "s.db", "bench")
    with Store(tmp_path / "s.db") as st:
        [run] = st.runs()
    assert run.status == "failed" and run.finished
