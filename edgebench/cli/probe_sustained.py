"""`probe thermal` and `probe power`: sustained runs with on-device sensor sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..jobs import Job
from ..probes.registry import PowerParams, ThermalParams
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

MODEL_OPT = typer.Option(..., "--model", "-m", help="Model file (.onnx, .mnn) or builtin:NAME.")
DEVICE_OPT = typer.Option("local", "--device", "-d")
RUNTIME_OPT = typer.Option(
    None, "--runtime", help="onnxruntime, mnn or litert (default: from the model file: .mnn runs on MNN)."
)
TIMEOUT_OPT = typer.Option(
    None,
    "--timeout",
    callback=positive_seconds,
    help="Extra bound on remote calls beyond the run (default: descriptor).",
)
NO_STORE_OPT = typer.Option(False, "--no-store", help="Do not keep the results.")


def register(probe_app: typer.Typer) -> None:
    probe_app.command("thermal")(thermal)
    probe_app.command("power")(power)


@probe_flags("thermal")
def thermal(
    model: str = MODEL_OPT,
    device: str = DEVICE_OPT,
    runtime: str = RUNTIME_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: ThermalParams = ThermalParams(),
) -> int:
    """Sustained run: throttle onset, sustained ratio, stability; latency, temperature, clocks over time."""
    run_id, records = _run(model, device, runtime, params, timeout, store, no_store, lab, "thermal")
    if as_json:
        print_json(records_json(records, run_id=run_id, summary=_summary(records)))
    else:
        _show_thermal(records, run_id)
    return 0


@probe_flags("power")
def power(
    model: str = MODEL_OPT,
    device: str = DEVICE_OPT,
    runtime: str = RUNTIME_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: PowerParams = PowerParams(),
) -> int:
    """Power net of idle and energy per inference (battery fuel gauge, hwmon rail or external monitor)."""
    run_id, records = _run(model, device, runtime, params, timeout, store, no_store, lab, "power")
    if as_json:
        print_json(records_json(records, run_id=run_id, summary=_summary(records)))
    else:
        _table(f"power {records[0].model if records else ''} on {device} (run {run_id})", records)
    return 0


def _run(
    model: str,
    device: str,
    runtime: str,
    params: ThermalParams | PowerParams,
    timeout: float | None,
    store: Path,
    no_store: bool,
    lab: Path,
    kind: str,
) -> tuple[str, list[Record]]:
    from ..execution.oneshot import run_now
    from ..models.refs import resolve_model
    from ..probes.common import check_runtime

    the_lab = open_lab(lab)
    spec = the_lab.get(device)
    ref = resolve_model(model)
    check_inputs(params.inputs)
    refuse_native_only(params, spec.agent, spec.name, spec.source)
    job = Job(
        device=spec.name, probe=kind, model=ref, runtime=runtime, params=params.given(), timeout_s=timeout
    )
    chosen = check_runtime(ref, runtime)  # a usage error is refused here, before a run is stored
    note(f"edgebench: {kind} {ref.name} on {spec.name} ({chosen}, {params.duration_s:g} s)")
    shot = run_now(spec, [job], None if no_store else store, kind, on_state=device_waits(spec.name))
    for o in shot.outcomes:
        warn(o.warnings, f"{o.job.device}: ")
    shot.raise_first_error()
    return shot.run_id, shot.records


def _summary(records: list[Record]) -> dict[str, Any]:
    """The headline figures by name (window series stay in the records)."""
    out: dict[str, Any] = {}
    for r in records:
        if "t_s" in r.params or "phase" in r.params and r.metric == "idle_power_mw":
            continue
        key = r.metric
        for qualifier in ("signal", "stat", "phase"):
            if qualifier in r.params:
                key += f"[{r.params[qualifier]}]"
        out.setdefault(key, r.value)
    return out


def _show_thermal(records: list[Record], run_id: str) -> None:
    windows: dict[float, dict[str, Any]] = {}
    for r in records:
        if "t_s" in r.params:
            row = windows.setdefault(r.params["t_s"], {"t_s": r.params["t_s"]})
            name = r.metric if "cpus" not in r.params else f"{r.metric} {r.params['cpus']}"
            row[name] = r.value
    columns = sorted({k for row in windows.values() for k in row if k != "t_s"})
    render_table(
        f"thermal windows (run {run_id})",
        ["t_s", *columns],
        [[row["t_s"], *[row.get(c) for c in columns]] for _, row in sorted(windows.items())],
    )
    _table(f"thermal summary (run {run_id})", [r for r in records if "t_s" not in r.params])


def _table(title: str, records: list[Record]) -> None:
    hidden = ("threads",)
    render_table(
        title,
        ["metric", "value", "unit", "params"],
        [
            [r.metric, r.value, r.unit, {k: v for k, v in r.params.items() if k not in hidden} or None]
            for r in records
        ],
    )
