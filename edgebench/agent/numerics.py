"""Tasks `outputs`, `profile` and `sensitivity`: what a model computes on the device, and where its time goes.

- `outputs` runs the model once on given (or seeded random) inputs and saves every output to an .npz on
  the device; the host pulls the file (arrays never travel through JSON). It can also save the inputs it
  used, so a second model (a variant) can be fed exactly the same arrays.
- `profile` measures plain latency, then per-op times: onnxruntime's own profiler (the JSON file is
  gzipped on the device and pulled by the host, which parses it) or MNN's per-op callbacks (aggregated
  here). Both instruments add a little time to every op; it is measured and reported so the host can
  subtract it (onnxruntime: a calibration model of trivial ops; MNN: the gap between two callbacks).
- `sensitivity` runs a model whose weights are overridable inputs, once with the fp32 weights and once per
  layer with that layer's fake-quantized weights fed in, and returns cosine / SNR against fp32.

Standard library plus numpy and the runtime only; both imported lazily.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .bench import import_then_pin
from .inputs import InputError, describe, make_inputs
from .main import TaskError
from .runtimes import session_module
from .selfcheck import check_outputs, pristine_copy
from .timing import refresher

SNR_CAP_DB = 200.0  # identical arrays have infinite SNR; reported as this finite ceiling


# ---- comparison (also imported by the host) ------------------------------------------------------
def compare_arrays(reference: Any, candidate: Any) -> dict[str, float]:
    """max/mean absolute error, cosine similarity and SNR (dB) of `candidate` against `reference`.

    Computed in float64 over the flattened arrays. Cosine of two all-zero arrays is 1; SNR of identical
    arrays is capped at SNR_CAP_DB. Non-finite values in the candidate are counted and excluded.
    """
    import numpy as np

    ref = np.asarray(reference, dtype=np.float64).ravel()
    out = np.asarray(candidate, dtype=np.float64).ravel()
    if ref.size != out.size:
        raise ValueError(f"size {out.size} differs from the reference's {ref.size}")
    finite = np.isfinite(ref) & np.isfinite(out)
    nonfinite = int(ref.size - finite.sum())
    ref, out = ref[finite], out[finite]
    if ref.size == 0:
        return {
            "max_abs_err": float("nan"),
            "mean_abs_err": float("nan"),
            "cosine": float("nan"),
            "snr_db": float("nan"),
            "nonfinite": nonfinite,
            "size": 0,
        }
    diff = out - ref
    ref_norm, out_norm = float(np.linalg.norm(ref)), float(np.linalg.norm(out))
    if ref_norm == 0.0 and out_norm == 0.0:
        cosine = 1.0
    elif ref_norm == 0.0 or out_norm == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(ref, out) / (ref_norm * out_norm))
    signal, noise = float(np.sum(ref * ref)), float(np.sum(diff * diff))
    if noise == 0.0:
        snr = SNR_CAP_DB
    elif signal == 0.0:
        snr = -SNR_CAP_DB
    else:
        snr = max(-SNR_CAP_DB, min(SNR_CAP_DB, 10.0 * float(np.log10(signal / noise))))
    return {
        "max_abs_err": float(np.max(np.abs(diff))),
        "mean_abs_err": float(np.mean(np.abs(diff))),
        "cosine": cosine,
        "snr_db": snr,
        "nonfinite": nonfinite,
        "size": int(ref.size),
    }


# ---- shared pieces ----------------------------------------------------------------------------------
def _open(task: dict, path: str | None = None, **options: Any) -> Any:
    from .loading import open_task_session

    return open_task_session(task, path, **options)


def _inputs(task: dict, session: Any, warnings: list[str]) -> dict[str, Any]:
    try:
        return make_inputs(
            session.inputs, task.get("shapes", {}), int(task.get("seed", 0)), task.get("inputs"), warnings
        )
    except InputError as exc:
        raise TaskError("input", str(exc)) from None


def _save_npz(path: str, arrays: dict[str, Any]) -> None:
    """An uncompressed .npz written entry by entry: any tensor name is a valid key (np.savez's keyword
    arguments would clash with names like `file` or `allow_pickle`)."""
    import io
    import zipfile

    import numpy as np

    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(value), allow_pickle=False)
            zf.writestr(name + ".npy", buf.getvalue())
    os.replace(tmp, path)


def _run_outputs(session: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    try:
        outputs = session.outputs(feeds)
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"inference failed: {_first_line(exc)}") from None
    # Copies: MNN hands out views that the next run overwrites.
    return {name: np.array(value, copy=True) for name, value in outputs.items()}


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# ---- task `outputs` -----------------------------------------------------------------------------------
def run_outputs(task: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    session = _open(task)
    feeds = _inputs(task, session, warnings)
    if task.get("inputs_out"):
        _save_npz(task["inputs_out"], feeds)
    if task.get("per_op"):  # every tensor by the runtime's own means (an ncnn graph's blobs)
        every = getattr(session, "every_tensor", None)
        if every is None:
            raise TaskError("usage", f"{session.runtime} cannot return every tensor of a model")
        try:
            outputs = every(feeds)
        except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
            raise TaskError("model", f"inference failed: {_first_line(exc)}") from None
    else:
        outputs = _run_outputs(session, feeds)
    _save_npz(task["out"], outputs)
    return {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "out": task["out"],
        "inputs_out": task.get("inputs_out"),
        "inputs": describe(feeds),
        "outputs": describe(outputs),
        "output_order": list(session.output_names),
        "placement": session.placement().as_dict(),
    }, warnings


# ---- task `profile` -----------------------------------------------------------------------------------
def run_profile(task: dict) -> tuple[dict, list[str]]:
    """Plain and instrumented runs, alternated so that both meet the same load on a busy device."""
    warnings: list[str] = []
    affinity, _ = import_then_pin(task)
    runtime = task.get("runtime", "onnxruntime")
    warmup, runs = int(task.get("warmup", 3)), max(1, int(task.get("runs", 20)))
    min_seconds = float(task.get("min_seconds", 0.0))
    module = session_module(runtime)
    if not hasattr(module, "profile"):
        raise TaskError("usage", f"{runtime} has no per-op profile here")
    session = _open(task)
    feeds = _inputs(task, session, warnings)
    pristine = pristine_copy(feeds)
    result: dict[str, Any] = {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "threads": int(task.get("threads", 0)),
        "affinity": affinity,
        "warmup": warmup,
        "runs": runs,
        "inputs": describe(feeds),
    }
    plain = session.prepare(feeds)
    beside = _speed_references(task, warnings)
    try:
        if beside is not None:
            beside.block()
        latencies, result[module.PROFILE_KEY] = module.profile(
            task, session, plain, feeds, warmup, runs, min_seconds
        )
        if beside is not None:
            beside.block()
    except TaskError:
        raise
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"inference failed while profiling: {_first_line(exc)}") from None
    result["latencies_ms"] = latencies
    result["runs"] = len(latencies)
    if beside is not None:
        result["speed_references_ms"] = beside.times
    result["self_check"] = check_outputs(session.runtime, session, plain, feeds, pristine)
    return result, warnings


REFERENCE_ROUNDS = 10  # timed rounds of the speed references right before and right after a profile


class SpeedReferences:
    """Fixed models timed in a block right before and one right after a profiled model's rounds: how fast
    the device ran while the model was measured, so profiles taken at different moments can be put on one
    scale. Never between the model's runs: after the 16 MiB GEMV a 0.046 ms model read 0.081 ms even with
    one untimed run between (0.059 ms with three), so a reference inside the rounds slows what it should
    only observe."""

    def __init__(self, steps: dict[str, Any]) -> None:
        self.steps = steps
        self.times: dict[str, list[float]] = {path: [] for path in steps}

    def __call__(self) -> None:
        clock = time.perf_counter_ns
        for path, step in self.steps.items():
            refresh = refresher(step)
            # once untimed first: the model just run evicted the reference's weights from the caches, by
            # as much as the model is large, and a cold reference would time that model's size, not the
            # device's speed
            refresh()
            step()
            refresh()
            t0 = clock()
            step()
            self.times[path].append((clock() - t0) / 1e6)

    def block(self, rounds: int = REFERENCE_ROUNDS) -> None:
        for _ in range(rounds):
            self()


def _speed_references(task: dict, warnings: list[str]) -> SpeedReferences | None:
    """The task's speed references opened in its runtime at its threads (None when it names none)."""
    paths = task.get("speed_references") or []
    if not paths:
        return None
    steps = {}
    for path in paths:
        session = _open(task, path)
        feeds = make_inputs(session.inputs, {}, int(task.get("seed", 0)), None, warnings)
        steps[path] = session.prepare(feeds)
    return SpeedReferences(steps)


def run_sensitivity(task: dict) -> tuple[dict, list[str]]:
    import numpy as np

    warnings: list[str] = []
    session = _open(task)
    feeds = _inputs(task, session, warnings)
    baseline = _run_outputs(session, feeds)
    names = [n for n, a in baseline.items() if a.dtype.kind == "f"]
    if not names:
        raise TaskError("model", "the model has no floating-point output to compare")
    layers = []
    with np.load(task["weights"], allow_pickle=False) as weights:
        for key, input_name in task["layers"]:
            outputs = _run_outputs(session, {**feeds, input_name: weights[key]})
            scores = [compare_arrays(baseline[n], outputs[n]) for n in names]
            layers.append(
                {
                    "key": key,
                    "cosine": [s["cosine"] for s in scores],
                    "snr_db": [s["snr_db"] for s in scores],
                    "max_abs_err": [s["max_abs_err"] for s in scores],
                }
            )
    return {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "outputs": names,
        "layers": layers,
        "inputs": describe(feeds),
    }, warnings


def run(task: dict) -> tuple[dict, list[str]]:
    """Dispatch on the task kind: outputs, profile or sensitivity."""
    kind = task.get("kind")
    if kind == "outputs":
        return run_outputs(task)
    if kind == "profile":
        return run_profile(task)
    if kind == "sensitivity":
        return run_sensitivity(task)
    raise TaskError("usage", f"numerics has no task {kind!r}")
