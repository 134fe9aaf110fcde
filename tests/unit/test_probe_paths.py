"""Probes reach the best path each runtime has: aligned buffers, MNN at the requested thread count (checked
with per-thread CPU time), reduced precision said to be emulated when it is, the winning path named."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from edgebench.agent import matmul as agent_mm
from edgebench.probes.matmul import backend_records, best_path_records
from edgebench.records import ProbeResult, RecordContext


def thread_ticks() -> dict[str, int]:
    """CPU ticks (user + system) of every thread of this process."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[tid] = int(fields[11]) + int(fields[12])
    return ticks


def busy_threads(step, seconds: float = 0.6) -> int:  # type: ignore[no-untyped-def]
    """How many threads of this process burnt CPU while `step` ran for `seconds`."""
    step()
    before = thread_ticks()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        step()
    after = thread_ticks()
    return sum(1 for tid, t in after.items() if t - before.get(tid, 0) >= 2)


@pytest.mark.parametrize("dtype", ["fp32", "int8", "fp16"])
def test_operands_and_outputs_are_cache_line_aligned(dtype: str) -> None:
    a, b = agent_mm.make_operands(dtype, 33, 17, 65, 0)
    assert a.ctypes.data % 64 == 0 and b.ctypes.data % 64 == 0
    out = agent_mm.aligned_empty(np, (33, 17), np.int32)
    assert out.ctypes.data % 64 == 0 and out.shape == (33, 17) and out.flags.c_contiguous


def test_mnn_matmul_runs_at_the_requested_thread_count() -> None:
    """'1 thread' used MNN's default of 4 threads (1.99 CPUs on a 2-CPU host) before the runtime manager."""
    pytest.importorskip("MNN")
    backend = agent_mm.MnnBackend([])
    try:
        kernel = backend.build("expr.matmul", "fp32", 384, 384, 384, 1, 0)
        assert busy_threads(kernel.step) == 1
    finally:
        backend.close()


def test_mnn_reduced_precision_that_computes_in_fp32_is_emulated() -> None:
    pytest.importorskip("MNN")
    backend = agent_mm.MnnBackend([])
    try:
        assert "emulated" in (backend.precision_evidence("fp16", 5e-8) or "")
        assert backend.precision_evidence("fp16", 4e-3) is None  # fp16 rounding shows: it ran in fp16
        assert backend.precision_evidence("fp32", 5e-8) is None
    finally:
        backend.close()


def test_onnxruntime_without_a_bf16_kernel_says_so() -> None:
    pytest.importorskip("onnxruntime")
    with pytest.raises(agent_mm.Unsupported, match="no bf16 kernel"):
        agent_mm.OrtBackend(None, []).ops("bf16")


def test_the_best_path_record_names_the_winner() -> None:
    ctx = RecordContext("r", "dev", "matmul")

    def result(backend: str, op: str, ms: float) -> dict:
        row = {"op": op, "dtype": "int8", "m": 64, "n": 64, "k": 64, "threads": 1, "shape": "square",
               "operands": "u8s8", "emulated": None, "trial_ms": [ms, ms * 1.1], "trial_cpu_ms": [ms, ms]}  # fmt: skip
        return {"backend": backend, "available": True, "results": [row]}

    out = ProbeResult()
    out.extend(backend_records(ctx, result("onnxruntime", "MatMulInteger", 0.01), []))
    out.extend(backend_records(ctx, result("onnxruntime", "QLinearMatMul", 0.02), []))
    [best] = best_path_records(ctx, out).records
    assert best.metric == "best_path_tops" and best.params == {"dtype": "int8", "threads": 1}
    assert (
        best.annotations["path"] == "onnxruntime MatMulInteger u8s8" and best.annotations["cpu_share"] == 1.0
    )


def test_the_runtime_is_imported_before_the_agent_pins_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime reads the CPUs it may use at import: imported after a pin to one CPU, its int8 GEMM took
    3x as long. Every model task goes through import_then_pin."""
    from edgebench.agent import bench

    calls: list[str] = []
    monkeypatch.setattr(bench, "import_runtime", lambda runtime: calls.append(f"import {runtime}") or 1.0)
    monkeypatch.setattr(bench, "pin", lambda cpus: calls.append(f"pin {cpus}") or cpus)
    affinity, cost = bench.import_then_pin({"runtime": "mnn", "affinity": [0]})
    assert calls == ["import mnn", "pin [0]"] and affinity == [0] and cost["import_ms"] == 1.0
