"""Probe `matmul`: the effective TOPS a device delivers through each GEMM backend it has.

One agent call per backend (numpy BLAS, onnxruntime, MNN), so a crash in one runtime costs only its
results. The agent sweeps square sizes until the rate stops growing plus skinny M = 1 GEMMs, for every
dtype and thread count, and returns the per-call time of each trial; here they become `effective_tops`
records (best and median of the trials, 2·M·N·K operations per call), raw `trial_ms` samples, and
`efficiency` against the descriptor's `spec.peak_tops[dtype]` when it is given.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from ..errors import EdgebenchError, LabError, MeasurementError, UserError
from ..execution.jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout
from .knobs import as_list, choices, device_cpus, int_list, number, shape_triples, thread_counts

DTYPES = ("fp32", "fp16", "int8")
BACKENDS = ("numpy", "onnxruntime", "mnn")
ORT_OPS = ("MatMul", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulInteger:u8u8")
DEFAULT_BUDGET_S = 600.0
BUSY_SHARE = 0.7  # a best trial with less CPU than this share of its threads ran on a busy device
# The params a suite may give (checked when the suite loads).
PARAMS = frozenset({
    "dtype", "dtypes", "backend", "backends", "ops", "threads", "affinity", "sizes", "skinny", "square",
    "trials", "min_top", "max_size", "start", "warmup_seconds", "min_trial_seconds", "max_seconds", "seed",
})  # fmt: skip
# What each backend is as a `runtime` in the records.
RUNTIME_OF = {"numpy": "numpy", "onnxruntime": "onnxruntime", "mnn": "mnn"}


def matmul_task(job: Job, backend: str, threads: list[int], budget_s: float) -> dict[str, Any]:
    """The agent task for one backend, from the job's params (validated here, not on the device)."""
    p = job.params
    task: dict[str, Any] = {
        "kind": "matmul",
        "backend": backend,
        "threads": threads,
        "budget_s": budget_s,
        "dtypes": choices(p, "dtype", DTYPES, aliases=("dtypes",)) or list(DTYPES),
        "seed": int(p.get("seed", 0)),
        "affinity": [int(c) for c in as_list(p.get("affinity"))] or None,
    }
    sizes = int_list(p, "sizes", minimum=2)
    if sizes:
        task["sizes"] = sizes
    if "skinny" in p:
        task["skinny"] = [list(s) for s in shape_triples(p["skinny"])]
    if p.get("square") is False:
        task["skip_square"] = True
    ops = choices(p, "ops", ORT_OPS)
    if ops:
        task["ops"] = ops
    for key, agent_key in (
        ("trials", "trials"),
        ("min_top", "min_top"),
        ("max_size", "max_size"),
        ("start", "start"),
    ):
        if p.get(key) is not None:
            task[agent_key] = int(number(p, key, 0, minimum=1))
    for key, agent_key in (("warmup_seconds", "warmup_s"), ("min_trial_seconds", "min_trial_s")):
        if p.get(key) is not None:
            task[agent_key] = number(p, key, 0.0)
    return task


def check_params(params: dict[str, Any]) -> None:
    """Refuse bad params before any device is touched (the CLI calls this first)."""
    choices(params, "backend", BACKENDS, aliases=("backends",))
    thread_counts(params, 1)
    matmul_task(Job(device="-", probe="matmul", params=params), "numpy", [1], 1.0)


def run_matmul(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    """Measure every requested backend; a backend that fails becomes a warning unless all of them fail."""
    p = job.params
    backends = choices(p, "backend", BACKENDS, aliases=("backends",)) or list(BACKENDS)
    timeout = job_timeout(device, job)
    budget = min(number(p, "max_seconds", DEFAULT_BUDGET_S, minimum=1.0), max(10.0, 0.8 * timeout - 10.0))
    threads = thread_counts(p, len(device_cpus(device, p)))
    base = matmul_task(job, backends[0], threads, budget)  # validates params before anything runs
    if base["affinity"]:
        ctx.base_params = {**ctx.base_params, "affinity": base["affinity"]}
    out = ProbeResult()
    failures: list[str] = []
    for backend in backends:
        task = {**base, "backend": backend}
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
    for skip in result.get("skipped", []):
        what = f"{skip['dtype']} {skip['op']}" if skip.get("op") else skip["dtype"]
        out.warnings.append(f"{backend}: {what} not measured: {skip['reason']}")
    out.warnings += [f"{backend}: stopped early: {why}" for why in result.get("cut_short", [])]
    for r in result.get("results", []):
        params = measurement_params(backend, r, result)
        trials = [float(t) for t in r["trial_ms"]]
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        out.records.append(
            bctx.record("effective_tops", tops(m, n, k, min(trials)), "TOPS", **params, stat="best")
        )
        out.records.append(
            bctx.record(
                "effective_tops", tops(m, n, k, statistics.median(trials)), "TOPS", **params, stat="median"
            )
        )
        out.samples.append(bctx.samples("trial_ms", "ms", trials, **params))
        cpu = [float(c) for c in r.get("trial_cpu_ms") or []]
        if cpu:
            out.samples.append(bctx.samples("trial_cpu_ms", "ms", cpu, **params))
            share = cpu_share(trials, cpu, int(r["threads"]))
            if share < BUSY_SHARE:
                busy.append((share, f"{r['op']} {r['dtype']} {m}x{n}x{k} threads={r['threads']}"))
    if busy:
        worst = min(busy)
        out.warnings.append(
            f"{backend}: in {len(busy)} configuration(s) the best trial had under {BUSY_SHARE:.0%} of the "
            f"CPUs it asked for (worst: {worst[1]}, {worst[0]:.0%}): the device was busy, so those figures "
            "understate it; re-run on a quiet device"
        )
    return out


def cpu_share(wall_ms: list[float], cpu_ms: list[float], threads: int) -> float:
    """Process CPU time over wall time x threads of the fastest trial (runtimes spin: ~1 undisturbed)."""
    best = min(range(len(wall_ms)), key=lambda i: wall_ms[i])
    return cpu_ms[best] / (wall_ms[best] * max(threads, 1))


def measurement_params(backend: str, r: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {
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
    if r.get("emulated"):
        params["emulated"] = r["emulated"]
    return params


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
            out.records.append(
                rctx.record("efficiency", r.value / nominal, "ratio", **params, nominal_tops=nominal)
            )
    return out
