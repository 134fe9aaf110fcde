"""Probe `matmul`: the effective TOPS a device delivers through each GEMM backend it has.

One agent call per backend (numpy BLAS, onnxruntime, MNN), so a crash in one runtime costs only its
results. The agent sweeps square sizes until the rate stops growing plus skinny M = 1 GEMMs, for every
dtype and thread count, and returns the per-call time of each trial; here they become `effective_tops`
records (best and median of the trials, 2·M·N·K operations per call, with the best trial's CPU share in
the annotations: process CPU time over wall time x threads, ~1 when the runtime had the CPUs it asked for
and no more), raw `trial_ms` samples, `efficiency` against the descriptor's `spec.peak_tops[dtype]` when it
is given, and per dtype and thread count `best_path_tops`: the fastest configuration over every backend and
op, its annotations naming the path that won.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from ..agent.protocol import MatmulTask
from ..errors import EdgebenchError, LabError, MeasurementError, UserError
from ..jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout
from .knobs import device_cpus, thread_counts
from .registry import DTYPES, MATMUL_BACKENDS, MatmulParams

BUSY_SHARE = 0.7  # a best trial with less CPU than this share of its threads ran on a busy device
# Other processes on the measured CPUs left fewer idle than this share of its threads: a busy device, even
# where the runtime's own share reads full (its pool spins while a thread waits for a CPU).
FREE_SHARE = 0.85
# What each backend is as a `runtime` in the records.
RUNTIME_OF = {"numpy": "numpy", "onnxruntime": "onnxruntime", "mnn": "mnn"}


def matmul_task(params: MatmulParams, backend: str, threads: list[int], budget_s: float) -> MatmulTask:
    """The agent task for one backend, from the job's typed params."""
    return MatmulTask(
        backend=backend,
        threads=threads,
        budget_s=budget_s,
        dtypes=list(params.dtype or DTYPES),
        seed=params.seed,
        affinity=list(params.affinity) if params.affinity else None,
        sizes=list(params.sizes) if params.sizes else None,
        skinny=None if params.skinny is None else [list(s) for s in params.skinny or ()],
        skip_square=not params.square,
        ops=list(params.ops) if params.ops else None,
        trials=params.trials,
        start=params.start,
        min_top=params.min_top,
        max_size=params.max_size,
        warmup_seconds=params.warmup_seconds,
        min_trial_seconds=params.min_trial_seconds,
    )


def run_matmul(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    """Measure every requested backend; a backend that fails becomes a warning unless all of them fail."""
    params = MatmulParams.of(job)
    backends = list(params.backend or MATMUL_BACKENDS)
    timeout = job_timeout(device, job)
    budget = min(params.max_seconds, max(10.0, 0.8 * timeout - 10.0))
    threads = thread_counts(params.threads, len(device_cpus(device, params.affinity)))
    if params.affinity:
        ctx.base_params = {**ctx.base_params, "affinity": list(params.affinity)}
    out = ProbeResult()
    failures: list[str] = []
    for backend in backends:
        task = matmul_task(params, backend, threads, budget)
        try:
            reply = device.run_agent(task, timeout)
        except (UserError, LabError):
            raise
        except EdgebenchError as exc:
            failures.append(f"{backend}: {exc}")
            continue
        out.extend(backend_records(ctx, reply.result, reply.warnings))
    if failures and not out.records:
        raise MeasurementError("; ".join(failures), device=device.name)
    out.warnings += [f"matmul backend failed: {f}" for f in failures]
    out.extend(efficiency_records(ctx, out, device.spec.spec.peak_tops))
    out.extend(best_path_records(ctx, out))
    return out


def tops(m: int, n: int, k: int, ms: float) -> float:
    """2·M·N·K operations in `ms` milliseconds, in TOPS."""
    return 2.0 * m * n * k / (ms / 1e3) / 1e12


def backend_records(ctx: RecordContext, result: dict[str, Any], warnings: list[str]) -> ProbeResult:
    """Records and raw samples from one backend's agent result."""
    backend = result.get("backend", "?")
    out = ProbeResult(warnings=[f"{backend}: {w}" for w in warnings])
    if not result.get("available", True):
        out.warnings.append(f"{backend}: not measured: {result.get('reason')}")
        return out
    bctx = dataclasses.replace(ctx, runtime=RUNTIME_OF.get(backend, backend))
    busy: list[tuple[float, str]] = []
    crowded: list[tuple[float, str]] = []
    for skip in result.get("skipped", []):
        what = f"{skip['dtype']} {skip['op']}" if skip.get("op") else skip["dtype"]
        out.warnings.append(f"{backend}: {what} not measured: {skip['reason']}")
    out.warnings += [f"{backend}: stopped early: {why}" for why in result.get("cut_short", [])]
    for r in result.get("results", []):
        params = measurement_params(backend, r)
        notes: dict[str, Any] = {"emulated": r["emulated"]} if r.get("emulated") else {}
        trials = [float(t) for t in r["trial_ms"]]
        cpu = [float(c) for c in r.get("trial_cpu_ms") or []]
        share = cpu_share(trials, cpu, int(r["threads"])) if cpu else None
        if share is not None:
            notes["cpu_share"] = round(share, 3)
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        what = f"{r['op']} {r['dtype']} {m}x{n}x{k} threads={r['threads']}"
        others = other_work(r)
        if others is not None:
            notes["others_cpus"], notes["idle_cpu_share"] = round(others[0], 2), round(others[1], 3)
            if others[1] < FREE_SHARE:
                crowded.append((others[0], what))
        best, median = tops(m, n, k, min(trials)), tops(m, n, k, statistics.median(trials))
        out.records.append(bctx.record("effective_tops", best, "TOPS", notes, **params, stat="best"))
        out.records.append(bctx.record("effective_tops", median, "TOPS", notes, **params, stat="median"))
        out.samples.append(bctx.samples("trial_ms", "ms", trials, **params))
        if share is not None:
            out.samples.append(bctx.samples("trial_cpu_ms", "ms", cpu, **params))
            if share < BUSY_SHARE:
                busy.append((share, what))
    if busy:
        worst = min(busy)
        out.warnings.append(
            f"{backend}: in {len(busy)} configuration(s) the best trial had under {BUSY_SHARE:.0%} of the "
            f"CPUs it asked for (worst: {worst[1]}, {worst[0]:.0%}): the device was busy, so those figures "
            "understate it; re-run on a quiet device"
        )
    if crowded:
        worst = max(crowded)
        out.warnings.append(
            f"{backend}: in {len(crowded)} configuration(s) other processes kept CPUs it ran on busy (worst: "
            f"{worst[1]}, {worst[0]:.2f} CPUs' worth): the device was busy, so those figures understate it; "
            "re-run on a quiet device"
        )
    return out


def other_work(r: dict[str, Any]) -> tuple[float, float] | None:
    """(CPUs' worth of other processes on the measured CPUs, share of its threads they left idle), from
    the agent's /proc/stat watch; None where the device could not tell."""
    others, watched = r.get("others_cpus"), r.get("cpus_watched")
    if not isinstance(others, int | float) or not isinstance(watched, int) or watched < 1:
        return None
    threads = max(int(r["threads"]), 1)
    return float(others), min(1.0, max(0.0, watched - float(others)) / threads)


def cpu_share(wall_ms: list[float], cpu_ms: list[float], threads: int) -> float:
    """Process CPU time over wall time x threads of the fastest trial (runtimes spin: ~1 undisturbed)."""
    best = min(range(len(wall_ms)), key=lambda i: wall_ms[i])
    return cpu_ms[best] / (wall_ms[best] * max(threads, 1))


def measurement_params(backend: str, r: dict[str, Any]) -> dict[str, Any]:
    """What one measured configuration is: backend, op, dtype, GEMM shape, threads, operand types."""
    return {
        "backend": backend,
        "op": r["op"],
        "dtype": r["dtype"],
        "m": r["m"],
        "n": r["n"],
        "k": r["k"],
        "threads": r["threads"],
        "shape": r["shape"],
        "operands": r["operands"],
    }


def best_path_records(ctx: RecordContext, measured: ProbeResult) -> ProbeResult:
    """Per dtype and thread count: the fastest configuration over every backend and op, and which it was."""
    best: dict[tuple[str, int], Any] = {}
    for r in measured.records:
        if r.metric != "effective_tops" or r.params.get("stat") != "best" or r.value is None:
            continue
        key = (r.params["dtype"], int(r.params["threads"]))
        if key not in best or r.value > best[key].value:
            best[key] = r
    out = ProbeResult()
    for (dtype, threads), r in sorted(best.items()):
        p = r.params
        notes = {
            **r.annotations,
            "path": f"{p['backend']} {p['op']} {p['operands']}",
            "shape": f"{p['m']}x{p['n']}x{p['k']}",
        }
        rctx = dataclasses.replace(ctx, runtime=r.runtime)
        out.records.append(
            rctx.record("best_path_tops", r.value, "TOPS", notes, dtype=dtype, threads=threads)
        )
    return out


def efficiency_records(ctx: RecordContext, measured: ProbeResult, peak_tops: dict[str, float]) -> ProbeResult:
    """Per backend, op and dtype: the best configuration against the datasheet peak for that dtype."""
    best: dict[tuple[str, str, str], Any] = {}
    for r in measured.records:
        if r.metric != "effective_tops" or r.params.get("stat") != "best" or r.value is None:
            continue
        key = (r.params["backend"], r.params["op"], r.params["dtype"])
        if key not in best or r.value > best[key].value:
            best[key] = r
    out = ProbeResult()
    for (_, _, dtype), r in sorted(best.items()):
        nominal = peak_tops.get(dtype)
        if nominal:
            params = {k: v for k, v in r.params.items() if k != "stat"}
            rctx = dataclasses.replace(ctx, runtime=r.runtime)
            notes = {**r.annotations, "nominal_tops": nominal}
            out.records.append(rctx.record("efficiency", r.value / nominal, "ratio", notes, **params))
    return out
