"""The ncnn session: a `Net` with every precision and layout option pinned and recorded, an extractor per
run fed from arrays the step keeps alive (an `ncnn.Mat` wraps its array's memory without owning it).

ncnn's own defaults differ by CPU (fp16 storage where F16C or AVX512-FP16 exist, bf16 and int8 paths), so
the session never relies on them: it sets each option it means and reports them with every result
(`execution()`). Its model is a `.param` graph with its `.bin` weights beside it (same name).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, NamedTuple

from .placement import OpUnit, Placement, from_ops, whole
from .session import (
    ANY_RANK,
    BackendError,
    InputInfo,
    ModelLoadError,
    RuntimeMissing,
    Step,
    _dist_version,
    effective_threads,
)
from .stderr import with_stderr

NCNN_MAGIC = "7767517"
# The Input layer's shape params: 0=w, 1=h, 11=d, 2=c; as numpy axes, outermost first.
_INPUT_AXES = ("2", "11", "1", "0")


def weights_of(param: str) -> str:
    """`net.param` -> `net.bin` (the pair's naming, kept by the host's push)."""
    return os.path.splitext(param)[0] + ".bin"


def model_files(param: str) -> list[str]:
    """The graph and its weights: what the model is on disk (evicted together for a cold load)."""
    return [param, weights_of(param)]


class ParamLayer(NamedTuple):
    """One layer line of a .param text file."""

    type: str
    name: str
    bottoms: list[str]
    tops: list[str]
    params: dict[str, str]


def read_layers(param: str) -> list[ParamLayer]:
    """Every layer of a .param text file, read once (the agent imports nothing of the host's reader);
    lines that are not a layer are left out (ncnn refuses them when it loads the file)."""
    with open(param, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()[2:]
    layers = []
    for line in lines:
        fields = line.split()
        try:
            bottoms, tops = int(fields[2]), int(fields[3])
        except (IndexError, ValueError):
            continue
        blobs = fields[4 : 4 + bottoms + tops]
        params = dict(kv.split("=", 1) for kv in fields[4 + bottoms + tops :] if "=" in kv)
        layers.append(ParamLayer(fields[0], fields[1], blobs[:bottoms], blobs[bottoms:], params))
    return layers


def param_inputs(layers: list[ParamLayer]) -> dict[str, list[Any]]:
    """Each Input layer's top blob and its shape (numpy order: c, d, h, w, as declared; ANY_RANK where
    the file gives none)."""
    found: dict[str, list[Any]] = {}
    for layer in layers:
        if layer.type != "Input" or not layer.tops:
            continue
        dims = [int(layer.params[a]) for a in _INPUT_AXES if int(layer.params.get(a, "0") or 0) > 0]
        found[layer.tops[0]] = dims or list(ANY_RANK)
    return found


def input_demands(layers: list[ParamLayer]) -> dict[str, tuple[tuple[str, int, str], ...]]:
    """What the layers reading each blob straight take of it, from the sizes of their weights: a
    convolution's input channels (weight_data_size / (num_output x kernel, x group when depthwise)), an
    inner product's inputs (weight_data_size / num_output). Layers whose params do not divide evenly
    (int8 or sparse forms) are left out."""
    found: dict[str, list[tuple[str, int, str]]] = {}
    for layer in layers:
        if layer.type not in ("Convolution", "ConvolutionDepthWise", "InnerProduct") or not layer.bottoms:
            continue
        params = layer.params
        try:
            out = int(params.get("0", "0"))
            weights = int(params.get("6" if layer.type != "InnerProduct" else "2", "0"))
            kw = int(params.get("1", "1"))
            kh = int(params.get("11", str(kw)))
            group = int(params.get("7", "1")) if layer.type == "ConvolutionDepthWise" else 1
        except ValueError:
            continue
        if layer.type == "InnerProduct":
            axis, per = "features", out
        else:
            axis, per = "channels", out * kw * kh
        if min(out, weights, kw, kh, group) <= 0 or (weights * group) % per:
            continue
        demand = (axis, weights * group // per, f"'{layer.name}' ({layer.type})")
        found.setdefault(layer.bottoms[0], []).append(demand)
    return {blob: tuple(d) for blob, d in found.items()}


def unknown_layer(layers: list[ParamLayer]) -> tuple[str, str] | None:
    """The first (type, name) in the graph that this ncnn has no layer for, or None."""
    import ncnn

    return next(((x.type, x.name) for x in layers if ncnn.layer_to_index(x.type) < 0), None)


def load_param(net: Any, param: str, label: str | None = None) -> str | None:
    """Load the graph into `net`: None when it loads, else why not, in one line naming the layer (and the
    file, as `label` or its path).

    ncnn says which layer refused its params only in its log on the process's stderr ("layer load_param 6
    LSTM_0 failed"), so that stream is caught while it loads."""
    code, log = with_stderr(lambda: net.load_param(param))
    if code == 0:
        return None
    said = log.split()
    label = label or param
    layers = read_layers(param)
    missing = unknown_layer(layers)
    if missing is not None:
        return f"ncnn has no layer type '{missing[0]}' (layer '{missing[1]}' in {label})"
    kinds = {layer.name: layer.type for layer in layers}
    if len(said) >= 5 and said[:2] == ["layer", "load_param"] and said[4] == "failed":
        name = said[3]
        return (
            f"ncnn could not load layer '{name}' ({kinds.get(name, '?')}) of {label}: its params are not "
            "what this ncnn's layer takes (a converter wrote the op in a form it does not run)"
        )
    reason = " ".join(said)[:160]
    return f"ncnn could not load the param file {label}" + (f" ({reason})" if reason else "")


BACKENDS = ("cpu", "vulkan")  # the wheel's backends: its CPU layers, and Vulkan compute (GPU)


@functools.lru_cache(maxsize=1)
def vulkan_devices() -> tuple[int, str]:
    """(Vulkan devices ncnn found, what it said of them): the count creates ncnn's GPU instance, the
    first time in a process, which prints each device's capabilities (its "fp16-p/s/u/a=1/1/1/1" line:
    fp16 packed, storage, uniform, arithmetic) on stderr and nowhere else; read once per process."""
    import ncnn

    count, said = with_stderr(ncnn.get_gpu_count)
    return int(count), said


def device_fp16(said: str) -> dict[str, bool] | None:
    """What the first Vulkan device supports of fp16 (packed, storage, arithmetic), from ncnn's own
    description of it; None where it was not printed (the GPU instance was made before)."""
    for line in said.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        flags = fields.get("fp16-p/s/u/a", "").split("/")
        if line.startswith("[0 ") and len(flags) == 4:
            packed, storage, _, arithmetic = (f == "1" for f in flags)
            return {"packed": packed, "storage": storage, "arithmetic": arithmetic}
    return None


class NcnnSession:
    """An ncnn Net on the CPU or on Vulkan, with explicit threads and precision options.

    On Vulkan, ncnn runs each layer it has no Vulkan kernel for on the CPU (with copies at each boundary),
    and a Net asked for Vulkan on a machine without a Vulkan driver runs wholly on the CPU without an
    error: `placement()` reads both from the loaded Net, never from what was asked."""

    runtime = "ncnn"

    def __init__(
        self,
        path: str,
        threads: int = 0,
        fp16: bool = False,
        winograd: bool = True,
        int8: bool = True,
        backend: str = "cpu",
        precision: str | None = None,
    ) -> None:
        try:
            import ncnn
        except ImportError as exc:
            raise RuntimeMissing("ncnn is not installed") from exc
        if backend not in BACKENDS:
            raise BackendError(f"ncnn has no backend '{backend}' (it has: {', '.join(BACKENDS)})")
        if precision not in (None, "fp32", "fp16"):
            raise BackendError(f"ncnn takes precision fp32 or fp16, not '{precision}'")
        self.ncnn = ncnn
        self.version = _dist_version("ncnn")
        self.backend = backend
        self._check_files(path)
        net = ncnn.Net()
        opt = net.opt
        opt.num_threads = (
            threads if threads > 0 else ncnn.get_physical_big_cpu_count() or ncnn.get_cpu_count()
        )
        gpus, said = vulkan_devices() if backend == "vulkan" else (0, "")
        opt.use_vulkan_compute = gpus > 0
        if gpus > 0:
            net.set_vulkan_device(0)
        # The CPU is pinned to fp32 (its fp16 paths differ by CPU); Vulkan keeps ncnn's default (fp16
        # storage and arithmetic where the device has them) unless a precision is asked for
        half = {"fp16": True, "fp32": False}.get(precision or "", fp16 if backend == "cpu" else None)
        if half is not None:
            for name in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic"):
                setattr(opt, name, half)
        opt.use_bf16_storage = False
        opt.use_bf16_packed = False
        opt.use_int8_inference = int8
        opt.use_winograd_convolution = winograd
        opt.use_packing_layout = True
        failure = load_param(net, path)
        if failure is not None:
            raise ModelLoadError(failure)
        if net.load_model(weights_of(path)) != 0:
            raise ModelLoadError(
                f"ncnn could not load the weights {weights_of(path)} for {path} "
                "(truncated, or not this graph's)"
            )
        self.net = net
        self.options = {
            "backend": "vulkan" if opt.use_vulkan_compute else "cpu",
            "threads": int(opt.num_threads),
            # ncnn's own core binding (0 all cores, 1 little, 2 big): left at 0, the agent's affinity pins
            "powersave": int(ncnn.get_cpu_powersave()),
            **{name: bool(getattr(opt, name)) for name in OPTION_NAMES},
        }
        self._placement = self._where(gpus, said)
        self.effective_threads = effective_threads(int(opt.num_threads), None, None)
        layers = read_layers(path)
        declared, demands = param_inputs(layers), input_demands(layers)
        names = list(net.input_names())
        if not names:
            raise ModelLoadError(f"{path}: the ncnn graph has no Input layer")
        self.inputs = [
            InputInfo(
                name,
                list(shape),
                "float32",
                batch_axis=False,
                fixed=shape != ANY_RANK,
                demands=demands.get(name, ()),
            )
            for name, shape in ((n, declared.get(n, ANY_RANK)) for n in names)
        ]
        self.output_names = list(net.output_names())

    def _precision(self, said: str) -> dict[str, Any]:
        """The precision the layers computed in: fp16 where the option is on and (on Vulkan) the device
        has it; "unknown" where the device's support was not seen."""
        opt = self.net.opt
        storage, arithmetic = bool(opt.use_fp16_storage), bool(opt.use_fp16_arithmetic)
        found: dict[str, Any] = {"use_fp16_storage": storage, "use_fp16_arithmetic": arithmetic}
        if opt.use_vulkan_compute:
            support = device_fp16(said)
            found["device_fp16"] = support if support is not None else "unknown"
            if support is None and (storage or arithmetic):
                found["mode"] = "unknown"
                return found
            storage = storage and bool(support and support["storage"])
            arithmetic = arithmetic and bool(support and support["arithmetic"])
        elif storage or arithmetic:
            found["mode"] = "unknown"  # ncnn's CPU layers take fp16 where the CPU and the layer have it
            return found
        found["mode"] = "fp16" if arithmetic else "fp16-storage" if storage else "fp32"
        return found

    def _where(self, gpus: int, said: str) -> Placement:
        """Which unit ran each layer, read from the loaded Net: Vulkan for a layer whose `support_vulkan`
        held after load_model (ncnn drops it where a layer's options have no Vulkan kernel), the CPU for
        the others; all on the CPU when the Net turned Vulkan off."""
        precision = self._precision(said)
        layers = [layer for layer in self.net.layers() if layer.type != "Input"]
        if self.backend == "cpu":
            return whole("cpu", "cpu", "the CPU backend (use_vulkan_compute off)", precision, len(layers))
        if not self.net.opt.use_vulkan_compute:
            reason = f"ncnn found {gpus} Vulkan devices" if gpus == 0 else "use_vulkan_compute off after load"
            return whole("vulkan", "cpu", f"{reason}: every layer ran on the CPU", precision, len(layers))
        units = [
            OpUnit(layer.name, layer.type, "vulkan" if layer.support_vulkan else "cpu") for layer in layers
        ]
        device = self.ncnn.get_gpu_info(0).device_name()
        return from_ops(
            "vulkan", units, f"each layer's support_vulkan after load_model on {device}", precision
        )

    def placement(self) -> Placement:
        return self._placement

    def _check_files(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                first = fh.readline().strip()
        except OSError as exc:
            raise ModelLoadError(f"cannot read ncnn param file {path}: {exc.strerror}") from None
        if first != NCNN_MAGIC:
            raise ModelLoadError(f"{path} is not an ncnn param file (first line is not {NCNN_MAGIC})")
        if not os.path.isfile(weights_of(path)):
            raise ModelLoadError(f"the ncnn weights {weights_of(path)} are missing beside {path}")

    def execution(self) -> dict[str, Any]:
        """The options every number on this session was measured with."""
        return {"ncnn": dict(self.options)}

    def _arrays(self, feeds: dict[str, Any]) -> list[tuple[str, Any]]:
        """The feeds as ncnn takes them: float32, C-contiguous, in the declared layout where the declared
        shape has the same size (an ONNX-layout array with its batch of 1 is the same data)."""
        import numpy as np

        declared = {i.name: i.shape for i in self.inputs}
        arrays = []
        for name, value in feeds.items():
            array = np.ascontiguousarray(value, dtype=np.float32)
            shape = declared.get(name)
            if shape and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == array.size:
                array = array.reshape(shape)
            elif array.ndim > 1 and array.shape[0] == 1:
                array = array.reshape(array.shape[1:])  # ncnn has no batch axis
            arrays.append((name, array))
        return arrays

    def every_tensor(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Every blob of one inference (`accuracy --per-op`), by its name in the graph: one extractor that
        keeps them all (lightmode off), each extracted in the caller's layout."""
        import numpy as np

        step = self.prepare(feeds)  # the arrays its Mats wrap stay alive with it
        self.net.opt.lightmode = False
        extractor = self.net.create_extractor()
        self.net.opt.lightmode = True
        for name, mat in step.mats:
            extractor.input(name, mat)
        found = {}
        for blob in self.net.blobs():
            code, mat = extractor.extract(blob.name)
            if code == 0:
                found[blob.name] = np.array(mat, copy=True)
        return found

    def prepare(self, feeds: dict[str, Any]) -> NcnnStep:
        return NcnnStep(self, self._arrays(feeds))

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
        step = self.prepare(feeds)
        step()
        return step.outputs()


# Every option that changes what ncnn computes or how fast, recorded with each number.
OPTION_NAMES = (
    "use_fp16_storage",
    "use_fp16_packed",
    "use_fp16_arithmetic",
    "use_bf16_storage",
    "use_bf16_packed",
    "use_int8_inference",
    "use_winograd_convolution",
    "use_sgemm_convolution",
    "use_packing_layout",
)


class NcnnStep(Step):
    """One extractor per run over Mats of the inputs; every output extracted, so the whole graph runs.

    The Mats own their memory (a copy of the arrays, made once): an in-place layer reading a graph input
    (a LayerNorm, a ReLU) makes ncnn check the input's reference count, which a Mat wrapping a numpy
    array has none of (ncnn 1.0.20261020 crashed with SIGSEGV on it); with a count of its own ncnn copies
    the input before writing, as for any app that keeps its input Mat, so every run reads the same data."""

    def __init__(self, owner: NcnnSession, arrays: list[tuple[str, Any]]) -> None:
        self.owner = owner
        self.arrays = arrays
        self.mats = [(name, owner.ncnn.Mat(array).clone()) for name, array in arrays]
        self.last: list[Any] = []

    def __call__(self) -> Any:
        extractor = self.owner.net.create_extractor()
        for name, mat in self.mats:
            extractor.input(name, mat)
        results = []
        for name in self.owner.output_names:
            code, mat = extractor.extract(name)
            if code != 0:
                raise RuntimeError(
                    f"ncnn could not compute output '{name}' (error {code}): the shape may not fit"
                )
            results.append(mat)
        self.last = results
        return results

    def outputs(self) -> dict[str, Any]:
        import numpy as np

        return {n: np.array(m, copy=True) for n, m in zip(self.owner.output_names, self.last, strict=True)}


def installed_version() -> str | None:
    """The installed ncnn's version (None: not installed)."""
    try:
        import ncnn
    except ImportError:
        return None
    return getattr(ncnn, "__version__", None) or _dist_version("ncnn")


PYTHON_MODULE = "ncnn"  # what importing the runtime means (its shared library loads)
SESSION = NcnnSession


# ---- task `profile` ---------------------------------------------------------------------------------


def layer_params(param: str) -> dict[str, dict[str, str]]:
    """Each layer's params (`k=v`) by layer name, as the .param file writes them."""
    return {layer.name: layer.params for layer in read_layers(param)}


def layer_work(kind: str, params: dict[str, str], inputs: list[list[int]], outputs: list[list[int]]) -> dict:
    """A layer's multiply-adds and fp32 weight bytes from its params and shapes, where its type has
    weights (ncnn's Python API reports neither): `runtime_flops` (multiply-adds, as MNN's count) and
    `parameter_bytes` in the profile's op record, so a kernel's work does not depend on shapes the
    profile cannot see (its weights)."""

    def number(key: str) -> int:
        try:
            return int(float(params.get(key, "0")))
        except ValueError:
            return 0

    weights = (
        number("6")
        if kind in ("Convolution", "ConvolutionDepthWise", "Deconvolution", "Convolution1D")
        else 0
    )
    if kind in ("InnerProduct", "MultiHeadAttention"):
        weights = number("2")
    out = outputs[0] if outputs else []
    x = inputs[0] if inputs else []
    if kind in ("Convolution", "ConvolutionDepthWise") and len(out) >= 2:
        macs = out[-1] * out[-2] * weights  # every weight once per output position
    elif kind == "Convolution1D" and out:
        macs = out[-1] * weights  # every weight once per output position
    elif kind == "Deconvolution" and len(x) >= 2:
        macs = x[-1] * x[-2] * weights  # every weight once per input position
    elif kind == "InnerProduct":
        macs = weights * (x[0] if len(x) == 2 else 1)  # a 2-D input is a batch of rows
    elif kind == "Gemm" and number("7") and number("8") and number("9"):
        macs, weights = number("7") * number("8") * number("9"), number("8") * number("9")
    elif kind == "MultiHeadAttention" and len(x) >= 2:
        seq, embed = x[-2], number("0")
        macs = 4 * seq * weights + 2 * seq * seq * embed  # q, k, v, out projections; scores and mix
        weights *= 4
    else:
        return {}
    return {"mflops": macs / 1e6, "parameter_bytes": 4.0 * weights} if macs else {}


def profile(
    task: dict,
    session: Any,
    plain: Any,
    feeds: dict[str, Any],
    warmup: int,
    runs: int,
    min_seconds: float = 0.0,
) -> tuple[list[float], dict[str, Any]]:
    """Per-layer wall times through the Python API (the wheel is built without NCNN_BENCHMARK): one
    extractor that keeps every blob (lightmode off), each layer's first output extracted in the graph's
    order as ncnn holds it (type 1: no repacking to the caller's layout, which would copy every
    activation), so each call runs that layer alone on inputs already computed; plain runs alternated.

    Extracting a blob already computed costs the call and nothing else: its median is reported as the
    per-layer overhead for the host to subtract (as MNN's gap between callbacks)."""
    import numpy as np

    from .timing import alternate

    net = session.net
    layers = [layer for layer in net.layers() if layer.type != "Input"]
    timed = [(layer.name, layer.type, int(layer.tops[0])) for layer in layers]
    if not timed:
        from .main import TaskError

        raise TaskError("model", "the ncnn graph has no layer to profile")
    clock = time.perf_counter_ns
    per_run: list[list[float]] = []
    gaps: list[float] = []

    def instrumented() -> None:
        extractor = kept_blobs(net, plain.mats)
        row = []
        for _, _, blob in timed:
            t0 = clock()
            extractor.extract(blob, 1)
            row.append((clock() - t0) / 1e6)
        t0 = clock()
        extractor.extract(timed[-1][2], 1)  # computed already: the call alone
        gaps.append((clock() - t0) / 1e6)
        per_run.append(row)

    ops = layer_ops(net, plain.mats, task["model"])  # untimed: the shapes each layer sees
    latencies = alternate(plain, instrumented, warmup, runs, min_seconds)
    kept = per_run[warmup:]
    return latencies, {
        "ops": ops,
        "per_run_ms": kept,
        "overhead_ms": float(np.median(gaps[warmup:] or gaps)),
        "runs": len(kept),
        "method": "extract of each layer's output in graph order, blobs kept",
    }


def kept_blobs(net: Any, mats: list[tuple[str, Any]]) -> Any:
    """An extractor over the inputs that keeps every blob it computes (lightmode off)."""
    net.opt.lightmode = False
    extractor = net.create_extractor()
    net.opt.lightmode = True
    for name, mat in mats:
        extractor.input(name, mat)
    return extractor


def layer_ops(net: Any, mats: list[tuple[str, Any]], param: str) -> list[dict[str, Any]]:
    """Every layer of the loaded graph but its inputs, in graph order, as the profile describes an op:
    type, name, the shapes it reads and writes on these inputs (ncnn run once, every blob kept; a batch
    axis of 1 before ncnn's own, as the ONNX model it came from declares it), its multiply-adds and
    weight bytes (`layer_work`)."""
    import numpy as np

    layers = [layer for layer in net.layers() if layer.type != "Input"]
    first = kept_blobs(net, mats)
    shapes = {
        int(blob): [int(d) for d in np.array(first.extract(int(blob))[1]).shape]
        for layer in layers
        for blob in (*layer.bottoms, *layer.tops)
    }
    params = layer_params(param)
    ins = {layer.name: [[1, *shapes[int(b)]] for b in layer.bottoms] for layer in layers}
    outs = {layer.name: [[1, *shapes[int(t)]] for t in layer.tops] for layer in layers}
    return [
        {
            "node": layer.name,
            "op_type": layer.type,
            "calls": 1.0,
            "inputs": [["float", s] for s in ins[layer.name]],
            "outputs": [["float", s] for s in outs[layer.name]],
            **layer_work(
                layer.type,
                params.get(layer.name, {}),
                [s[1:] for s in ins[layer.name]],
                [s[1:] for s in outs[layer.name]],
            ),
        }
        for layer in layers
    ]


PROFILE_KEY = "ncnn"  # where the reply carries the profile
