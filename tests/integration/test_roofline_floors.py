"""The main job's roofline, small: a suite that benches built-ins at 1 and 2 threads and measures the
ceilings at those counts (matmul, the memory-hierarchy sweep), then the report: every benched
configuration has a floor from the ceilings at its own thread count, and any that beats its floor by more
than the margin says why. The floors are checked against the stored figures they come from."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest

from edgebench.analysis.ceilings import BEATS_MARGIN, model_floors
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

SUITE = """
name = "mini"
devices = ["local"]
models = ["builtin:tinymlp", "builtin:convnet"]

[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 40, warmup_seconds = 0.05, min_seconds = 0.1 }

[[probe]]
kind = "matmul"
params = { backend = "onnxruntime", dtype = "fp32", threads = [1, 2], sizes = [[256, 512]], skinny = false, trials = 5, min_trial_seconds = 0.01, warmup_seconds = 0.05, max_seconds = 20 }

[[probe]]
kind = "bandwidth"
params = { sweep = true, threads = [1, 2], sweep_max_mb = 16, trials = 3, max_seconds = 20 }

[[probe]]
kind = "roofline"
params = { measure = false, bench = false }
"""


def test_every_benched_configuration_gets_a_floor_at_its_thread_count(tmp_path: Path) -> None:
    suite = tmp_path / "mini.toml"
    suite.write_text(SUITE)
    run = edgebench("run", suite, "--store", tmp_path / "s.db", cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "mini.html"
    rep = edgebench("report", "--store", tmp_path / "s.db", "--out", out, cwd=tmp_path, timeout=300)
    assert rep.returncode == 0, rep.stderr

    with Store(tmp_path / "s.db") as st:
        records = st.records()
        floors = model_floors(records, [r.run_id for r in st.runs()])
    assert {(f.model, f.config["threads"]) for f in floors} == {
        (m, t) for m in ("tinymlp", "convnet") for t in (1, 2)
    }
    for f in floors:
        assert f.ceilings.threads == f.config["threads"]
        used = [
            r
            for r in records
            if r.probe == "matmul" and r.metric == "effective_tops" and r.params.get("stat") == "best"
        ]
        at_most = max(r.value or 0 for r in used if r.params["threads"] <= f.config["threads"])
        assert f.ceilings.peak_tops["fp32"] == at_most  # no figure from more threads than the model had
        assert f.floor.level in {"L2", "LLC", "DRAM"} and f.floor.floor_ms > 0
        if f.beats_by > BEATS_MARGIN:
            assert (f.reason() or "").startswith(f"beats the {f.floor.bound} floor by")

    from edgebench.render.report.frames import floors as floors_frame

    text = unescape(re.sub(r"<[^>]+>", " ", out.read_text()))
    assert "Floors as the models ran" in text
    frame = floors_frame(records, [f.bench_run for f in floors])
    assert len(frame) == 4 and frame["floor_ms"].notna().all()
    for note in frame["note"]:
        assert note and note != "-" and note in text  # each configuration says how it stands
    assert "(derived)" in text  # local has no datasheet: its nominal peak is derived from the ISA
