"""`probe matmul`, `probe bandwidth`, `probe threads`: what the chip delivers, and how a model scales."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from ..errors import UserError
from ..execution.jobs import Job
from ..execution.oneshot import run_now
from ..models.refs import resolve_model
from ..probes.bandwidth import check_params as check_bandwidth
from ..probes.knobs import shape_triples
from ..probes.matmul import check_params as check_matmul
from ..records import Record
from .common import (
    JSON_OPT,
    LAB_OPT,
    STORE_OPT,
    device_waits,
    note,
    open_lab,
    parse_cpus,
    parse_shapes,
    positive_seconds,
    print_json,
    records_json,
    render_table,
    warn,
)

DEVICE_OPT = typer.Option("local", "--device", "-d")
THREADS_OPT = typer.Option(None, "--threads", help="Thread counts, e.g. 1-4, 1,2,4 or max (default: 1..all).")
AFFINITY_OPT = typer.Option(None, "--affinity", help="Pin the agent to CPUs, e.g. 4-7.")
TIMEOUT_OPT = typer.Option(
    None, "--timeout", callback=positive_seconds, help="Bound on every remote call (default: descriptor)."
)
MAX_SECONDS_OPT = typer.Option(None, "--max-seconds", min=1.0, help="Time budget of each agent call, s.")
NO_STORE_OPT = typer.Option(False, "--no-store", help="Do not keep the results.")
INPUTS_OPT = typer.Option(None, "--inputs", help=".npz with one array per model input.")
DTYPE_OPT = typer.Option(None, "--dtype", help="fp32, fp16, int8 (repeatable or comma list; default: all).")
BACKEND_OPT = typer.Option(None, "--backend", help="numpy, onnxruntime, mnn (default: all present).")
KERNEL_OPT = typer.Option(None, "--kernel", help="read, copy, triad (default: all).")
CLUSTER_OPT = typer.Option(None, "--cluster", help="Only these spec.cpu_clusters (repeatable).")
SHAPE_OPT = typer.Option(None, "--shape", help="NAME=DIMS for dynamic inputs (repeatable).")
SKINNY_OPT = typer.Option(
    None,
    "--skinny",
    help="Decode-style GEMM MxNxK (repeatable; default 1x1024x1024, 1x4096x4096, 1x11008x4096).",
)
OPS_OPT = typer.Option(
    None,
    "--op",
    help="onnxruntime ops: MatMul, MatMulInteger, QLinearMatMul, DynamicQuantizeMatMul, MatMulInteger:u8u8.",
)


def register(probe_app: typer.Typer) -> None:
    probe_app.command("matmul")(matmul)
    probe_app.command("bandwidth")(bandwidth)
    probe_app.command("threads")(threads)


def flat(values: Sequence[str] | None) -> list[str]:
    """Repeated options that may also hold comma lists: ['fp32,int8', 'fp16'] -> ['fp32', 'int8', 'fp16']."""
    return [p.strip() for v in values or [] for p in v.split(",") if p.strip()]


def common_params(threads_opt: str | None, affinity: str | None, max_seconds: float | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if threads_opt:
        params["threads"] = threads_opt.strip()
    if affinity:
        params["affinity"] = parse_cpus(affinity)
    if max_seconds:
        params["max_seconds"] = max_seconds
    return params


def run_one(
    device: str,
    job_probe: str,
    params: dict[str, Any],
    timeout: float | None,
    store: Path,
    no_store: bool,
    lab: Path,
    model: str | None = None,
    runtime: str | None = None,
) -> tuple[str, list[Record]]:
    """One job on one device, stored as a run; warnings to stderr; the job's own error on failure."""
    spec = open_lab(lab).get(device)
    ref = resolve_model(model) if model else None
    job = Job(device=spec.name, probe=job_probe, model=ref, runtime=runtime, params=params, timeout_s=timeout)
    note(f"edgebench: probe {job_probe}{' ' + ref.name if ref else ''} on {spec.name}")
    shot = run_now(spec, [job], None if no_store else store, job_probe, on_state=device_waits(spec.name))
    for o in shot.outcomes:
        warn(o.warnings, f"{o.job.device}: ")
    shot.raise_first_error()
    return shot.run_id, shot.records


def matmul(
    device: str = DEVICE_OPT,
    dtype: list[str] = DTYPE_OPT,
    backend: list[str] = BACKEND_OPT,
    threads_opt: str = THREADS_OPT,
    affinity: str = AFFINITY_OPT,
    sizes: str = typer.Option(
        None,
        "--sizes",
        help="Square sizes to measure, e.g. 512,1024 (default: swept until the rate stops growing).",
    ),
    min_top: int = typer.Option(
        None, "--min-top", min=2, help="Sweep at least up to this size (default 2048)."
    ),
    max_size: int = typer.Option(None, "--max-size", min=2, help="Never beyond this size (default 8192)."),
    skinny: list[str] = SKINNY_OPT,
    no_skinny: bool = typer.Option(False, "--no-skinny", help="Only square sizes."),
    no_square: bool = typer.Option(False, "--no-square", help="Only the skinny shapes."),
    ops: list[str] = OPS_OPT,
    trials: int = typer.Option(None, "--trials", min=1, help="Timed trials per configuration (default 7)."),
    max_seconds: float = MAX_SECONDS_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Effective TOPS of GEMM per dtype, backend, size and thread count (and efficiency vs the datasheet)."""
    params = common_params(threads_opt, affinity, max_seconds)
    if dtype:
        params["dtype"] = flat(dtype)
    if backend:
        params["backend"] = flat(backend)
    if sizes:
        params["sizes"] = sizes
    if ops:
        params["ops"] = flat(ops)
    for key, value in (("min_top", min_top), ("max_size", max_size), ("trials", trials)):
        if value is not None:
            params[key] = value
    if no_skinny and skinny:
        raise UserError("--skinny and --no-skinny contradict each other")
    if no_skinny:
        params["skinny"] = False
    elif skinny:
        params["skinny"] = ["x".join(map(str, s)) for s in shape_triples(flat(skinny))]
    if no_square:
        params["square"] = False
    check_matmul(params)
    run_id, records = run_one(device, "matmul", params, timeout, store, no_store, lab)
    if as_json:
        print_json(records_json(records, run_id=run_id, peak_tops=peaks(records)))
        return 0
    rows = []
    for r in records:
        if r.metric == "effective_tops" and r.params.get("stat") == "best":
            p = r.params
            rows.append(
                [
                    p["backend"],
                    p["op"],
                    p["dtype"],
                    p["shape"],
                    f"{p['m']}x{p['n']}x{p['k']}",
                    p["threads"],
                    r.value,
                    median_of(records, r),
                    p.get("emulated") and "emulated",
                ]
            )
    render_table(
        f"matmul on {device} (run {run_id})",
        ["backend", "op", "dtype", "shape", "MxNxK", "threads", "best TOPS", "median TOPS", "note"],
        rows,
    )
    eff = [
        [r.params["backend"], r.params["op"], r.params["dtype"], r.params["nominal_tops"], r.value]
        for r in records
        if r.metric == "efficiency"
    ]
    if eff:
        render_table("efficiency vs spec.peak_tops", ["backend", "op", "dtype", "nominal TOPS", "ratio"], eff)
    return 0


def median_of(records: list[Record], best: Record) -> float | None:
    key = {k: v for k, v in best.params.items() if k != "stat"}
    for r in records:
        if (
            r.metric == best.metric
            and r.params.get("stat") == "median"
            and {k: v for k, v in r.params.items() if k != "stat"} == key
        ):
            return r.value
    return None


def peaks(records: list[Record]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in records:
        if r.metric == "effective_tops" and r.params.get("stat") == "best" and r.value is not None:
            dtype = r.params["dtype"]
            out[dtype] = max(out.get(dtype, 0.0), r.value)
    return out


def bandwidth(
    device: str = DEVICE_OPT,
    kernel: list[str] = KERNEL_OPT,
    threads_opt: str = THREADS_OPT,
    affinity: str = AFFINITY_OPT,
    trials: int = typer.Option(None, "--trials", min=1, help="Trials after the first (default 10)."),
    array_mb: float = typer.Option(
        None, "--array-mb", min=1.0, help="Array size, MiB (default: 4x the last-level cache)."
    ),
    llc_mb: float = typer.Option(
        None,
        "--llc-mb",
        min=0.0625,
        help="Last-level cache to size arrays from, MiB (default: the device's sysfs).",
    ),
    max_seconds: float = MAX_SECONDS_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Memory bandwidth (STREAM read, copy, triad) for 1..N threads."""
    params = common_params(threads_opt, affinity, max_seconds)
    if kernel:
        params["kernel"] = flat(kernel)
    if trials:
        params["trials"] = trials
    if array_mb:
        params["array_mb"] = array_mb
    if llc_mb:
        params["llc_mb"] = llc_mb
    check_bandwidth(params)
    run_id, records = run_one(device, "bandwidth", params, timeout, store, no_store, lab)
    if as_json:
        print_json(records_json(records, run_id=run_id))
        return 0
    rows = [
        [r.params["kernel"], r.params["threads"], r.params["bytes"] / 2**20, r.value, median_of(records, r)]
        for r in records
        if r.metric == "bandwidth_gbps" and r.params.get("stat") == "best"
    ]
    render_table(
        f"bandwidth on {device} (run {run_id}; STREAM bytes, write-allocate not counted)",
        ["kernel", "threads", "MiB moved", "best GB/s", "median GB/s"],
        rows,
    )
    return 0


def threads(
    model: str = typer.Option(..., "--model", "-m", help="Model file (.onnx, .mnn) or builtin:NAME."),
    device: str = DEVICE_OPT,
    runtime: str = typer.Option("onnxruntime", "--runtime", help="onnxruntime or mnn."),
    threads_opt: str = typer.Option(None, "--threads", help="Thread counts to try (default: 1..all)."),
    affinity: str = AFFINITY_OPT,
    cluster: list[str] = CLUSTER_OPT,
    no_clusters: bool = typer.Option(False, "--no-clusters", help="Only the unpinned sweep."),
    shape: list[str] = SHAPE_OPT,
    inputs: Path = INPUTS_OPT,
    runs: int = typer.Option(50, "--runs", min=1, help="At least this many timed runs per thread count."),
    warmup: int = typer.Option(1, "--warmup", min=0),
    min_seconds: float = typer.Option(1.0, "--min-seconds", min=0.0),
    max_seconds: float = typer.Option(60.0, "--max-seconds", min=0.01),
    margin: float = typer.Option(
        0.05, "--margin", min=0.0, help="Slower = p50 above the best with fewer threads x (1 + margin)."
    ),
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Latency per thread count (and per CPU cluster); the best thread count; whether more was slower."""
    params: dict[str, Any] = {
        "runs": runs,
        "warmup": warmup,
        "min_seconds": min_seconds,
        "max_seconds": max_seconds,
        "slower_margin": margin,
    }
    if threads_opt:
        params["threads"] = threads_opt
    if affinity:
        params["affinity"] = parse_cpus(affinity)
    if cluster:
        params["clusters"] = flat(cluster)
    if no_clusters:
        params["per_cluster"] = False
    if shape:
        params["shapes"] = parse_shapes(shape)
    if inputs is not None:
        if not inputs.is_file():
            raise UserError(f"{inputs}: inputs file not found")
        params["inputs"] = str(inputs)
    run_id, records = run_one(device, "threads", params, timeout, store, no_store, lab, model, runtime)
    if as_json:
        best = {r.params["cluster"]: r.value for r in records if r.metric == "best_threads"}
        print_json(records_json(records, run_id=run_id, best_threads=best))
        return 0
    speed = {
        (r.params["cluster"], r.params["threads"]): r.value for r in records if r.metric == "thread_speedup"
    }
    rows = [
        [
            r.params.get("cluster"),
            r.params["threads"],
            r.value,
            speed.get((r.params.get("cluster"), r.params["threads"])),
        ]
        for r in records
        if r.metric == "latency_ms" and r.params.get("stat") == "p50"
    ]
    render_table(
        f"threads {records[0].model if records else model} on {device} (run {run_id})",
        ["cluster", "threads", "p50 ms", "speedup vs 1"],
        rows,
    )
    for r in records:
        if r.metric == "best_threads":
            note(
                f"best threads [{r.params['cluster']}]: {r.value:g} (p50 {r.params['p50_ms']:.4g} ms)"
                + ("; more threads were slower" if r.params.get("more_threads_slower") else "")
            )
    return 0
