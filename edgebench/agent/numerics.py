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

import gzip
import os
import shutil
import time
from typing import Any

from .bench import import_then_pin
from .inputs import InputError, describe, make_inputs
from .main import TaskError
from .runtimes import open_session
from .selfcheck import check_outputs, pristine_copy
from .session import ModelLoadError, RuntimeMissing
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
    try:
        return open_session(
            task.get("runtime", "onnxruntime"), path or task["model"], int(task.get("threads", 0)), **options
        )
    except ModelLoadError as exc:
        raise TaskError("model", str(exc)) from None
    except RuntimeMissing as exc:
        raise TaskError("runtime", str(exc)) from None


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
    }, warnings


# ---- task `profile` -----------------------------------------------------------------------------------
def run_profile(task: dict) -> tuple[dict, list[str]]:
    """Plain and instrumented runs, alternated so that both meet the same load on a busy device."""
    warnings: list[str] = []
    affinity, _ = import_then_pin(task)
    runtime = task.get("runtime", "onnxruntime")
    warmup, runs = int(task.get("warmup", 3)), max(1, int(task.get("runs", 20)))
    min_seconds = float(task.get("min_seconds", 0.0))
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
        if runtime == "mnn":
            latencies, result["mnn"] = _mnn_callback_profile(session, plain, warmup, runs, min_seconds)
        else:
            latencies, result["ort"] = _ort_profile(task, plain, feeds, warmup, runs, min_seconds)
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


# what `min_seconds` may stretch a profile to: a profiler's trace grows by every kernel of every
# instrumented run, and a second of PP-OCR cls's 235 kernels is ~100k events (~25 MB of JSON) already
MAX_ROUNDS = 1000


def _alternate(
    plain: Any, instrumented: Any, warmup: int, runs: int, min_seconds: float = 0.0
) -> list[float]:
    """Warm both up, then alternate one instrumented and one plain (timed) run; returns the plain times.

    At least `runs` rounds, and more until the measured rounds have lasted `min_seconds` (up to
    MAX_ROUNDS): a shared device's speed moves from one fraction of a second to the next (20 runs of a
    0.02 ms kernel, 0.4 ms in all, read anywhere in a 2x band over ten seconds here, while the median over
    those ten seconds came back within 5% in a new process), so a p50 stands for the device only when its
    runs are spread over a window that long.

    Each run is preceded by its step's refresh (outside the timer): the inputs are the inputs every time.
    """
    refresh_plain, refresh_instrumented = refresher(plain), refresher(instrumented)
    for _ in range(warmup):
        refresh_plain()
        plain()
        refresh_instrumented()
        instrumented()
    clock = time.perf_counter_ns
    samples: list[float] = []
    start = clock()
    while len(samples) < runs or (
        clock() - start < min_seconds * 1e9 and len(samples) < max(runs, MAX_ROUNDS)
    ):
        refresh_instrumented()
        instrumented()
        refresh_plain()
        t0 = clock()
        plain()
        samples.append((clock() - t0) / 1e6)
    return samples


def _ort_profile(
    task: dict,
    plain: Any,
    feeds: dict[str, Any],
    warmup: int,
    runs: int,
    min_seconds: float = 0.0,
) -> tuple[list[float], dict[str, Any]]:
    """Plain runs and profiled runs (a second session); returns plain latencies and the gzipped traces."""
    folder = task["profile_dir"]
    os.makedirs(folder, exist_ok=True)
    token = task.get("token", str(os.getpid()))
    profiled = _open(task, profile_prefix=os.path.join(folder, f"ort-{token}"))
    latencies = _alternate(plain, profiled.prepare(feeds), warmup, runs, min_seconds)
    trace = _gzip(profiled.end_profiling(), folder)
    out: dict[str, Any] = {"trace": trace, "warmup": warmup, "runs": len(latencies)}
    calibration = task.get("calibration_model")
    if calibration:
        out["calibration"] = _ort_calibration(task, calibration, folder, token, warmup, runs)
    return latencies, out


def _ort_calibration(
    task: dict, path: str, folder: str, token: str, warmup: int, runs: int
) -> dict[str, Any]:
    """A chain of trivial ops, plain and profiled: per op, the difference is the profiler's own cost."""
    import numpy as np

    plain = _open(task, path)
    feeds = {
        i.name: np.ones([d if isinstance(d, int) and d > 0 else 1 for d in i.shape], dtype=i.dtype)
        for i in plain.inputs
    }
    profiled = _open(task, path, profile_prefix=os.path.join(folder, f"cal-{token}"))
    plain_ms = _alternate(plain.prepare(feeds), profiled.prepare(feeds), warmup, runs)
    return {"trace": _gzip(profiled.end_profiling(), folder), "plain_ms": plain_ms}


def _gzip(path: str, folder: str) -> str:
    path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    target = os.path.join(folder, os.path.basename(path) + ".gz")
    with open(path, "rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
    return target


def _mnn_callback_profile(
    session: Any,
    plain: Any,
    warmup: int,
    runs: int,
    min_seconds: float = 0.0,
) -> tuple[list[float], dict[str, Any]]:
    """Per-op wall times from MNN's begin/end callbacks, per run, with plain runs alternated.

    The time between one op's end callback and the next op's begin callback is pure instrumentation
    (no op runs there); its median is reported as the per-op overhead for the host to subtract.
    """
    import numpy as np

    interp, sess = session.interpreter, session.session
    clock = time.perf_counter_ns
    stamps: list[int] = []
    keys: list[tuple[str, str]] = []

    def begin(_tensors: Any, _info: Any) -> bool:
        stamps.append(clock())
        return True

    def end(_tensors: Any, info: Any) -> bool:
        stamps.append(clock())
        keys.append((info.getName(), info.getType()))
        return True

    counts: list[int] = []

    def instrumented() -> None:
        plain.refresh()  # the same session, so the same input tensors to put back
        before = len(keys)
        interp.runSessionWithCallBackInfo(sess, begin, end)
        counts.append(len(keys) - before)

    shapes = _mnn_op_tensors(interp, sess, plain)
    latencies = _alternate(plain, instrumented, warmup, runs, min_seconds)
    if not keys:
        raise TaskError("model", "MNN ran no ops with callbacks (empty model?)")
    t = np.asarray(stamps, dtype=np.int64).reshape(-1, 2)
    skip = sum(counts[:warmup])
    t, keys, counts = t[skip:], keys[skip:], counts[warmup:]
    durations = ((t[:, 1] - t[:, 0]) / 1e6).tolist()
    index: dict[tuple[str, str], int] = {}
    per_run: list[list[float]] = []
    calls: list[int] = []
    gaps: list[float] = []
    offset = 0
    for count in counts:
        row: dict[int, float] = {}
        for j in range(offset, offset + count):
            k = index.setdefault(keys[j], len(index))
            row[k] = row.get(k, 0.0) + durations[j]
            if len(calls) < len(index):
                calls.append(0)
            calls[k] += 1
        if count > 1:
            run = t[offset : offset + count]
            gaps.extend(((run[1:, 0] - run[:-1, 1]) / 1e6).tolist())
        per_run.append([row.get(k, 0.0) for k in range(len(index))])
        offset += count
    width = len(index)
    ops = [
        {"node": n, "op_type": ty, "calls": calls[k] / len(counts), **shapes.get((n, ty), {})}
        for (n, ty), k in index.items()
    ]
    return latencies, {
        "ops": ops,
        "per_run_ms": [r + [0.0] * (width - len(r)) for r in per_run],
        "overhead_ms": float(np.median(gaps)) if gaps else 0.0,
        "runs": len(counts),
    }


def _mnn_op_tensors(interp: Any, sess: Any, plain: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Each op's input and output tensors (element type, dims) from one untimed run: reading shapes in
    the timed runs' callbacks would put that work inside the ops' times."""
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def describe_all(tensors: Any) -> list[list[Any]]:
        out = []
        for t in tensors or []:
            try:
                out.append([_mnn_dtype(t), [int(d) for d in t.getShape()]])
            except Exception:  # noqa: BLE001 - a tensor MNN cannot describe keeps the op's others
                continue
        return out

    def begin(tensors: Any, info: Any) -> bool:
        op = found.setdefault((info.getName(), info.getType()), {})
        op["inputs"] = describe_all(tensors)
        op["mflops"] = float(info.getFlops())  # MNN's own count, in millions
        return True

    def end(tensors: Any, info: Any) -> bool:
        found.setdefault((info.getName(), info.getType()), {})["outputs"] = describe_all(tensors)
        return True

    plain.refresh()
    interp.runSessionWithCallBackInfo(sess, begin, end)
    return found


def _mnn_dtype(tensor: Any) -> str:
    """MNN's halide type as the element-type names onnxruntime's profile uses (float, int32 ...)."""
    import MNN

    code = tensor.getDataType()
    for name, dtype in (("Float", "float"), ("Int", "int32"), ("Int64", "int64"), ("Uint8", "uint8")):
        if code == getattr(MNN, f"Halide_Type_{name}", None):
            return dtype
    return "float"


# ---- task `sensitivity` -----------------------------------------------------------------------------
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
