"""Pieces every model probe shares: the model file a runtime needs, pushed inputs, job timeouts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ModelError, UserError
from ..jobs import Job, ModelRef
from ..lab.device import Device
from ..runtimes import format_text, owner_of, runtimes_for
from ..runtimes import runtime as runtime_named
from .registry import RUNTIMES, BenchParams, values


def job_timeout(device: Device, job: Job) -> float:
    return job.timeout_s or device.spec.timeout_s


def runtime_of(model: ModelRef | None, requested: str | None) -> str:
    """The asked-for runtime, else the one whose own format the model's is (`.tflite` runs on LiteRT;
    ONNX, and no model, on onnxruntime)."""
    if requested:
        return requested
    owner = owner_of(model.format) if model is not None else None
    return owner.name if owner is not None else "onnxruntime"


def probe_runtimes(probe: str) -> tuple[str, ...] | None:
    """The runtimes a probe kind can run on, where not every runtime (decode: those that decode; llama.cpp
    runs decode alone)."""
    if probe == "decode":
        return tuple(name for name in RUNTIMES if runtime_named(name).decodes)
    found = tuple(name for name in RUNTIMES if runtime_named(name).runs_probe(probe))
    return None if found == tuple(RUNTIMES) else found


def check_runtime(
    model: ModelRef | None, runtime: str | None, among: Sequence[str] | None = None, probe: str | None = None
) -> str:
    """The runtime a job will use, or a usage error when it cannot run the model (unknown runtime, a
    model in a format it neither runs nor converts; `among`: the runtimes the probe can use, the only ones
    suggested). Pure: the CLI calls it before any run is stored, so a typo never becomes a failed run in
    the store."""
    chosen = runtime_of(model, "litert" if runtime == "tflite" else runtime)  # LiteRT's former name
    if chosen not in RUNTIMES:
        raise UserError(f"unknown runtime '{chosen}' (use {', '.join(RUNTIMES)})")
    if probe is not None:
        refuse_probe(probe, chosen, model)
    if model is None:
        return chosen
    rt = runtime_named(chosen)
    if model.format not in rt.formats:
        owner = owner_of(model.format)
        noun = owner.model_noun if owner is not None else f"a .{model.format} model"
        runs = " and ".join(format_text(f) for f in rt.formats)
        others = [r for r in runtimes_for(model.format) if among is None or r in among]
        use = (", ".join(others[:-1]) + " or " + others[-1]) if len(others) > 1 else "".join(others)
        hint = f"use --runtime {use}" if use else "no runtime here runs it"
        raise ModelError(
            f"{model.path}: {rt.display} cannot run {noun} ({rt.display} runs {runs} models; {hint})"
        )
    return chosen


def refuse_probe(probe: str, runtime: str | None, model: ModelRef | None) -> None:
    """A usage error when the runtime does not run the probe (llama.cpp runs decode alone), naming what it
    runs."""
    if runtime not in RUNTIMES:
        return
    rt = runtime_named(runtime)
    if not rt.runs_probe(probe):
        what = f"{model.path.name}: " if model is not None else ""
        runs = " and ".join(rt.probes or ())
        raise UserError(f"{what}{rt.display} runs probe {runs} only, not {probe} (edgebench probe {runs})")


def model_file_for(model: ModelRef, runtime: str, shapes: Mapping[str, Sequence[int]] | None = None) -> Path:
    """The file the runtime loads: its own format as is; another it runs, converted on the host once
    (`Runtime.converter`, cached), at the job's input shapes where the converter bakes them in."""
    check_runtime(model, runtime)
    rt = runtime_named(runtime)
    convert = rt.converter(model.format)
    if convert is None:
        return model.path
    return convert(model.path, shapes=shapes or None) if rt.converts_at_shapes else convert(model.path)


def require_model(job: Job) -> ModelRef:
    if job.model is None:
        raise UserError(f"probe '{job.probe}' needs a model (--model)")
    return job.model


def push_model_and_inputs(
    device: Device, job: Job, runtime: str, inputs: str | None
) -> tuple[str, str | None]:
    """Push the runtime's model file and the optional inputs .npz; return their remote paths."""
    model = require_model(job)
    local = model_file_for(model, runtime, job.params.get("shapes"))
    files = ModelRef(model.name, local).files  # an ncnn graph and its weights
    if inputs:
        path = Path(inputs)
        if not path.is_file():
            raise UserError(f"{inputs}: inputs file not found")
    timeout = job_timeout(device, job)
    if len(files) > 1:
        model_remote = device.ensure_model(files[0], timeout)
        return model_remote, device.ensure_files([Path(inputs)], timeout)[0] if inputs else None
    remote = device.ensure_files([*files, *([Path(inputs)] if inputs else [])], timeout)  # one round trip
    return remote[0], remote[1] if inputs else None


def shape_lists(shapes: Mapping[str, Sequence[int]] | None) -> dict[str, list[int]]:
    """Typed params' shapes as the agent takes them: {input: [dims]}."""
    return {k: list(v) for k, v in (shapes or {}).items()}


def bench_identity(params: BenchParams) -> dict[str, Any]:
    """The identity params of a bench's records: the typed identity, plus the one-value inputs."""
    given = values(params.value)
    return {**params.identity(), **({"value": given} if given else {})}


def model_fields(params: Any, runtime: str, model: str, inputs: str | None) -> dict[str, Any]:
    """What every model task (`agent.protocol.ModelTask`) takes from a probe's typed params."""
    return {
        "model": model,
        "runtime": runtime,
        "threads": params.threads,
        "shapes": shape_lists(params.shapes),
        "seed": params.seed,
        "inputs": inputs,
        "affinity": list(params.affinity) if params.affinity else None,
        "values": values(params.value),
    }


def timing_fields(params: Any) -> dict[str, Any]:
    """The timing policy a bench-like task takes from its params."""
    names = ("warmup", "warmup_seconds", "runs", "min_seconds", "max_seconds")
    return {name: getattr(params, name) for name in names}


def check_backend(runtime: str, backend: str) -> None:
    """A backend the runtime's agent session opens; a UserError naming the field and those it has."""
    known = runtime_named(runtime).backends
    if backend not in known:
        raise UserError(
            f"backend: {runtime_named(runtime).display} has no backend '{backend}' "
            f"(it has: {', '.join(known)})"
        )


def placement_notes(placement: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """What every record of a backend's run carries of where it ran (agent.placement), with a warning
    where it did not run wholly on the backend asked for."""
    if not placement:
        return {"backend_actual": "unknown"}
    if placement.get("actual") != placement.get("requested"):
        fallen = placement.get("fallback_ops") or []
        warnings.append(
            f"asked for {placement.get('requested')}, ran on {placement.get('actual')}"
            + (f" ({len(fallen)} ops elsewhere: {', '.join(fallen[:5])})" if fallen else "")
            + f": {placement.get('evidence', '')}"
        )
    return {"backend_actual": placement.get("actual"), "placement": placement}
