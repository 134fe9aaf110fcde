"""`probe matmul`, `probe bandwidth`, `probe threads`: what the chip delivers, and how a model scales."""

from __future__ import annotations

from pathlib import Path

import typer

from ..jobs import Job
from ..probes.params import ProbeParams
from ..probes.registry import BandwidthParams, MatmulParams, ThreadsParams
from ..records import Record
from .common import (
    JSON_OPT,
    LAB_OPT,
    STORE_OPT,
    device_waits,
    note,
    open_lab,
    positive_seconds,
    print_json,
    records_json,
    render_table,
    warn,
)
from .core import check_inputs
from .params import probe_flags, refuse_native_only

DEVICE_OPT = typer.Option("local", "--device", "-d")
TIMEOUT_OPT = typer.Option(
    None, "--timeout", callback=positive_seconds, help="Bound on every remote call (default: descriptor)."
)
NO_STORE_OPT = typer.Option(False, "--no-store", help="Do not keep the results.")


def register(probe_app: typer.Typer) -> None:
    probe_app.command("matmul")(matmul)
    probe_app.command("bandwidth")(bandwidth)
    probe_app.command("threads")(threads)


def run_one(
    device: str,
    job_probe: str,
    params: ProbeParams,
    timeout: float | None,
    store: Path,
    no_store: bool,
    lab: Path,
    model: str | None = None,
    runtime: str | None = None,
) -> tuple[str, list[Record]]:
    """One job on one device, stored as a run; warnings to stderr; the job's own error on failure."""
    from ..execution.oneshot import run_now
    from ..models.refs import resolve_model
    from ..probes.common import check_runtime, probe_runtimes

    spec = open_lab(lab).get(device)
    ref = resolve_model(model) if model else None
    refuse_native_only(params, spec.agent, spec.name, spec.source)
    if ref is not None:
        check_runtime(ref, runtime, probe_runtimes(job_probe))  # refused here, before a run is stored
    job = Job(
        device=spec.name,
        probe=job_probe,
        model=ref,
        runtime=runtime,
        params=params.given(),
        timeout_s=timeout,
    )
    note(f"edgebench: probe {job_probe}{' ' + ref.name if ref else ''} on {spec.name}")
    shot = run_now(spec, [job], None if no_store else store, job_probe, on_state=device_waits(spec.name))
    for o in shot.outcomes:
        warn(o.warnings, f"{o.job.device}: ")
    shot.raise_first_error()
    return shot.run_id, shot.records


@probe_flags("matmul")
def matmul(
    device: str = DEVICE_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: MatmulParams = MatmulParams(),
) -> int:
    """Effective TOPS of GEMM per dtype, backend, size and thread count (and efficiency vs the datasheet)."""
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
                    r.annotations.get("emulated") and "emulated",
                ]
            )
    render_table(
        f"matmul on {device} (run {run_id})",
        ["backend", "op", "dtype", "shape", "MxNxK", "threads", "best TOPS", "median TOPS", "note"],
        rows,
    )
    eff = [
        [r.params["backend"], r.params["op"], r.params["dtype"], r.annotations["nominal_tops"], r.value]
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


@probe_flags("bandwidth")
def bandwidth(
    device: str = DEVICE_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: BandwidthParams = BandwidthParams(),
) -> int:
    """Memory bandwidth (STREAM read, copy, triad) for 1..N threads."""
    run_id, records = run_one(device, "bandwidth", params, timeout, store, no_store, lab)
    if as_json:
        print_json(records_json(records, run_id=run_id))
        return 0
    rows = [
        [
            r.params["kernel"],
            r.params["threads"],
            r.annotations["bytes"] / 2**20,
            r.value,
            median_of(records, r),
        ]
        for r in records
        if r.metric == "bandwidth_gbps" and r.params.get("stat") == "best"
    ]
    render_table(
        f"bandwidth on {device} (run {run_id}; STREAM bytes, write-allocate not counted)",
        ["kernel", "threads", "MiB moved", "best GB/s", "median GB/s"],
        rows,
    )
    return 0


@probe_flags("threads")
def threads(
    model: str = typer.Option(..., "--model", "-m", help="Model file (.onnx, .mnn) or builtin:NAME."),
    device: str = DEVICE_OPT,
    runtime: str = typer.Option(
        None, "--runtime", help="onnxruntime, mnn or litert (default: from the model file: .mnn runs on MNN)."
    ),
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: ThreadsParams = ThreadsParams(),
) -> int:
    """Latency per thread count (and per CPU cluster); the best thread count; whether more was slower."""
    check_inputs(params.inputs)
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
                f"best threads [{r.params['cluster']}]: {r.value:g} (p50 {r.annotations['p50_ms']:.4g} ms)"
                + ("; more threads were slower" if r.annotations.get("more_threads_slower") else "")
            )
    return 0
