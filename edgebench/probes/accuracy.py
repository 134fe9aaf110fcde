"""Probe `accuracy`: a variant's outputs against its fp32 reference, both run on the device.

Both models see the same input arrays: the user's `inputs` .npz, or the seeded random inputs the reference
run made and saved on the device. Outputs come back as .npz files pulled through the transport. When the
device cannot run the reference (its runtime is missing there, or it rejects the model), the reference
runs on the host instead and every record says so (`reference_device = "host"`).

Records per output: `max_abs_err`, `mean_abs_err`, `cosine`, `snr_db` (params: output, variant, reference).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..agent.numerics import compare_arrays
from ..descriptors import builtin_local
from ..errors import EdgebenchError, MeasurementError, ModelError, UserError, one_line
from ..jobs import Job, ModelRef
from ..lab.device import Device
from ..models.refs import resolve_model
from ..records import ProbeResult, RecordContext
from ..runtimes import runtime as runtime_named
from .common import check_backend, job_timeout, model_file_for, placement_notes, require_model
from .numerics import (
    CPU_FP32,
    DeviceOutputs,
    OnBackend,
    device_outputs,
    pull,
    remove_remote,
    runtime_for,
    scratch_dir,
)
from .registry import AccuracyParams

METRICS = (("max_abs_err", ""), ("mean_abs_err", ""), ("cosine", "ratio"), ("snr_db", "dB"))


def reference_of(params: AccuracyParams, variant: ModelRef) -> ModelRef:
    """The reference model: the one given; else, for a backend's numerics, the model itself (run on the
    CPU in fp32)."""
    if params.reference:
        return resolve_model(params.reference)
    if on_backend(params):
        return variant
    raise UserError("probe 'accuracy' needs a reference model (param `reference`, or --reference)")


def on_backend(params: AccuracyParams) -> bool:
    """Whether the job compares a backend (or a precision) with the CPU's fp32."""
    return params.backend != "cpu" or params.precision is not None


def backend_runs(params: AccuracyParams, runtime: str) -> tuple[OnBackend | None, OnBackend | None]:
    """(the reference's backend, the variant's): the CPU in fp32 and the backend asked for, when the job
    compares a backend; (None, None) otherwise (both at the runtime's defaults)."""
    if not on_backend(params):
        return None, None
    check_backend(runtime, params.backend)
    return CPU_FP32, OnBackend(params.backend, params.precision)


def run_accuracy(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = AccuracyParams.of(job)
    variant = require_model(job)
    reference = reference_of(params, variant)
    runtime = runtime_for(variant, job.runtime)
    ref_runtime = (
        runtime
        if reference is variant and not params.reference_runtime
        else runtime_for(reference, params.reference_runtime)
    )
    ref_on, var_on = backend_runs(params, runtime)
    ctx.runtime = runtime
    timeout = job_timeout(device, job)
    result = ProbeResult()
    user_inputs = params.inputs
    originals: tuple[ModelRef, ModelRef] | None = None
    # two graphs of one runtime's own format with the same tensor names (an ncnn graph and its fp16-weights
    # variant, or one graph on two backends): every tensor returned by the runtime itself, matched by
    # name, nothing instrumented
    own_graphs = params.per_op and (
        variant.format == reference.format == "ncnn"
        or (reference is variant and ref_runtime == runtime and not runtime_named(runtime).per_op_outputs)
    )
    if params.per_op and not own_graphs:
        from .divergence import instrument

        for rt in (runtime_named(runtime), runtime_named(ref_runtime)):
            if not rt.per_op_outputs:
                raise UserError(
                    f"--per-op: {rt.display} does not keep a converted model's intermediate tensors under "
                    f"their ONNX names; compare its outputs without --per-op, or two {rt.display} graphs"
                )

        originals = (variant, reference)
        variant, reference = instrument(variant), instrument(reference)
    with scratch_dir() as tmp:
        workdir = Path(tmp)
        remote_inputs = _push_inputs(device, user_inputs, timeout)
        ref, where, remote_inputs, scratch = _reference_outputs(
            device, reference, ref_runtime, job, remote_inputs, workdir, result, own_graphs, ref_on
        )
        try:
            out = device_outputs(
                device, variant, runtime, job, remote_inputs, False, workdir, own_graphs, var_on
            )
            remedy = None
            if var_on is not None and var_on.precision != "fp32" and _diverges(ref, out, params.tolerance):
                fp32 = OnBackend(var_on.name, "fp32")
                remedy = device_outputs(
                    device, variant, runtime, job, remote_inputs, False, workdir, own_graphs, fp32
                )
        finally:
            remove_remote(device, scratch, timeout)
    result.warnings += out.warnings
    if var_on is not None:
        ctx.base_annotations = {**ctx.base_annotations, **placement_notes(out.placement, result.warnings)}
    ctx.base_params = {
        **{k: v for k, v in params.identity().items() if k not in ("reference", "reference_runtime")},
        "variant": variant.name,
        "reference": reference.name,
        "reference_device": where,
    }
    if not user_inputs:
        ctx.base_params.update(inputs="random", seed=params.seed)
    graphs = (
        (
            model_file_for(variant, runtime, params.shapes),
            model_file_for(reference, ref_runtime, params.shapes),
        )
        if own_graphs
        else None
    )
    _judge(ctx, params, graphs, originals, ref, out, result)
    if remedy is not None:
        _judge_remedy(ctx, params, graphs, originals, ref, remedy, result)
    return result


def _judge(
    ctx: RecordContext,
    params: AccuracyParams,
    graphs: tuple[Path, Path] | None,
    originals: tuple[ModelRef, ModelRef] | None,
    ref: DeviceOutputs,
    out: DeviceOutputs,
    result: ProbeResult,
) -> None:
    """The candidate's outputs against the reference's: every blob of two graphs of the runtime's own
    format, every instrumented tensor (per-op), or the outputs alone."""
    if graphs is not None:
        _per_op_graphs(ctx, graphs[0], graphs[1], ref, out, params.tolerance, result)
    elif originals is not None:
        _per_op(ctx, originals, ref, out, params.tolerance, result)
    else:
        _compare(ctx, ref, out, result)


def _judge_remedy(
    ctx: RecordContext,
    params: AccuracyParams,
    graphs: tuple[Path, Path] | None,
    originals: tuple[ModelRef, ModelRef] | None,
    ref: DeviceOutputs,
    remedy: DeviceOutputs,
    result: ProbeResult,
) -> None:
    """The backend's remedy the runtime allows for its numerics (its arithmetic in fp32), judged as the
    run was: its records carry `remedy = "precision=fp32"`, and a line says whether it restores them."""
    fixed = replace(
        ctx,
        base_params={**ctx.base_params, "remedy": "precision=fp32"},
        base_annotations={**ctx.base_annotations, **placement_notes(remedy.placement, [])},
    )
    before = len(result.records)
    _judge(fixed, params, graphs, originals, ref, remedy, result)
    restored = not _diverges(ref, remedy, params.tolerance)
    result.warnings.append(
        f"the {params.backend} backend's outputs diverge from the CPU's fp32 beyond {params.tolerance:g}; "
        + (
            "running it in fp32 (precision=fp32) restores them"
            if restored
            else "running it in fp32 (precision=fp32) does not restore them: the difference is not its "
            "fp16 arithmetic (compare per op, or run the divergent ops on the CPU)"
        )
    )
    for record in result.records[before:]:
        record.annotations["remedy_restores"] = restored


def _diverges(ref: DeviceOutputs, out: DeviceOutputs, tolerance: float) -> bool:
    """Whether any output common to both (by name, else by position) differs by more than `tolerance`
    in relative L2 error."""
    from .divergence import compare

    names = [n for n in ref.order if n in out.arrays] or list(zip(ref.order, out.order, strict=False))
    pairs = [(n, n) if isinstance(n, str) else n for n in names]
    return any(
        compare(ref.arrays[a], out.arrays[b])["rel_error"] > tolerance
        for a, b in pairs
        if a in ref.arrays and b in out.arrays and ref.arrays[a].size == out.arrays[b].size
    )


def _per_op(
    ctx: RecordContext,
    originals: tuple[ModelRef, ModelRef],
    ref: DeviceOutputs,
    out: DeviceOutputs,
    tolerance: float,
    result: ProbeResult,
) -> None:
    """The final outputs compared as usual, then every matched intermediate tensor."""
    from .divergence import divergence_records, fold_successors, load_onnx, match_tensors

    variant, reference = (load_onnx(m.path) for m in originals)
    finals = [o.name for o in reference.graph.output]
    cand_finals = [o.name for o in variant.graph.output]
    _compare(ctx, _only(ref, finals), _only(out, cand_finals), result)
    matches = match_tensors(reference, variant)
    folds = fold_successors(reference)
    result.extend(divergence_records(ctx, matches, ref.arrays, out.arrays, tolerance, folds))


def _per_op_graphs(
    ctx: RecordContext,
    variant: Path,
    reference: Path,
    ref: DeviceOutputs,
    out: DeviceOutputs,
    tolerance: float,
    result: ProbeResult,
) -> None:
    """Two ncnn graphs: the final outputs compared as usual, then every blob the reference's layers make,
    in its layer order, against the variant's blob of the same name (made by a layer of the same type)."""
    from ..models.convert_ncnn import param_graph, param_outputs
    from .divergence import Match, Tensor, divergence_records

    ref_layers, cand_layers = param_graph(reference), param_graph(variant)
    _compare(ctx, _only(ref, param_outputs(ref_layers)), _only(out, param_outputs(cand_layers)), result)
    made_by = {top: layer for layer in cand_layers for top in layer.tops}
    matches = [
        Match(Tensor(top, layer.name, layer.type, order), top, made_by[top].name, "name")
        for order, layer in enumerate(ref_layers)
        if layer.type != "Input"
        for top in layer.tops
        if top in made_by and made_by[top].type == layer.type
    ]
    result.extend(divergence_records(ctx, matches, ref.arrays, out.arrays, tolerance))


def _only(outputs: DeviceOutputs, names: list[str]) -> DeviceOutputs:
    """The model's own outputs among everything the instrumented copy returned."""
    arrays = {n: outputs.arrays[n] for n in names if n in outputs.arrays}
    return DeviceOutputs(arrays, [n for n in names if n in arrays], outputs.runtime_version)


def _push_inputs(device: Device, inputs: str | None, timeout: float) -> str | None:
    if not inputs:
        return None
    path = Path(inputs)
    if not path.is_file():
        raise UserError(f"{inputs}: inputs file not found")
    return device.ensure_files([path], timeout)[0]


def _reference_outputs(
    device: Device,
    reference: ModelRef,
    runtime: str,
    job: Job,
    remote_inputs: str | None,
    workdir: Path,
    result: ProbeResult,
    every_tensor: bool = False,
    on: OnBackend | None = None,
) -> tuple[DeviceOutputs, str, str | None, list[str]]:
    """Run the reference on the device (on backend `on`), or on the host when the device cannot.

    Returns its outputs, where it ran, the device path of the inputs the variant must use, and device
    scratch files to remove afterwards.
    """
    save = remote_inputs is None
    try:
        ref = device_outputs(device, reference, runtime, job, remote_inputs, save, workdir, every_tensor, on)
    except (MeasurementError, ModelError) as exc:
        cannot = isinstance(exc, ModelError) or getattr(exc, "kind", "") == "runtime"
        if not cannot or _is_this_host(device):
            raise
        result.warnings.append(
            f"the reference {reference.name} cannot run on {device.name} ({one_line(exc)}); "
            "it ran on the host instead (reference_device=host)"
        )
        return _reference_on_host(device, reference, runtime, job, remote_inputs, workdir, every_tensor)
    result.warnings += ref.warnings
    if save:
        return ref, "device", ref.inputs_remote, [ref.inputs_remote or ""]
    return ref, "device", remote_inputs, []


def _is_this_host(device: Device) -> bool:
    """The device is this very host and interpreter: running the reference "on the host" changes nothing."""
    host = builtin_local()
    return device.spec.transport == "local" and device.spec.python == host.python and not device.spec.env


def _reference_on_host(
    device: Device,
    reference: ModelRef,
    runtime: str,
    job: Job,
    remote_inputs: str | None,
    workdir: Path,
    every_tensor: bool = False,
) -> tuple[DeviceOutputs, str, str | None, list[str]]:
    timeout = job_timeout(device, job)
    with Device(builtin_local()) as host:
        host_inputs = None
        if remote_inputs is not None:
            host_inputs = host.ensure_files([Path(str(AccuracyParams.of(job).inputs))], timeout)[0]
        try:
            ref = device_outputs(
                host, reference, runtime, job, host_inputs, host_inputs is None, workdir, every_tensor
            )
        except EdgebenchError as exc:
            raise MeasurementError(
                f"the reference {reference.name} runs neither on {device.name} nor on the "
                f"host: {one_line(exc)}",
                device=device.name,
            ) from None
        if remote_inputs is None:
            # The variant on the device must see the very arrays the host fed the reference.
            local = pull(host, ref.inputs_remote or "", workdir / "inputs.npz", timeout)
            remote_inputs = device.ensure_files([local], timeout)[0]
    return ref, "host", remote_inputs, []


def pair_outputs(ref: DeviceOutputs, out: DeviceOutputs, warnings: list[str]) -> list[tuple[str, str]]:
    """Outputs are matched by name; when no name matches but the counts agree, by position."""
    common = [n for n in ref.order if n in out.arrays]
    if not common and len(ref.order) == len(out.order):
        warnings.append(
            "no output name matches the reference's; outputs were paired by position: "
            + ", ".join(f"{a}<->{b}" for a, b in zip(ref.order, out.order, strict=True))
        )
        return list(zip(ref.order, out.order, strict=True))
    missing = [n for n in ref.order if n not in out.arrays]
    if missing:
        warnings.append(f"the variant has no output {', '.join(missing)} (it has {', '.join(out.order)})")
    return [(n, n) for n in common]


def _without_batch(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[1:] if len(shape) > 1 and shape[0] == 1 else shape


def _compare(ctx: RecordContext, ref: DeviceOutputs, out: DeviceOutputs, result: ProbeResult) -> None:
    pairs = pair_outputs(ref, out, result.warnings)
    if not pairs:
        raise MeasurementError(f"no output of the variant matches the reference's ({', '.join(ref.order)})")
    for ref_name, out_name in pairs:
        a, b = ref.arrays[ref_name], out.arrays[out_name]
        if a.size != b.size:
            result.warnings.append(
                f"output {ref_name}: shape {list(b.shape)} cannot be compared with the "
                f"reference's {list(a.shape)}"
            )
            continue
        if _without_batch(a.shape) != _without_batch(b.shape):  # ncnn holds no batch axis of 1
            result.warnings.append(
                f"output {ref_name}: shape {list(b.shape)} differs from the reference's "
                f"{list(a.shape)} (same size: compared element by element)"
            )
        scores = compare_arrays(a, b)
        extra: dict[str, Any] = {"output": ref_name}
        if scores["nonfinite"]:
            extra["nonfinite"] = scores["nonfinite"]
            result.warnings.append(
                f"output {ref_name}: {scores['nonfinite']} non-finite values (left out of the comparison)"
            )
        if a.dtype.kind not in "fc":
            extra["dtype"] = str(a.dtype)
        for metric, unit in METRICS:
            result.records.append(ctx.record(metric, _finite_or_none(scores[metric]), unit, **extra))


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
