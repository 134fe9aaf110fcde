"""`load_ms`, `first_inference_ms`, `peak_rss_mb` and `rss_increase_mb` of `edgebench bench` against a bare
onnxruntime process on the same model and threads, alternated round by round.

The bare process (BARE, below) uses the runtime's own API only; its memory is read from outside, by this
test, from /proc/<pid>/status (VmRSS just before the session is created, VmHWM at the end), so nothing of
the agent's own memory readers is in the reference. Timing is judged like every benchmark here
(edgebench.testing.verdict): in band over quiet rounds, beyond BROKEN a defect whatever the load, and
never quiet, the median of the rounds' ratios within LOADED of 1; pass or fail, never a skip.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebench.testing.cli import edgebench
from edgebench.testing.verdict import OthersWatch, Rounds, judge_band, until_conclusive

HIDDEN = 2048  # two 16 MiB fp32 weights: load and memory large enough to measure, quick to run
ROUNDS, BUDGET_S = 3, 60.0
LOW, HIGH, BROKEN, LOADED = 0.6, 1.6, 3.0, 2.0  # one-shot timings: a single run each, not a p50
BARE = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
path = sys.argv[1]
sys.stdout.write("imported\n"); sys.stdout.flush(); sys.stdin.readline()  # RSS before the load, from outside
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
opts.inter_op_num_threads = 1
t = time.perf_counter_ns()
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
load_ms = (time.perf_counter_ns() - t) / 1e6
x = np.random.default_rng(0).uniform(-1, 1, (1, {hidden})).astype(np.float32)
t = time.perf_counter_ns()
sess.run(None, {"x": x})
first_ms = (time.perf_counter_ns() - t) / 1e6
for _ in range(20):
    sess.run(None, {"x": x})
sys.stdout.write(json.dumps({"load_ms": load_ms, "first_inference_ms": first_ms}) + "\n"); sys.stdout.flush()
sys.stdin.readline()  # peak RSS, from outside
""".replace("{hidden}", str(HIDDEN))


def two_layer_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.02, f"w{i}")
               for i in range(2)]  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w1"], ["y"])],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, HIDDEN])], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def status_mb(pid: int, field: str) -> float:
    """A /proc/<pid>/status memory field (kB) in MB (1e6 bytes, edgebench's unit)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def bare_run(model: Path) -> dict[str, float]:
    """The bare process's own timings and its memory read from outside."""
    proc = subprocess.Popen([sys.executable, "-c", BARE, str(model)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "imported"
        before = status_mb(proc.pid, "VmRSS")
        proc.stdin.write("\n")
        proc.stdin.flush()
        found = json.loads(proc.stdout.readline())
        peak = status_mb(proc.pid, "VmHWM")
        proc.stdin.write("\n")
        proc.stdin.flush()
    finally:
        proc.communicate(timeout=60)
    return {**found, "peak_rss_mb": peak, "rss_increase_mb": peak - before}


def edgebench_run(model: Path, cwd: Path) -> dict[str, float]:
    res = edgebench("bench", model, "--runtime", "onnxruntime", "--threads", "1", "--runs", "20",
                    "--min-seconds", "0", "--warmup", "0", "--no-store", "--json", cwd=cwd)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return {
        r["metric"]: r["value"]
        for r in json.loads(res.stdout)["records"]
        if r["metric"] in ("load_ms", "first_inference_ms", "peak_rss_mb", "rss_increase_mb")
    }


def test_load_first_inference_and_memory_match_a_bare_process(tmp_path: Path) -> None:
    model = two_layer_model(tmp_path / "two.onnx")
    weights_mb = 2 * HIDDEN * HIDDEN * 4 / 1e6
    rounds = {m: Rounds() for m in ("load_ms", "first_inference_ms")}
    memory: list[tuple[dict[str, float], dict[str, float]]] = []

    def one_round() -> None:
        with OthersWatch() as watch:
            ours, bare = edgebench_run(model, tmp_path), bare_run(model)
        memory.append((ours, bare))
        for metric, r in rounds.items():
            r.add(ours[metric], bare[metric], watch.quiet)

    def verdict(final: bool):  # type: ignore[no-untyped-def]
        found = [
            judge_band(f"{m} edgebench / bare", r, LOW, HIGH, BROKEN, final, LOADED)
            for m, r in rounds.items()
        ]
        return min(found, key=lambda v: ("fail", "more", "pass").index(v.outcome))

    found, _ = until_conclusive(one_round, verdict, BUDGET_S, min_rounds=ROUNDS)
    for m, r in rounds.items():
        print(f"\n{m}: edgebench " + ", ".join(f"{v:.1f}" for v in r.ours) + "; bare "
              + ", ".join(f"{v:.1f}" for v in r.reference) + f" ms; {judge_band(m, r, LOW, HIGH, BROKEN, True, LOADED).reason}")  # fmt: skip
    assert found.outcome == "pass", found.reason
    # Memory is no timing: every round alike. The agent's interpreter carries a little more than the bare
    # one (its own modules); the model's own cost must be what the bare process pays for it.
    for ours, bare in memory:
        print(f"peak_rss_mb {ours['peak_rss_mb']:.1f} vs bare {bare['peak_rss_mb']:.1f} (from /proc); "
              f"rss_increase_mb {ours['rss_increase_mb']:.1f} vs bare {bare['rss_increase_mb']:.1f}; weights {weights_mb:.1f} MB")  # fmt: skip
        assert bare["peak_rss_mb"] * 0.9 <= ours["peak_rss_mb"] <= bare["peak_rss_mb"] * 1.25 + 10
        assert ours["rss_increase_mb"] == pytest.approx(bare["rss_increase_mb"], rel=0.25, abs=8.0)
        assert ours["rss_increase_mb"] >= 0.9 * weights_mb  # the weights are resident: at least them
