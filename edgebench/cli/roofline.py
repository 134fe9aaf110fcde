"""`edgebench roofline MODEL [--device D]`: FLOPs, weight and activation bytes, intensity; with a device, the
latency floor from its measured ceilings, what bounds it, and the efficiency of the measured latency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..errors import UserError
from ..jobs import Job
from ..probes.registry import RooflineParams
from ..records import RecordContext, new_run_id
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
from .shapes import check_plain_used, onnx_input_ranks, parse_shape_args, shapes_for

if TYPE_CHECKING:
    from ..analysis.ceilings import Ceilings, Measured
    from ..analysis.cost import ModelCost

COMPUTE_DTYPES = ("fp32", "fp16", "int8")
SHAPE_OPT = typer.Option(
    None, "--shape", help="NAME=DIMS (or MODEL:NAME=DIMS) for dynamic inputs (repeatable)."
)
VALUE_OPT = typer.Option(
    None, "--value", help="NAME=V for inputs that pick If branches, e.g. sr=16000 (repeatable)."
)


def register(app: typer.Typer) -> None:
    app.command("roofline")(roofline)


def parse_values(values: list[str] | None) -> dict[str, Any]:
    """--value NAME=V (or NAME=V1,V2): values of inputs that decide control flow, e.g. sr=16000."""
    out: dict[str, Any] = {}
    for item in values or []:
        name, sep, text = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            parts = [json.loads(p) for p in text.split(",")]
            out[name] = parts[0] if len(parts) == 1 else parts
        except ValueError:
            raise UserError(f"--value {item!r}: expected NAME=NUMBER like sr=16000") from None
    return out


def roofline(
    model: str = typer.Argument(..., help="ONNX model file or builtin:NAME."),
    device: str = typer.Option(None, "--device", "-d", help="Device whose ceilings give the floor."),
    shape: list[str] = SHAPE_OPT,
    value: list[str] = VALUE_OPT,
    measure: bool = typer.Option(
        None,
        "--measure/--no-measure",
        help="Measure the ceilings now (default: only when the store has none for the device).",
    ),
    bench: bool = typer.Option(
        False,
        "--bench",
        help="Bench the model now for the efficiency (default: use the latest stored bench).",
    ),
    top: int = typer.Option(10, "--top", min=0, help="Nodes to list, costliest first."),
    timeout: float = typer.Option(
        None, "--timeout", callback=positive_seconds, help="Bound on every remote call (default: descriptor)."
    ),
    store: Path = STORE_OPT,
    no_store: bool = typer.Option(False, "--no-store", help="Neither read nor keep results in the store."),
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Static cost of an ONNX model and, with --device, its roofline floor and bound on that device."""
    from ..analysis.cost import analyze
    from ..execution.ceilings import measure_ceilings
    from ..execution.oneshot import run_now
    from ..models.refs import resolve_model
    from ..probes.roofline import roofline_records

    ref = resolve_model(model)
    if ref.format != "onnx":
        raise UserError(f"{model}: roofline analyses ONNX models")
    args = parse_shape_args(shape, [model, ref.name])
    shapes, values = (
        shapes_for(args, [model, ref.name], onnx_input_ranks(ref.path), model),
        parse_values(value),
    )
    if args.plain:
        check_plain_used(args, {model: onnx_input_ranks(ref.path)})
    cost = analyze(ref.path, shapes, values)
    if device is None:
        ctx = RecordContext(run_id=new_run_id(), device="-", probe="roofline", model=ref.name)
        result = roofline_records(ctx, cost, None, None, shapes)
        warn(result.warnings)
        show(result.records, cost, None, top, as_json, ctx.run_id)
        return 0
    spec = open_lab(lab).get(device)
    ceilings, measured = stored_figures(None if no_store else store, spec.name, ref.name, shapes, measure)
    if ceilings is None:
        note(f"edgebench: measuring the ceilings of {spec.name} (matmul, bandwidth)")
        dtypes = sorted({d for d in cost.floor_flops_by_dtype if d in COMPUTE_DTYPES} | {"fp32"})
        waits = device_waits(spec.name)
        ceilings = measure_ceilings(spec, None if no_store else store, dtypes, on_state=waits)
    params: dict[str, Any] = {"ceilings": ceilings.to_params(), "bench": bench}
    if shapes:
        params["shapes"] = shapes
    if values:
        params["values"] = values
    if measured is not None and not bench:
        params["measured"] = measured.to_params()
    checked = RooflineParams.parse(params, origin="code").given()
    job = Job(
        device=spec.name,
        probe="roofline",
        model=ref,
        runtime="onnxruntime",
        params=checked,
        timeout_s=timeout,
    )
    shot = run_now(spec, [job], None if no_store else store, "roofline", on_state=device_waits(spec.name))
    for o in shot.outcomes:
        warn(o.warnings, f"{o.job.device}: ")
    shot.raise_first_error()
    if measured is None and not bench:
        note(
            f"edgebench: {ref.name} has no stored bench on {spec.name} with these shapes: no efficiency "
            "(run `edgebench bench` first, or add --bench)"
        )
    show([r for r in shot.records if r.probe == "roofline"], cost, ceilings, top, as_json, shot.run_id)
    return 0


def stored_figures(
    store: Path | None, device: str, model: str, shapes: dict[str, list[int]], measure: bool | None
) -> tuple[Ceilings | None, Measured | None]:
    """Ceilings and the latest p50 from the store (the ceilings are dropped when --measure asks for new)."""
    from ..analysis.ceilings import find_ceilings, measured_latency
    from ..results.store import Store

    if store is None or not store.exists():
        if measure is False:
            raise UserError(f"no stored ceilings for {device} (no store at {store}): drop --no-measure")
        return None, None
    with Store(store) as st:
        measured = measured_latency(st, device, model, shapes)
        at = (measured.threads, measured.affinity) if measured else (None, None)
        ceilings = None if measure else find_ceilings(st, device, *at)
    if ceilings is None and measure is False:
        threads = at[0]
        scope = f" measured at {threads} thread(s) or fewer (the bench's)" if threads else ""
        raise UserError(
            f"{store}: no matmul and bandwidth results for {device}{scope}; run `edgebench probe matmul` "
            "and `edgebench probe bandwidth`, or drop --no-measure"
        )
    return ceilings, measured


def show(
    records: list[Any], cost: ModelCost, ceilings: Ceilings | None, top: int, as_json: bool, run_id: str
) -> None:
    from ..analysis.cost import cost_summary, iter_costly

    if as_json:
        print_json(
            records_json(
                records,
                run_id=run_id,
                analysis=cost_summary(cost),
                ceilings=ceilings.to_params() if ceilings else None,
            )
        )
        return
    by_metric = {r.metric: r for r in records}
    rows = [
        [m, by_metric[m].value, by_metric[m].unit]
        for m in (
            "flops",
            "weight_bytes",
            "activation_bytes",
            "arithmetic_intensity",
            "floor_ms",
            "efficiency",
        )
        if m in by_metric
    ]
    render_table(
        f"roofline {records[0].model if records else ''} {cost.inputs}", ["metric", "value", "unit"], rows
    )
    if "floor_ms" in by_metric:
        p = by_metric["floor_ms"].params
        peaks = ", ".join(f"{dtype} {tops:.3g}" for dtype, tops in p["peak_tops"].items())
        note(
            f"bound: {p['bound']} (compute {p['compute_ms']:.4g} ms at {peaks} TOPS, memory "
            f"{p['memory_ms']:.4g} ms at {p['bandwidth_gbps']:.4g} GB/s)"
        )
    if top:
        render_table(
            "costliest nodes",
            ["node", "op", "FLOPs", "dtype", "output bytes"],
            [[n.name, n.op_type, n.flops, n.dtype, n.output_bytes] for n in iter_costly(cost, top)],
        )
