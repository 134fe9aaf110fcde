"""The main job's roofline, small: a suite that benches built-ins at 1 and 2 threads and measures the
ceilings at those counts (matmul, the memory-hierarchy sweep), then the report: every benched
configuration has a floor from the ceilings at its own thread count, and any that beats its floor by more
than the margin says why. The floors the report shows are checked against counts of the model files (onnx and numpy, not the
product's counter) and the raw ceilings the probes stored."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, shape_inference

from edgebench.analysis.ceilings import BEATS_MARGIN
from edgebench.models.refs import resolve_model
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


def weight_op_counts(path: Path) -> tuple[int, int, int]:
    """(FLOPs of Conv, MatMul and Gemm as 2 x multiply-adds, initializer bytes, input and output bytes),
    counted from the model file with onnx's shape inference and numpy."""
    model = shape_inference.infer_shapes(onnx.load(str(path)))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]
    }
    flops = 0
    for node in model.graph.node:
        out = int(np.prod(shapes[node.output[0]]))
        if node.op_type == "Conv":
            flops += 2 * out * int(np.prod(inits[node.input[1]].shape[1:]))  # Cin/groups x kh x kw a output
        elif node.op_type in ("MatMul", "Gemm"):
            b = inits[node.input[1]].shape if node.input[1] in inits else shapes[node.input[1]]
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            flops += 2 * out * int(b[1] if trans_b else b[0])
    io = sum(4 * int(np.prod(shapes[v.name])) for v in [*model.graph.input, *model.graph.output])
    return flops, sum(a.nbytes for a in inits.values()), io


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
        runs = [r.run_id for r in st.runs()]
    from edgebench.render.report.frames import floors as floors_frame

    frame = floors_frame(records, runs)  # the floors the report shows
    assert {(row.model, row.threads) for row in frame.itertuples()} == {
        (m, t) for m in ("tinymlp", "convnet") for t in (1, 2)
    }
    for row in frame.itertuples():
        # The expectations come from outside the floor's arithmetic: the model file counted with onnx and
        # numpy, and the raw ceilings the probes stored at no more threads than the model had.
        flops, weight_bytes, io_bytes = weight_op_counts(resolve_model(f"builtin:{row.model}").path)
        peak = max(r.value or 0 for r in records if r.probe == "matmul" and r.metric == "effective_tops"
                   and r.params.get("stat") == "best" and r.params["threads"] <= row.threads)  # fmt: skip
        rates = [r.value for r in records if r.metric == "sweep_bandwidth_gbps" and r.value
                 and r.params["threads"] <= row.threads]  # fmt: skip
        assert row.peak_gflops == pytest.approx(peak * 1e3)  # no figure from more threads than it had
        # FLOPs: the weight ops' 2 x multiply-adds plus elementwise work (ReLU, Add, pooling: under 5%)
        assert flops <= row.flops <= 1.05 * flops, (row.model, row.flops, flops)
        assert row.floor_bytes == weight_bytes + io_bytes  # every weight and the inputs and outputs, once
        compute_ms = flops / (peak * 1e12) * 1e3
        fastest_ms = (weight_bytes + io_bytes) / (max(rates) * 1e9) * 1e3
        slowest_ms = (weight_bytes + io_bytes) / (min(rates) * 1e9) * 1e3
        # no faster than its compute at the peak or its bytes at the fastest level measured; no slower than
        # both its work (elementwise included) at the peak and its bytes at the slowest level measured
        assert (
            max(compute_ms, fastest_ms) * 0.999 <= row.floor_ms <= max(1.05 * compute_ms, slowest_ms) * 1.001
        )
        assert row.level in {"L2", "LLC", "DRAM"} and row.bound == ("compute" if row.floor_ms == pytest.approx(
            row.flops / (peak * 1e12) * 1e3) else "memory")  # fmt: skip
        if row.beats_by > BEATS_MARGIN:
            assert row.note.startswith(f"beats the {row.bound} floor by")

    text = unescape(re.sub(r"<[^>]+>", " ", out.read_text()))
    assert "Floors as the models ran" in text
    assert len(frame) == 4 and frame["floor_ms"].notna().all()
    for note in frame["note"]:
        assert note and note != "-" and note in text  # each configuration says how it stands
    assert "(derived)" in text  # local has no datasheet: its nominal peak is derived from the ISA
