"""Verbs: variants, accuracy, profile, sensitivity (model variants and their numerics)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..errors import UserError
from ..jobs import Job, JobOutcome
from ..probes.registry import AccuracyParams, ProfileParams, SensitivityParams
from ..records import Record
from .common import (
    JSON_OPT,
    LAB_OPT,
    STORE_OPT,
    device_waits,
    note,
    open_lab,
    parse_shapes,
    positive_seconds,
    print_json,
    records_json,
    render_table,
    warn,
)
from .core import check_inputs
from .params import probe_flags

if TYPE_CHECKING:
    from ..execution.oneshot import OneShot

DEVICE_OPT = typer.Option("local", "--device", "-d", help="Device name from the lab.")
SHAPE_OPT = typer.Option(None, "--shape", help="NAME=DIMS for dynamic inputs, e.g. x=1x3x224 (repeatable).")
INPUTS_OPT = typer.Option(None, "--inputs", help=".npz with one array per model input.")
THREADS_OPT = typer.Option(0, "--threads", min=0, help="Intra-op threads (0 = the runtime's default).")
TIMEOUT_OPT = typer.Option(
    None, "--timeout", callback=positive_seconds, help="Bound on every remote call (default: descriptor)."
)
NO_STORE_OPT = typer.Option(False, "--no-store", help="Do not keep the results.")
OUT_OPT = typer.Option(..., "--out", "-o", help="Folder for the variant files.")
CALIB_OPT = typer.Option(None, "--calib", help=".npz of calibration inputs (one array per input).")
VARIANTS_ARG = typer.Argument(..., help="Variant model file(s) (.onnx, .mnn).")


def register(app: typer.Typer) -> None:
    app.command("variants")(variants)
    app.command("accuracy")(accuracy)
    app.command("profile")(profile)
    app.command("sensitivity")(sensitivity)


# ---- variants ------------------------------------------------------------------------------------------
def variants(
    model: str = typer.Argument(..., help="fp32 ONNX model file or builtin:NAME."),
    out: Path = OUT_OPT,
    calib: Path = CALIB_OPT,
    shape: list[str] = SHAPE_OPT,
    only: str = typer.Option(None, "--only", help="Comma-separated subset, e.g. fp16,int8-dynamic,mnn-fp32."),
    samples: int = typer.Option(8, "--samples", min=1, help="Random calibration samples (without --calib)."),
    seed: int = typer.Option(0, "--seed"),
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Make fp16, int8 (dynamic, static), MNN (fp32, int8-weight, int8) and ncnn (fp32, fp16 weights) variants
    of a model."""
    from ..execution.provenance import host_provenance
    from ..models.refs import resolve_model
    from ..models.variants import VARIANT_KINDS, make_variants, variant_outcomes
    from ..records import new_run_id

    ref = resolve_model(model)
    kinds = [k.strip() for k in only.split(",") if k.strip()] if only else list(VARIANT_KINDS)
    note(f"edgebench: variants of {ref.name} into {out}")

    def progress(v: Any) -> None:
        size = f"{v.size_bytes} B" if v.ok else "FAILED"
        note(f"edgebench:   {v.name}: {size} ({v.seconds:.1f} s)")

    vset = make_variants(
        ref,
        out,
        calib=calib,
        shapes=parse_shapes(shape),
        kinds=kinds,
        samples=samples,
        seed=seed,
        on_variant=progress,
    )
    manifest = out / f"{ref.name}.variants.json"
    import json

    manifest.write_text(json.dumps(vset.manifest(), indent=1) + "\n")
    run_id = new_run_id()
    outcomes = variant_outcomes(run_id, vset)
    if not no_store:
        _store_outcomes(store, run_id, outcomes, host_provenance())
    for v in vset.variants:
        for w in v.warnings:
            loud = "calibrated on RANDOM" in w
            note(f"edgebench: {'WARNING' if loud else 'warning'}: {w}")
        if not v.ok:
            note(f"edgebench: warning: {v.name}: not made: {v.error}")
    if vset.log_lines:
        note(
            f"edgebench: the converters printed {vset.log_lines} line(s) of warnings and logs: see {vset.log}"
        )
    records = [r for o in outcomes for r in o.records]
    errors = [{"variant": v.name, "error": v.error} for v in vset.variants if not v.ok]
    if as_json:
        print_json(
            records_json(
                records,
                run_id=run_id,
                manifest=str(manifest),
                errors=errors,
                warnings=[w for v in vset.variants for w in v.warnings],
            )
        )
    else:
        rows = [["fp32", str(ref.path), vset.source_size, 1.0, ""]]
        for v in vset.variants:
            rows.append(
                [
                    v.name,
                    str(v.path) if v.path else "-",
                    v.size_bytes,
                    v.size_bytes / vset.source_size if v.size_bytes else None,
                    v.error or _variant_note(v.params),
                ]
            )
        render_table(
            f"variants of {ref.name} (run {run_id})", ["variant", "file", "bytes", "x fp32", "note"], rows
        )
    return 0 if any(v.ok for v in vset.variants) else 1


def _variant_note(params: dict[str, Any]) -> str:
    parts = []
    if params.get("calibration"):
        parts.append(f"calibration={params['calibration']} ({params.get('samples')} samples)")
    if params.get("format"):
        parts.append(f"format={params['format']}")
    return ", ".join(parts)


def _store_outcomes(store: Path, run_id: str, outcomes: list[JobOutcome], provenance: dict[str, Any]) -> None:
    from ..results.store import Store

    with Store(store) as st:
        st.begin_run(run_id, "variants", provenance)
        for o in outcomes:
            st.save_job(run_id, o)
        st.finish_run(run_id, "ok" if all(o.ok for o in outcomes) else "failed")


# ---- device verbs --------------------------------------------------------------------------------------
def _run_jobs(lab: Path, device: str, jobs: list[Job], store: Path, no_store: bool, kind: str) -> OneShot:
    from ..execution.oneshot import run_now

    the_lab = open_lab(lab)
    spec = the_lab.get(device)
    shot = run_now(spec, jobs, None if no_store else store, kind, on_state=device_waits(spec.name))
    for o in shot.outcomes:
        warn(o.warnings, f"{o.job.device}: {o.job.model.name if o.job.model else ''}: ")
    return shot


def _finish(shot: OneShot) -> int:
    """All failed: the first failure's own error and exit code. Some failed: say which, exit 1."""
    failed = [o for o in shot.outcomes if not o.ok]
    if failed and len(failed) == len(shot.outcomes):
        shot.raise_first_error()
    for o in failed:
        note(f"edgebench: error: {o.job.model.name if o.job.model else o.job.probe}: {o.error}")
    return 1 if failed else 0


@probe_flags("accuracy")
def accuracy(
    variant: list[str] = VARIANTS_ARG,
    reference: str = typer.Option(
        None,
        "--reference",
        "-r",
        help="The fp32 reference model (with --backend: default, the model itself on the CPU in fp32).",
    ),
    device: str = DEVICE_OPT,
    runtime: str = typer.Option(
        None,
        "--runtime",
        help="Runtime for ONNX variants (default onnxruntime; .mnn files always run on mnn).",
    ),
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: AccuracyParams = AccuracyParams(),
) -> int:
    """Compare variants' outputs with the fp32 reference on a device: max/mean abs error, cosine, SNR."""
    from ..models.refs import resolve_model

    on_backend = params.backend != "cpu" or params.precision is not None
    if reference is None and not on_backend:
        raise UserError("accuracy needs --reference (the fp32 model), or --backend to compare a backend")
    ref = resolve_model(reference) if reference is not None else None
    check_inputs(params.inputs)
    if ref is not None:
        params = dataclasses.replace(params, reference=str(ref.path))
    against = ref.name if ref is not None else "the CPU in fp32"
    jobs = [
        Job(
            device=device,
            probe="accuracy",
            model=resolve_model(v),
            runtime=runtime,
            params=params.given(),
            timeout_s=timeout,
        )
        for v in variant
    ]
    note(
        f"edgebench: accuracy of {', '.join(j.model.name for j in jobs if j.model)} against {against} "
        f"on {device}"
    )
    shot = _run_jobs(lab, device, jobs, store, no_store, "accuracy")
    code = _finish(shot)
    records = shot.records
    if as_json:
        print_json(records_json(records, run_id=shot.run_id, errors=_errors(shot)))
    else:
        _accuracy_table(records, f"accuracy against {against} on {device} (run {shot.run_id})")
    return code


def _accuracy_table(records: list[Record], title: str) -> None:
    """One row per variant output (and per backend run: as asked, then its fp32 remedy), where it ran."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        if r.params.get("output") is None:
            continue  # per-op records: their first divergent op is in the warnings
        backend = str(r.params.get("backend", "cpu")) + (
            f" {r.params['precision']}" if r.params.get("precision") else ""
        )
        if r.params.get("remedy"):
            backend += f", {r.params['remedy']}"
        key = (str(r.params.get("variant")), str(r.params.get("output")), backend)
        where = r.annotations.get("backend_actual")
        row = rows.setdefault(key, {"where": r.params.get("reference_device"), "ran": where})
        row[r.metric] = r.value
    render_table(
        title,
        [
            "variant",
            "output",
            "backend",
            "ran on",
            "max_abs_err",
            "mean_abs_err",
            "cosine",
            "snr_db",
            "reference ran on",
        ],
        [
            [
                v,
                o,
                b,
                d["ran"] or "-",
                d.get("max_abs_err"),
                d.get("mean_abs_err"),
                d.get("cosine"),
                d.get("snr_db"),
                d["where"],
            ]
            for (v, o, b), d in rows.items()
        ],
    )


def _errors(shot: OneShot) -> list[dict[str, Any]]:
    return [o.error_dict() for o in shot.outcomes if not o.ok]


@probe_flags("profile")
def profile(
    model: str = typer.Argument(..., help="Model file (.onnx, .mnn) or builtin:NAME."),
    device: str = DEVICE_OPT,
    runtime: str = typer.Option(None, "--runtime", help="onnxruntime or mnn (.mnn files: mnn)."),
    top: int = typer.Option(15, "--top", min=1, help="Ops shown in the summary."),
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: ProfileParams = ProfileParams(),
) -> int:
    """Per-op times on a device (onnxruntime's profiler or MNN's per-op callbacks) against the latency."""
    from ..models.refs import resolve_model
    from ..probes.common import check_runtime

    ref = resolve_model(model)
    check_inputs(params.inputs)
    check_runtime(ref, runtime)  # a usage error is refused here, before a run is stored
    job = Job(
        device=device, probe="profile", model=ref, runtime=runtime, params=params.given(), timeout_s=timeout
    )
    note(f"edgebench: profile {ref.name} on {device}")
    shot = _run_jobs(lab, device, [job], store, no_store, "profile")
    shot.raise_first_error()
    records = shot.records
    summary = profile_summary(records, top)
    if as_json:
        print_json(records_json(records, run_id=shot.run_id, summary=summary))
    else:
        render_table(
            f"top ops of {ref.name} on {device} (run {shot.run_id})",
            ["node", "op_type", "ms / inference", "share of latency"],
            [
                [o["node"], o["op_type"], o["ms"], f"{o['share']:.1%}" if o["share"] is not None else None]
                for o in summary["top_ops"]
            ],
        )
        render_table(
            "by op type",
            ["op_type", "ms / inference"],
            [[t["op_type"], t["ms"]] for t in summary["op_types"][:top]],
        )
        note(
            f"edgebench: latency p50 {summary['latency_ms']:.4g} ms; per-op times add up to "
            f"{summary['op_time_total_ms']:.4g} ms ({summary['coverage']:.0%}); profiler overhead "
            f"{summary['profiler_overhead_us']:.3g} us per op subtracted"
        )
    return 0


def profile_summary(records: list[Record], top: int) -> dict[str, Any]:
    """The slowest ops, time per op type and the totals, from a profile's records."""

    def first(metric: str, **match: Any) -> float | None:
        return next(
            (
                r.value
                for r in records
                if r.metric == metric and all(r.params.get(k) == v for k, v in match.items())
            ),
            None,
        )

    latency = first("latency_ms", stat="p50")
    ops = sorted((r for r in records if r.metric == "op_time_ms"), key=lambda r: r.value or 0.0, reverse=True)
    return {
        "latency_ms": latency,
        "op_time_total_ms": first("op_time_total_ms"),
        "coverage": first("op_time_coverage"),
        "profiler_overhead_us": first("profiler_overhead_us"),
        "top_ops": [
            {
                "node": r.params["node"],
                "op_type": r.params["op_type"],
                "ms": r.value,
                "share": (r.value or 0.0) / latency if latency else None,
            }
            for r in ops[:top]
        ],
        "op_types": [
            {"op_type": r.params["op_type"], "ms": r.value} for r in records if r.metric == "op_type_time_ms"
        ],
    }


@probe_flags("sensitivity")
def sensitivity(
    model: str = typer.Argument(..., help="fp32 ONNX model file or builtin:NAME."),
    device: str = DEVICE_OPT,
    top: int = typer.Option(20, "--top", min=1, help="Layers shown in the table."),
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: SensitivityParams = SensitivityParams(),
) -> int:
    """Per-layer quantization sensitivity: each weight layer fake-quantized alone, cosine vs fp32."""
    from ..models.refs import resolve_model

    ref = resolve_model(model)
    check_inputs(params.inputs)
    job = Job(
        device=device, probe="sensitivity", model=ref, runtime=None, params=params.given(), timeout_s=timeout
    )
    note(f"edgebench: sensitivity of {ref.name} at {params.bits} bits on {device}")
    shot = _run_jobs(lab, device, [job], store, no_store, "sensitivity")
    shot.raise_first_error()
    records = shot.records
    if as_json:
        print_json(records_json(records, run_id=shot.run_id))
    else:
        cos = [r for r in records if r.metric == "cosine"]
        snr = {r.annotations["rank"]: r.value for r in records if r.metric == "snr_db"}
        render_table(
            f"most sensitive layers of {ref.name} at int{params.bits} ({len(cos)} layers, run {shot.run_id})",
            ["rank", "node", "op_type", "weight", "cosine", "snr_db"],
            [
                [
                    r.annotations["rank"],
                    r.params["node"],
                    r.params["op_type"],
                    r.params["weight"],
                    r.value,
                    snr.get(r.annotations["rank"]),
                ]
                for r in cos[:top]
            ],
        )
    return 0
