"""`fit --budget memory_mb=40` budgets the model's own memory, not the Python agent's ~50 MB baseline: an int8
MLP of ~1 MB fits, an fp32 MLP of ~268 MB does not, through the real CLI on `local`.

The reference is measured in the same test, from outside: a bare Python process that imports onnxruntime,
loads the same model and runs it; this test reads its VmRSS just before the load and its VmHWM after the
inferences from /proc/PID/status (the high-water mark reset from outside, through /proc/PID/clear_refs, at
the moment the load starts). The bench's `model_memory_mb` must agree with that figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from edgebench.models.builtin import build_mlp
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

BUDGET_MB = 40
# Agreement with the bare process: both load the same file in the same runtime; the agent adds its seeded
# inputs and the self-check's copy of the outputs (kilobytes here), the rest is allocator noise.
AGREE_MB = 6.0
AGREE_SHARE = 0.05

BARE = r"""
import sys
import numpy as np
import onnxruntime as ort
print("imported", flush=True)
sys.stdin.readline()
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feeds = {
    i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
    .astype(np.float32)
    for i in session.get_inputs()
}
for _ in range(5):
    session.run(None, feeds)
print("ran", flush=True)
sys.stdin.readline()
"""


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def bare_model_memory_mb(model: Path) -> float:
    """What loading and running `model` adds to a bare onnxruntime process, read from outside it (MB)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", BARE, str(model)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "imported"
        # VmHWM restarts here: the import is not the model
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
        before = _status_kib(proc.pid, "VmRSS:")
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ran"
        peak = _status_kib(proc.pid, "VmHWM:")
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    return (peak - before) * 1024 / 1e6


def _bench(model: Path, workdir: Path, repeats: int = 1) -> list[dict[str, dict]]:  # type: ignore[type-arg]
    """One bench run of `repeats` invocations: each invocation's memory records, by metric."""
    done = edgebench(
        "bench", model, "--device", "local", "--runs", 5, "--warmup", 1, "--warmup-seconds", 0,
        "--min-seconds", 0, "--repeats", repeats, "--store", workdir / "s.db", "--json", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    by_invocation: dict[int, dict[str, dict]] = {}  # type: ignore[type-arg]
    for r in json.loads(done.stdout)["records"]:
        if r["metric"].endswith("_mb"):
            by_invocation.setdefault(r["annotations"].get("invocation", 1), {})[r["metric"]] = r
    assert len(by_invocation) == repeats, sorted(by_invocation)
    return [by_invocation[k] for k in sorted(by_invocation)]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/PID/clear_refs")
def test_fit_budgets_the_models_memory(tmp_path: Path) -> None:
    small, big = tmp_path / "mlpsmall.onnx", tmp_path / "mlp268.onnx"
    onnx.save(build_mlp(hidden=768, width=256, layers=3, batch=1, seed=7), small)
    onnx.save(build_mlp(hidden=8192, width=8192, layers=1, batch=1, seed=8), big)
    made = edgebench(
        "variants", small, "--out", tmp_path / "v", "--only", "int8-dynamic", "--no-store", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    int8 = tmp_path / "v" / "mlpsmall.int8-dynamic.onnx"
    assert 0.7e6 < int8.stat().st_size < 1.5e6
    assert 260e6 < big.stat().st_size < 275e6

    mem = {"int8": _bench(int8, tmp_path, repeats=2), "fp32": _bench(big, tmp_path)}
    for name, path in (("int8", int8), ("fp32", big)):
        bare = bare_model_memory_mb(path)
        agent = mem[name][-1]["model_memory_mb"]
        print(f"{name}: model memory {agent['value']:.1f} MB (bare process, from outside: {bare:.1f} MB)")
        assert abs(agent["value"] - bare) <= max(AGREE_MB, AGREE_SHARE * bare), (agent, bare)
        assert agent["annotations"]["peak"] == "since load"
        baseline = agent["annotations"]["baseline_mb"]
        assert mem[name][-1]["peak_rss_mb"]["value"] >= baseline + agent["value"] - 1.0

    fit = edgebench(
        "fit", "--store", tmp_path / "s.db", "--budget", f"memory_mb={BUDGET_MB}", "--no-store", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert fit.returncode == 1, fit.stderr  # one does not fit
    verdicts = {
        r["model"]: r["annotations"] for r in json.loads(fit.stdout)["records"] if r["metric"] == "fits"
    }
    assert verdicts["mlpsmall.int8-dynamic"]["verdict"] == "fits", verdicts
    assert verdicts["mlp268"]["verdict"] == "does not fit", verdicts
    # The int8 model's memory is a range over its two invocations; the baseline is shown, not charged.
    small_mem = verdicts["mlpsmall.int8-dynamic"]["memory"]
    lo, hi = small_mem["model_mb"]
    runs = sorted(m["model_memory_mb"]["value"] for m in mem["int8"])
    assert (lo, hi) == pytest.approx(tuple(runs))
    assert verdicts["mlpsmall.int8-dynamic"]["values"]["memory_mb"] == pytest.approx(hi)
    assert small_mem["baseline_mb"] > BUDGET_MB > hi  # the whole process would not fit; the model does

    # The whole process can still be budgeted.
    whole = edgebench(
        "fit", "--store", tmp_path / "s.db", "--budget", f"process_memory_mb={BUDGET_MB}", "--no-store",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    verdicts = {
        r["model"]: r["annotations"] for r in json.loads(whole.stdout)["records"] if r["metric"] == "fits"
    }
    assert verdicts["mlpsmall.int8-dynamic"]["verdict"] == "does not fit", verdicts
