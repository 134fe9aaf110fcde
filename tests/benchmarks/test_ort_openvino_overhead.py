"""edgebench's p50 on onnxruntime's OpenVINO EP against a bare InferenceSession loop with the same EP and
options, the two sides alternated round by round in one pytest-benchmark run: the conv stack, one thread,
every node on OpenVINO (require_backend), held to 0.85-1.15.

Both sides run in the OpenVINO venv (scripts/install-openvino-env.sh): edgebench through a `local` device
whose python is the venv's, the bare loop as a fresh venv interpreter in a session of its own, as the
agent is. The bare loop opens the EP as a user would for one thread (device_type CPU, num_of_threads 1,
one intra-op thread, sequential) and never profiles; edgebench's session profiled its load-time placement
run and ended profiling before anything was timed, and this holds it to that. The verdict is
edgebench.testing.verdict's, as in test_bench_overhead.py: more rounds until conclusive, pass or fail.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgebench.descriptors import builtin_local
from edgebench.execution.oneshot import run_now
from edgebench.jobs import Job
from edgebench.models.refs import resolve_model
from edgebench.testing.openvino import openvino_python
from edgebench.testing.verdict import QUIET_CV, Rounds, judge_band, robust_cv, until_conclusive

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 5
BUDGET_S = 45.0
RUNS = 200
LOW, HIGH, BROKEN = 0.85, 1.15, 2.0
SHAPES = {"image": (1, 3, 112, 112)}

# The bare loop: the agent's inputs (seed 0, uniform in [-1, 1), float32), a 0.5 s warm-up, RUNS timed runs
BARE = """
import json, sys, time
import numpy as np, onnxruntime as ort
path, runs = sys.argv[1], int(sys.argv[2])
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
opts.inter_op_num_threads = 1
opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
opts.log_severity_level = 3
ep = ("OpenVINOExecutionProvider", {"device_type": "CPU", "num_of_threads": "1"})
sess = ort.InferenceSession(path, opts, providers=[ep, "CPUExecutionProvider"])
assert sess.get_providers()[0] == "OpenVINOExecutionProvider"
rng = np.random.default_rng(0)
feeds = {i.name: rng.uniform(-1.0, 1.0, size=i.shape).astype(np.float32) for i in sess.get_inputs()}
start = time.perf_counter()
while time.perf_counter() - start < 0.5:
    sess.run(None, feeds)
times = []
for _ in range(runs):
    t0 = time.perf_counter_ns()
    sess.run(None, feeds)
    times.append((time.perf_counter_ns() - t0) / 1e6)
print(json.dumps(times))
"""


@pytest.fixture(scope="module")
def venv_python() -> str:
    """The OpenVINO venv's python (made on the first run, from PyPI; cached after)."""
    return openvino_python()


def bare_ms(venv: str, path: str) -> list[float]:
    res = subprocess.run(
        [venv, "-c", BARE, path, str(RUNS)],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return list(json.loads(res.stdout))


def test_openvino_p50_matches_a_bare_openvino_loop(benchmark, venv_python: str) -> None:  # type: ignore[no-untyped-def]
    model = resolve_model("builtin:convnet")
    device = replace(builtin_local(), python=venv_python)
    params = {"threads": 1, "runs": RUNS, "min_seconds": 0, "warmup_seconds": 0.5, "shapes": SHAPES}
    params.update(backend="openvino", require_backend=True)
    rounds = Rounds()
    ours_ms: list[float] = []
    bare_p50: list[float] = []

    def one_round() -> None:  # alternate the two sides so drifting machine load hits both alike
        shot = run_now(device, [Job("local", "bench", model, "onnxruntime", params)], None, "bench")
        shot.raise_first_error()
        ours = next(
            r.value for r in shot.records if r.metric == "latency_ms" and r.params.get("stat") == "p50"
        )
        [samples] = [s for s in shot.outcomes[0].samples if s.metric == "latency_ms"]
        bare = bare_ms(venv_python, str(model.path))
        ours_ms.append(ours)
        bare_p50.append(float(np.median(bare)))
        quiet = max(robust_cv(list(samples.values)), robust_cv(bare)) < QUIET_CV
        rounds.add(ours, bare_p50[-1], quiet)

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    name = "onnxruntime convnet openvino p50 edgebench / bare loop"
    verdict, extra = until_conclusive(
        one_round, lambda final: judge_band(name, rounds, LOW, HIGH, BROKEN, final), BUDGET_S, min_rounds=0
    )
    print(
        f"\n{verdict.reason}; rounds {ROUNDS} + {extra}; edgebench p50 {np.median(ours_ms):.3f} ms, "
        f"bare {np.median(bare_p50):.3f} ms; per round " + ", ".join(f"{r:.3f}" for r in rounds.ratios)
    )
    benchmark.extra_info.update(
        {"edgebench_p50_ms": ours_ms, "bare_p50_ms": bare_p50, "ratio": verdict.ratio, "basis": verdict.basis}
    )
    assert verdict.outcome == "pass", verdict.reason
