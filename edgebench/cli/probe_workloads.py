"""`probe soak` and `probe contention`: long runs (memory growth, latency drift) and co-running load."""

from __future__ import annotations

from pathlib import Path

import typer

from ..jobs import Job
from ..probes.params import ProbeParams
from ..probes.registry import ContentionParams, SoakParams
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

MODEL_OPT = typer.Option(..., "--model", "-m", help="Model file (.onnx, .mnn, .tflite) or builtin:NAME.")
DEVICE_OPT = typer.Option("local", "--device", "-d")
RUNTIME_OPT = typer.Option(
    None, "--runtime", help="onnxruntime, mnn or litert (default: from the model file)."
)
TIMEOUT_OPT = typer.Option(
    None, "--timeout", callback=positive_seconds, help="Extra bound on remote calls beyond the run."
)
NO_STORE_OPT = typer.Option(False, "--no-store", help="Do not keep the results.")


def register(probe_app: typer.Typer) -> None:
    probe_app.command("soak")(soak)
    probe_app.command("contention")(contention)


@probe_flags("soak")
def soak(
    model: str = MODEL_OPT,
    device: str = DEVICE_OPT,
    runtime: str = RUNTIME_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: SoakParams = SoakParams(),
) -> int:
    """A long run: resident memory and latency over time, RSS growth per hour with its interval, drift."""
    from ..probes.soak import soak_summary

    run_id, records = _run("soak", model, device, runtime, params, timeout, store, no_store, lab)
    summary = soak_summary(records)
    if as_json:
        print_json(records_json(records, run_id=run_id, summary=summary))
    else:
        _table(f"soak on {device} (run {run_id})", [r for r in records if "t_s" not in r.params])
    return 0


@probe_flags("contention")
def contention(
    model: str = MODEL_OPT,
    device: str = DEVICE_OPT,
    runtime: str = RUNTIME_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: ContentionParams = ContentionParams(),
) -> int:
    """Latency alone and beside a busy co-runner of N threads, and the co-runner's own slowdown."""
    run_id, records = _run("contention", model, device, runtime, params, timeout, store, no_store, lab)
    if as_json:
        print_json(records_json(records, run_id=run_id))
    else:
        _table(f"contention on {device} (run {run_id})", records)
    return 0


def _run(
    kind: str,
    model: str,
    device: str,
    runtime: str | None,
    params: ProbeParams,
    timeout: float | None,
    store: Path,
    no_store: bool,
    lab: Path,
) -> tuple[str, list[Record]]:
    from ..execution.oneshot import run_now
    from ..models.refs import resolve_model

    the_lab = open_lab(lab)
    spec = the_lab.get(device)
    ref = resolve_model(model)
    check_inputs(getattr(params, "inputs", None))
    refuse_native_only(params, spec.agent, spec.name, spec.source)
    job = Job(
        device=spec.name, probe=kind, model=ref, runtime=runtime, params=params.given(), timeout_s=timeout
    )
    note(f"edgebench: {kind} {ref.name} on {spec.name}")
    shot = run_now(spec, [job], None if no_store else store, kind, on_state=device_waits(spec.name))
    for o in shot.outcomes:
        warn(o.warnings, f"{o.job.device}: ")
    shot.raise_first_error()
    return shot.run_id, shot.records


def _table(title: str, records: list[Record]) -> None:
    render_table(
        title,
        ["metric", "value", "unit", "params"],
        [[r.metric, r.value, r.unit, {k: v for k, v in r.params.items()} or None] for r in records],
    )
