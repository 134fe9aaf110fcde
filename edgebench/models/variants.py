"""Model variants: the fp32 model as engineers ship it, converted and quantized.

| variant | file | how |
| --- | --- | --- |
| `fp16` | NAME.fp16.onnx | onnxconverter-common float16, inputs/outputs kept fp32 |
| `int8-dynamic` | NAME.int8-dynamic.onnx | onnxruntime.quantization.quantize_dynamic, int8 weights |
| `int8-static` | NAME.int8-static.onnx | quantize_static: per-channel int8 weights, uint8 activations |
| `mnn-fp32` | NAME.fp32.mnn | MNN's converter (`_tools.mnnconvert`, child process) |
| `mnn-int8-weight` | NAME.int8-weight.mnn | the converter, `--weightQuantBits 8` (int8 weights, fp32 math) |
| `mnn-int8` | NAME.int8.mnn | MNN's offline quantizer (`_tools.mnnquant`, child process), calibrated |
| `ncnn-fp32` | NAME.fp32.ncnn.param (+ .bin) | pnnx's converter binary, `fp16=0` (fp32 weights) |
| `ncnn-fp16` | NAME.fp16.ncnn.param (+ .bin) | pnnx, `fp16=1`: fp16 weights (computed in fp32 unless told) |

Calibration (int8-static, mnn-int8) comes from an .npz with one array per model input (a leading axis of
samples, or a batch split into samples); without one, seeded random inputs are used and every record of
those variants says `calibration = "random"`. Random calibration needs a shape for every dynamic input
(`--shape`): a calibrated variant of a dynamic model without one is refused, since calibrating a
1x3x640x640 detector at 1x3x1x1 makes a model whose ranges say nothing of real inputs. MNN's quantizer
needs static input shapes: from the model, `--shape`, or the calibration arrays.

What the converters and quantizers print (onnxconverter-common's float16 warnings, onnxruntime's
quantizer log, MNN's tools, anything on the process's stderr) goes to `OUT/NAME.variants.log`; the
command says in one line how many lines went there.

Before quantizing, Constant nodes become initializers and onnxruntime's pre-processing runs (shape
inference, BatchNorm folding), since quantizers only see initializer weights. Quantized ONNX files get short
internal tensor names (node names and the model's inputs and outputs are kept): on a small model the
quantizer's generated names would otherwise outweigh what int8 weights save.

NAME is the model's identity (its file stem, or `convnet` for `builtin:convnet`), so a variant benched from
its file is `convnet.int8-static` in the store, next to `convnet`.

A variant that cannot be made for a model (an op the converter lacks, a graph the quantizer refuses)
becomes an entry with an error; the others are still made.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..errors import EdgebenchError, ModelError, UserError, one_line
from ..jobs import Job, JobOutcome, ModelRef
from ..records import Record, RecordContext, utc_now
from ..runtimes import owner_of
from .quantize import (
    DeclaredInput,
    all_graphs,
    compact_names,
    constants_to_initializers,
    declared_inputs,
    has_subgraphs,
    opset_version,
)

VARIANT_KINDS = (
    "fp16",
    "int8-dynamic",
    "int8-static",
    "mnn-fp32",
    "mnn-int8-weight",
    "mnn-int8",
    "ncnn-fp32",
    "ncnn-fp16",
)
SUFFIXES = {
    "fp16": ".fp16.onnx",
    "int8-dynamic": ".int8-dynamic.onnx",
    "int8-static": ".int8-static.onnx",
    "mnn-fp32": ".fp32.mnn",
    "mnn-int8-weight": ".int8-weight.mnn",
    "mnn-int8": ".int8.mnn",
    "ncnn-fp32": ".fp32.ncnn.param",
    "ncnn-fp16": ".fp16.ncnn.param",
}
DEFAULT_SAMPLES = 8  # random calibration samples
MAX_FILE_SAMPLES = 256  # calibration samples taken from a --calib file at most
RANDOM_CALIBRATION_WARNING = (
    "{variant}: calibrated on RANDOM inputs (no --calib given): activation ranges will not match real data "
    "and its accuracy says little; pass --calib data.npz with real inputs"
)


@dataclass(frozen=True)
class Variant:
    """One variant: its file and size, or why it could not be made."""

    name: str
    path: Path | None
    format: str  # onnx | mnn | ncnn
    runtime: str  # the runtime that runs it
    size_bytes: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class VariantSet:
    """The source model and every variant asked for."""

    source: ModelRef
    source_size: int
    variants: list[Variant]
    warnings: list[str] = field(default_factory=list)
    log: Path | None = None  # what the converters printed
    log_lines: int = 0

    def manifest(self) -> dict[str, Any]:
        return {
            "source": {
                "name": self.source.name,
                "path": str(self.source.path),
                "size_bytes": self.source_size,
            },
            "log": str(self.log) if self.log else None,
            "variants": [
                {
                    "name": v.name,
                    "path": str(v.path) if v.path else None,
                    "format": v.format,
                    "runtime": v.runtime,
                    "size_bytes": v.size_bytes,
                    "size_ratio": v.size_bytes / self.source_size if v.size_bytes else None,
                    "params": v.params,
                    "error": v.error,
                    "warnings": list(v.warnings),
                }
                for v in self.variants
            ],
        }


@dataclass(frozen=True)
class CalibrationFeeds:
    """Calibration feeds and where they came from ("random" or the .npz file name)."""

    feeds: list[dict[str, np.ndarray]]
    source: str
    warnings: list[str]

    @property
    def random(self) -> bool:
        return self.source == "random"


# ---- calibration ----------------------------------------------------------------------------------------
def load_calibration(
    path: Path, inputs: Sequence[DeclaredInput], limit: int | None = None
) -> CalibrationFeeds:
    """Feeds from an .npz: one array per input, with a leading axis of samples (or a batch to split)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: np.array(data[k]) for k in data.files}
    except FileNotFoundError:
        raise UserError(f"{path}: calibration file not found") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable .npz file ({one_line(exc)})") from None
    per_input: dict[str, list[np.ndarray]] = {}
    for decl in inputs:
        if decl.name not in arrays:
            raise UserError(
                f"{path}: no array '{decl.name}' for model input '{decl.name}' "
                f"(it has: {', '.join(sorted(arrays)) or 'nothing'})"
            )
        per_input[decl.name] = _samples(path, decl, arrays[decl.name])
    counts = {len(v) for v in per_input.values()}
    n = max(counts)
    if counts - {1, n}:
        raise UserError(
            f"{path}: inputs hold different numbers of samples "
            f"({', '.join(f'{k}: {len(v)}' for k, v in per_input.items())})"
        )
    n = min(n, limit) if limit else n
    feeds = [{k: (v[i] if len(v) > 1 else v[0]) for k, v in per_input.items()} for i in range(n)]
    return CalibrationFeeds(feeds, path.name, [])


def _samples(path: Path, decl: DeclaredInput, array: np.ndarray) -> list[np.ndarray]:
    rank = len(decl.shape)
    array = array.astype(decl.dtype, copy=False)
    if array.ndim == rank + 1:
        return [np.ascontiguousarray(a) for a in array]
    if array.ndim != rank:
        raise UserError(
            f"{path}: array '{decl.name}' has shape {list(array.shape)}; the model input has rank "
            f"{rank} {list(decl.shape)} (give it that rank, or one more axis of samples)"
        )
    first = decl.shape[0] if rank else None
    if rank and array.shape[0] > 1 and not (isinstance(first, int) and first == array.shape[0]):
        # A batch where the model takes one item (or any batch): each item is one calibration sample.
        return [np.ascontiguousarray(array[i : i + 1]) for i in range(array.shape[0])]
    return [np.ascontiguousarray(array)]


def random_calibration(
    inputs: Sequence[DeclaredInput], shapes: dict[str, list[int]], samples: int, seed: int
) -> CalibrationFeeds:
    from ..agent.inputs import random_array

    rng = np.random.default_rng(seed)
    warnings: list[str] = []
    resolved = {}
    for decl in inputs:
        shape = concrete_shape(decl, shapes)
        if shape is None:  # calibrating at 1 for every unknown dim makes ranges of nothing real
            example = "x".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in decl.shape)
            raise UserError(
                f"calibration needs the shape of input '{decl.name}' (dynamic dims {list(decl.shape)}): "
                f"pass --shape {decl.name}={example} with the real sizes, or --calib data.npz"
            )
        resolved[decl.name] = (shape, decl.dtype)
    feeds = [
        {name: random_array(np, rng, shape, dtype) for name, (shape, dtype) in resolved.items()}
        for _ in range(samples)
    ]
    return CalibrationFeeds(feeds, "random", warnings)


def concrete_shape(decl: DeclaredInput, shapes: dict[str, list[int]]) -> list[int] | None:
    """The input's shape from --shape, else from the model when fully static; None when dynamic."""
    if decl.name in shapes:
        shape = [int(d) for d in shapes[decl.name]]
        if len(shape) != len(decl.shape):
            raise UserError(
                f"--shape {decl.name}: rank {len(shape)} but the model declares {len(decl.shape)} "
                f"dimensions {list(decl.shape)}"
            )
        return shape
    if decl.dynamic:
        return None
    return [int(d) for d in decl.shape]  # type: ignore[arg-type]


# ---- making variants -------------------------------------------------------------------------------------
@dataclass
class _Context:
    source: ModelRef
    out_dir: Path
    scratch: Path
    inputs: list[DeclaredInput]
    shapes: dict[str, list[int]]
    calib_path: Path | None
    samples: int
    seed: int
    timeout: float
    _calibration: CalibrationFeeds | None = None
    _prepared: Path | None = None
    _mnn_fp32: Path | None = None

    def target(self, kind: str) -> Path:
        return self.out_dir / f"{self.source.name}{SUFFIXES[kind]}"

    @property
    def log(self) -> Path:
        return log_path(self.out_dir, self.source)

    def calibration(self) -> CalibrationFeeds:
        if self._calibration is None:
            if self.calib_path is not None:
                self._calibration = load_calibration(self.calib_path, self.inputs, MAX_FILE_SAMPLES)
            else:
                self._calibration = random_calibration(self.inputs, self.shapes, self.samples, self.seed)
        return self._calibration

    def prepared(self) -> Path:
        """The fp32 model as quantizers want it: Constants as initializers, pre-processed by onnxruntime."""
        if self._prepared is None:
            self._prepared = _prepare_for_quantization(self.source.path, self.scratch)
        return self._prepared


def make_variants(
    model: ModelRef,
    out_dir: Path,
    *,
    calib: Path | None = None,
    shapes: dict[str, list[int]] | None = None,
    kinds: Sequence[str] = VARIANT_KINDS,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    timeout: float = 900.0,
    on_variant: Callable[[Variant], None] | None = None,
) -> VariantSet:
    """Make each variant of an ONNX model into out_dir; failures become entries with an error."""
    unknown = [k for k in kinds if k not in VARIANT_KINDS]
    if unknown:
        raise UserError(f"unknown variant '{unknown[0]}' (known: {', '.join(VARIANT_KINDS)})")
    if model.format != "onnx":
        raise ModelError(f"{model.path}: variants are made from an ONNX model (fp32), not {model.format}")
    if calib is not None and not calib.is_file():
        raise UserError(f"{calib}: calibration file not found")
    try:
        proto = onnx.load(str(model.path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"{model.path}: not a valid ONNX model ({type(exc).__name__})") from None
    inputs = declared_inputs(proto)
    del proto
    shapes = dict(shapes or {})
    unknown_shapes = set(shapes) - {i.name for i in inputs}
    if unknown_shapes:
        raise UserError(
            f"--shape names unknown input '{sorted(unknown_shapes)[0]}' "
            f"(inputs: {', '.join(i.name for i in inputs)})"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out_dir}: cannot create the output folder ({exc.strerror})") from None
    variants: list[Variant] = []
    log = log_path(out_dir, model)
    log.write_text("", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="edgebench-variants-") as scratch:
        ctx = _Context(model, out_dir, Path(scratch), inputs, shapes, calib, samples, seed, timeout)
        if calib is not None and any(k in kinds for k in ("int8-static", "mnn-int8")):
            ctx.calibration()  # a bad calibration file is the user's error: fail before making anything
        for kind in kinds:
            variant = _make_one(ctx, kind)
            variants.append(variant)
            if on_variant:
                on_variant(variant)
    text = log.read_text(encoding="utf-8", errors="replace")
    lines = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("==== "))
    return VariantSet(model, model.path.stat().st_size, variants, log=log, log_lines=lines)


def log_path(out_dir: Path, model: ModelRef) -> Path:
    return out_dir / f"{model.name}.variants.log"


@contextmanager
def converter_log(path: Path, kind: str) -> Iterator[None]:
    """Send what a converter prints to the log file: Python warnings, log records, and the process's
    stderr (fd 2, where native code such as onnxruntime's C++ logger writes), under a header per variant."""
    import logging
    import warnings as pywarnings

    with path.open("a", encoding="utf-8") as log:
        log.write(f"==== {kind}\n")
        log.flush()
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            with pywarnings.catch_warnings(record=True) as caught:
                pywarnings.simplefilter("always")
                yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            root.removeHandler(handler)
            for w in caught:
                log.write(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}\n")


def _make_one(ctx: _Context, kind: str) -> Variant:
    fmt = kind.split("-")[0] if kind.startswith(("mnn-", "ncnn-")) else "onnx"
    owner = owner_of(fmt)
    runtime = owner.name if owner is not None else "onnxruntime"
    target = ctx.target(kind)
    start = time.monotonic()
    params: dict[str, Any] = {}
    warnings: list[str] = []
    try:
        with converter_log(ctx.log, kind):
            MAKERS[kind](ctx, target, params, warnings)
    except Exception as exc:  # noqa: BLE001 - a variant that cannot be made is an entry, not a crash
        for path in ModelRef(kind, target).files:
            _unlink(path)
        message = (
            one_line(exc) if isinstance(exc, EdgebenchError) else f"{type(exc).__name__}: {one_line(exc)}"
        )
        return Variant(
            kind,
            None,
            fmt,
            runtime,
            params=params,
            error=message,
            warnings=tuple(warnings),
            seconds=time.monotonic() - start,
        )
    return Variant(
        kind,
        target,
        fmt,
        runtime,
        sum(path.stat().st_size for path in ModelRef(kind, target).files),  # an ncnn graph and its weights
        params,
        None,
        tuple(warnings),
        time.monotonic() - start,
    )


def _make_fp16(ctx: _Context, target: Path, params: dict[str, Any], warnings: list[str]) -> None:
    from onnxconverter_common import float16

    model = onnx.load(str(ctx.source.path))
    model16 = float16.convert_float_to_float16(model, keep_io_types=True)
    params["keep_io_types"] = True
    _save_checked(model16, target, compact=False)


def _make_int8_dynamic(ctx: _Context, target: Path, params: dict[str, Any], warnings: list[str]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = ctx.scratch / "dynamic.onnx"
    quantize_dynamic(
        str(ctx.prepared()),
        str(tmp),
        weight_type=QuantType.QInt8,
        per_channel=False,
        extra_options={"EnableSubgraph": True},
    )
    params.update(weight_type="int8", activations="dynamic uint8")
    _save_quantized(onnx.load(str(tmp)), target, params, warnings)


def _make_int8_static(ctx: _Context, target: Path, params: dict[str, Any], warnings: list[str]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    calibration = ctx.calibration()
    _note_calibration(calibration, "int8-static", params, warnings)
    prepared = ctx.prepared()
    # Per-channel scales in QDQ form need DequantizeLinear's `axis` (opset 13); older models use the
    # operator form (QLinearConv, QLinearMatMul), which has carried per-channel weights since opset 10.
    fmt = (
        QuantFormat.QDQ
        if opset_version(onnx.load(str(prepared), load_external_data=False)) >= 13
        else QuantFormat.QOperator
    )
    feeds = iter(calibration.feeds)

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(feeds, None)

    tmp = ctx.scratch / "static.onnx"
    try:
        quantize_static(
            str(prepared),
            str(tmp),
            Reader(),
            quant_format=fmt,
            per_channel=True,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
        )
    except Exception as exc:  # noqa: BLE001 - the quantizer and the calibration runs raise many types
        hint = " on random calibration inputs (pass --calib with real ones)" if calibration.random else ""
        raise ModelError(f"onnxruntime's static quantizer failed{hint}: {one_line(exc)}") from None
    params.update(
        format="qdq" if fmt == QuantFormat.QDQ else "qoperator",
        weight_type="int8 per-channel",
        activation_type="uint8",
    )
    _save_quantized(onnx.load(str(tmp)), target, params, warnings)


def _make_mnn_fp32(ctx: _Context, target: Path, params: dict[str, Any], warnings: list[str]) -> None:
    from .convert import onnx_to_mnn

    onnx_to_mnn(ctx.source.path, target)
    ctx._mnn_fp32 = target


def _make_mnn_int8_weight(ctx: _Context, target: Path, params: dict[str, Any], warnings: list[str]) -> None:
    from .convert import onnx_to_mnn

    onnx_to_mnn(ctx.source.path, target, extra=["--weightQuantBits", "8"])
    params.update(weight_bits=8, weight_quant="symmetric per-channel", compute="fp32")


def _make_mnn_int8(ctx: _Context, target: Path, params: dict[str, Any], warnings: list[str]) -> None:
    from .convert import onnx_to_mnn, run_mnn_tool

    calibration = ctx.calibration()
    shapes = _static_shapes(ctx, calibration)
    _note_calibration(calibration, "mnn-int8", params, warnings)
    source = (
        ctx._mnn_fp32
        if ctx._mnn_fp32 is not None and ctx._mnn_fp32.exists()
        else onnx_to_mnn(ctx.source.path, ctx.scratch / "fp32.mnn")
    )
    folder = ctx.scratch / "mnn-calibration"
    config = write_mnn_calibration(folder, ctx.inputs, shapes, calibration.feeds)
    tmp = ctx.scratch / "int8.mnn"
    output = run_mnn_tool([str(source), str(tmp), str(config)], quant=True, timeout=ctx.timeout)
    with ctx.log.open("a", encoding="utf-8") as log:
        log.write(output if output.endswith("\n") or not output else output + "\n")
    if not tmp.is_file() or tmp.stat().st_size == 0:
        lines = [ln for ln in output.splitlines() if ln.strip()]
        raise ModelError(f"mnnquant made no model: {lines[-1] if lines else 'no output'}")
    shutil.move(str(tmp), target)
    params.update(shapes={k: list(v) for k, v in shapes.items()}, feature_quant="KL", weight_quant="MAX_ABS")


def _make_ncnn(fp16: bool) -> Callable[[_Context, Path, dict[str, Any], list[str]], None]:
    def make(ctx: _Context, target: Path, params: dict[str, Any], warnings: list[str]) -> None:
        from .convert_ncnn import onnx_to_ncnn

        onnx_to_ncnn(ctx.source.path, fp16_weights=fp16, shapes=ctx.shapes or None, out=target)
        params["weights"] = "fp16" if fp16 else "fp32"

    return make


MAKERS: dict[str, Callable[[_Context, Path, dict[str, Any], list[str]], None]] = {
    "fp16": _make_fp16,
    "int8-dynamic": _make_int8_dynamic,
    "int8-static": _make_int8_static,
    "mnn-fp32": _make_mnn_fp32,
    "mnn-int8-weight": _make_mnn_int8_weight,
    "mnn-int8": _make_mnn_int8,
    "ncnn-fp32": _make_ncnn(fp16=False),
    "ncnn-fp16": _make_ncnn(fp16=True),
}


def _static_shapes(ctx: _Context, calibration: CalibrationFeeds) -> dict[str, list[int]]:
    """Every input's concrete shape, or a clear error naming the dynamic input and the fix."""
    shapes = {}
    for decl in ctx.inputs:
        shape = concrete_shape(decl, ctx.shapes)
        if shape is None and not calibration.random:
            shape = list(calibration.feeds[0][decl.name].shape)
        if shape is None:
            example = "x".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in decl.shape)
            raise UserError(
                f"MNN full int8 needs static input shapes, and input '{decl.name}' has dynamic dims "
                f"{list(decl.shape)}: pass --shape {decl.name}={example} (or --calib data.npz)"
            )
        shapes[decl.name] = shape
    return shapes


def write_mnn_calibration(
    folder: Path,
    inputs: Sequence[DeclaredInput],
    shapes: dict[str, list[int]],
    feeds: list[dict[str, np.ndarray]],
) -> Path:
    """MNN's "sequence" calibration layout: one folder per sample with input.json and NAME.txt per input."""
    folder.mkdir(parents=True, exist_ok=True)
    described = [{"name": d.name, "shape": shapes[d.name]} for d in inputs]
    for i, feed in enumerate(feeds):
        sample = folder / f"{i:05d}"
        sample.mkdir()
        (sample / "input.json").write_text(json.dumps({"inputs": described}))
        for d in inputs:
            values = np.asarray(feed[d.name])
            if values.size != int(np.prod(shapes[d.name])):
                raise UserError(
                    f"calibration sample {i} of input '{d.name}' has shape {list(values.shape)}, "
                    f"not {shapes[d.name]}"
                )
            np.savetxt(sample / f"{d.name}.txt", values.astype(np.float64).reshape(-1), fmt="%.9g")
    config = folder.parent / "mnn-calibration.json"
    config.write_text(
        json.dumps(
            {
                "input_type": "sequence",
                "path": str(folder),
                "used_sample_num": len(feeds),
                "feature_quantize_method": "KL",
                "weight_quantize_method": "MAX_ABS",
                "quant_bits": 8,
                "inputs": described,
            }
        )
    )
    return config


def _note_calibration(
    calibration: CalibrationFeeds, variant: str, params: dict[str, Any], warnings: list[str]
) -> None:
    params.update(calibration=calibration.source, samples=len(calibration.feeds))
    if calibration.random:
        warnings.append(RANDOM_CALIBRATION_WARNING.format(variant=variant))
    warnings.extend(calibration.warnings)


def _prepare_for_quantization(source: Path, scratch: Path) -> Path:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load(str(source))
    constants_to_initializers(model)
    plain = scratch / "prepared-constants.onnx"
    onnx.save(model, plain)
    out = scratch / "prepared.onnx"
    # Symbolic shape inference fails on some exporters' graphs; the optimizer pass alone still folds
    # BatchNorm and constants. If both fail the quantizer gets the model as it is.
    for skip_symbolic in (False, True):
        try:
            quant_pre_process(str(plain), str(out), skip_symbolic_shape=skip_symbolic)
            if out.is_file():
                return out
        except Exception:  # noqa: BLE001 - the next, more lenient pass is tried
            continue
    return plain


def _save_quantized(
    model: onnx.ModelProto, target: Path, params: dict[str, Any], warnings: list[str]
) -> None:
    """Save an int8 model, refusing one where nothing was quantized and saying when much stayed float."""
    int8, left = weight_bytes(model)
    if int8 == 0:
        where = " (its weights sit inside If/Loop subgraphs)" if has_subgraphs(model) else ""
        raise ModelError(f"the quantizer found no weight it could quantize{where}")
    share = int8 * 4 / (int8 * 4 + left)
    params["int8_weight_share"] = round(share, 4)
    if share < 0.8:
        warnings.append(
            f"{target.name}: only {share:.0%} of the weights are int8; the rest stayed float "
            "(ops or subgraphs this quantizer does not handle)"
        )
    _save_checked(model, target, compact=True)


def weight_bytes(model: onnx.ModelProto) -> tuple[int, int]:
    """Bytes of 8-bit weights, and of float weights left, in all graphs (weights: tensors of 2+ dims;
    biases, scales and zero points are vectors)."""
    int8 = left = 0
    eight_bit = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    for _, graph in all_graphs(model.graph):
        tensors = list(graph.initializer) + [
            a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.type == a.TENSOR
        ]
        for t in tensors:
            if len(t.dims) < 2:
                continue
            size = int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            if t.data_type in eight_bit:
                int8 += size
            elif t.data_type in floats:
                left += size
    return int8, left


def _save_checked(model: onnx.ModelProto, target: Path, *, compact: bool) -> None:
    """Save (compacted when asked) and prove onnxruntime can load the result."""
    if compact:
        compact_names(model)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    onnx.save(model, tmp)
    try:
        _check_loads(tmp)
    except Exception:
        _unlink(tmp)
        raise
    os.replace(tmp, target)


def _check_loads(path: Path) -> None:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
        lines = str(exc).strip().splitlines()
        raise ModelError(
            f"onnxruntime cannot load the result: {lines[0] if lines else type(exc).__name__}"
        ) from None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


# ---- records ----------------------------------------------------------------------------------------------
def variant_outcomes(run_id: str, vset: VariantSet) -> list[JobOutcome]:
    """One job per variant (and one for the fp32 source), so failures are stored like any failed job."""
    now = utc_now()
    source = vset.source
    ctx = RecordContext(
        run_id,
        "local",
        "variants",
        source.name,
        "onnxruntime",
        {"variant": "fp32", "path": str(source.path), "source": source.name},
    )
    fp32_job = Job(
        device="local", probe="variants", model=source, runtime="onnxruntime", params={"variant": "fp32"}
    )
    outcomes = [
        JobOutcome(
            fp32_job,
            "ok",
            [ctx.record("size_bytes", vset.source_size, "B"), ctx.record("size_ratio", 1.0, "ratio")],
            started=now,
            finished=now,
        )
    ]
    for v in vset.variants:
        name = f"{source.name}{SUFFIXES[v.name]}"[: -len(".onnx" if v.format == "onnx" else ".mnn")]
        ref = ModelRef(name, v.path or source.path)
        job = Job(device="local", probe="variants", model=ref, runtime=v.runtime, params={"variant": v.name})
        if not v.ok:
            outcomes.append(
                JobOutcome(
                    job,
                    "error",
                    warnings=list(v.warnings),
                    error=v.error,
                    error_kind="model",
                    started=now,
                    finished=now,
                    wall_s=v.seconds,
                )
            )
            continue
        vctx = RecordContext(
            run_id,
            "local",
            "variants",
            name,
            v.runtime,
            {"variant": v.name, "path": str(v.path), "source": source.name, **v.params},
        )
        records: list[Record] = [
            vctx.record("size_bytes", v.size_bytes, "B"),
            vctx.record("size_ratio", (v.size_bytes or 0) / vset.source_size, "ratio"),
        ]
        outcomes.append(
            JobOutcome(
                job, "ok", records, warnings=list(v.warnings), started=now, finished=now, wall_s=v.seconds
            )
        )
    return outcomes
