"""`probe thermal` and `probe power`: sustained runs with on-device sensor sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..errors import UserError
from ..execution.jobs import Job
from ..execution.oneshot import run_now
from ..models.refs import resolve_model
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

MODEL_OPT = typer.Option(..., "--model", "-m", help="Model file (.onnx, .mnn) or builtin:NAME.")
DEVICE_OPT = typer.Option("local", "--device", "-d")
RUNTIME_OPT = typer.Option("onnxruntime", "--runtime", help="onnxruntime or mnn.")
THREADS_OPT = typer.Option(0, "--threads", help="Intra-op threads (0 = the runtime's default).")
AFFINITY_OPT = typer.Option(None, "--affinity", help="Pin the agent to CPUs, e.g. 4-7.")
SHAPE_OPT = typer.Option(None, "--shape", help="NAME=DIMS for dynamic inputs (repeatable).")
INPUTS_OPT = typer.Option(None, "--inputs", help=".npz with one array per model input.")
RATE_OPT = typer.Option(
    0.0, "--rate", min=0.0, help="Inferences per second with idle gaps (0: back-to-back)."
)
PERIOD_OPT = typer.Option(0.25, "--period", min=0.01, help="Sensor sampling period, s.")
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


def _common_params(
    threads: int, affinity: str | None, shape: list[str] | None, inputs: Path | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"threads": threads}
    if affinity:
        params["affinity"] = parse_cpus(affinity)
    if shape:
        params["shapes"] = parse_shapes(shape)
    if inputs is not None:
        if not inputs.is_file():
            raise UserError(f"{inputs}: inputs file not found")
        params["inputs"] = str(inputs)
    return params


def thermal(
    model: str = MODEL_OPT,
    device: str = DEVICE_OPT,
    runtime: str = RUNTIME_OPT,
    threads: int = THREADS_OPT,
    affinity: str = AFFINITY_OPT,
    shape: list[str] = SHAPE_OPT,
    inputs: Path = INPUTS_OPT,
    duration: float = typer.Option(1200.0, "--duration", min=0.1, help="Sustained run length, s (20 min)."),
    rate: float = RATE_OPT,
    window: float = typer.Option(
        None, "--window", min=0.01, help="Window length, s (default: 10 s, or duration/10 for short runs)."
    ),
    margin: float = typer.Option(
        0.10, "--margin", min=0.0, help="Throttled = latency above initial x (1 + margin)."
    ),
    period: float = PERIOD_OPT,
    cooldown_timeout: float = typer.Option(
        600.0,
        "--cooldown-timeout",
        min=0.0,
        help="Wait at most this long for the device to cool first (0: don't).",
    ),
    cooldown_margin: float = typer.Option(
        2.0, "--cooldown-margin", min=0.0, help="Cool = within this many °C of idle."
    ),
    idle_temp: float = typer.Option(
        None,
        "--idle-temp",
        help="The device's known idle temperature, °C (default: estimated while cooling).",
    ),
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Sustained run: throttle onset, sustained ratio, stability; latency, temperature, clocks over time."""
    if window is not None and window > duration:
        raise UserError(f"--window {window:g} is longer than --duration {duration:g}")
    params = {
        **_common_params(threads, affinity, shape, inputs),
        "duration_s": duration,
        "margin": margin,
        "period_s": period,
        "cooldown_timeout_s": cooldown_timeout,
        "cooldown_margin_c": cooldown_margin,
    }
    if rate:
        params["rate_hz"] = rate
    if window is not None:
        params["window_s"] = window
    if idle_temp is not None:
        params["idle_c"] = idle_temp
    records = _run(model, device, runtime, params, timeout, store, no_store, lab, "thermal")
    if as_json:
        print_json(records_json(records[1], run_id=records[0], summary=_summary(records[1])))
    else:
        _show_thermal(records[1], records[0])
    return 0


def power(
    model: str = MODEL_OPT,
    device: str = DEVICE_OPT,
    runtime: str = RUNTIME_OPT,
    threads: int = THREADS_OPT,
    affinity: str = AFFINITY_OPT,
    shape: list[str] = SHAPE_OPT,
    inputs: Path = INPUTS_OPT,
    duration: float = typer.Option(60.0, "--duration", min=0.1, help="Active phase length, s."),
    idle: float = typer.Option(10.0, "--idle", min=0.1, help="Idle baseline before and after, s each."),
    rate: float = RATE_OPT,
    period: float = PERIOD_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Power net of idle and energy per inference (battery fuel gauge, hwmon rail or external monitor)."""
    params = {
        **_common_params(threads, affinity, shape, inputs),
        "duration_s": duration,
        "idle_s": idle,
        "period_s": period,
    }
    if rate:
        params["rate_hz"] = rate
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
    params: dict[str, Any],
    timeout: float | None,
    store: Path,
    no_store: bool,
    lab: Path,
    kind: str,
) -> tuple[str, list[Record]]:
    the_lab = open_lab(lab)
    spec = the_lab.get(device)
    ref = resolve_model(model)
    job = Job(device=spec.name, probe=kind, model=ref, runtime=runtime, params=params, timeout_s=timeout)
    note(f"edgebench: {kind} {ref.name} on {spec.name} ({runtime}, {params['duration_s']:g} s)")
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
    hidden = ("threads", "samples_idle", "samples_active")
    render_table(
        title,
        ["metric", "value", "unit", "params"],
        [
            [r.metric, r.value, r.unit, {k: v for k, v in r.params.items() if k not in hidden} or None]
            for r in records
        ],
    )
