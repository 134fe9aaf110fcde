"""ONNX -> ncnn (`.ncnn.param` graph, `.ncnn.bin` weights beside it) through pnnx's bundled converter binary.

The PyPI `pnnx` package ships a static `pnnx` executable in its folder; its Python side imports torch, so
the package is found without importing it and the binary is called directly (install it with
`pip install --no-deps pnnx`). pnnx writes fp16 weights unless told `fp16=0`: the weights' precision is an
explicit argument here, recorded in the file name, never the converter's default.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError, seconds
from ..files import seal
from ..jobs import ncnn_weights_of
from ..lab.hashing import sha256_file
from .refs import models_cache_dir

NCNN_MAGIC = "7767517"  # the first line of every ncnn .param text file


def pnnx_binary() -> Path:
    """The pnnx executable inside the installed `pnnx` package; a one-line ModelError where there is none."""
    spec = importlib.util.find_spec("pnnx")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / "pnnx"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ModelError(
        "pnnx is not installed: converting ONNX to ncnn needs its converter binary "
        "(pip install --no-deps pnnx; its dependencies pull torch, which the binary does not need)"
    )


def onnx_input_shapes(onnx_path: Path, shapes: Mapping[str, Sequence[int]] | None = None) -> list[list[int]]:
    """Each graph input's shape, as pnnx takes them: the given shape where one is given (with the leading
    batch of 1 the ONNX graph declares put back where it was left out, as ncnn's own shapes leave it),
    else the declared one with every dynamic dimension at 1 (ncnn bakes the shapes it was converted at
    into some layers)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        if shapes and value.name in shapes:
            given = [int(d) for d in shapes[value.name]]
            found.append([1, *given] if len(given) == len(dims) - 1 else given)
            continue
        found.append([d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims])
    return found


def onnx_to_ncnn(
    onnx_path: Path,
    fp16_weights: bool = False,
    shapes: Mapping[str, Sequence[int]] | None = None,
    timeout: float = 600.0,
    out: Path | None = None,
) -> Path:
    """Convert once per (content, weight precision, shapes); return the `.ncnn.param` (its `.ncnn.bin`
    beside it), cached on the host unless `out` names it. Every layer of the result is checked against
    the layers this ncnn knows, so an ONNX op ncnn lacks is a one-line error naming it, not a load
    failure on the device."""
    dims = onnx_input_shapes(onnx_path, shapes)
    shape_arg = ",".join("[" + ",".join(str(d) for d in s) + "]" for s in dims)
    cached = out is None
    if out is None:
        tag = sha256_file(onnx_path)[:16] + ("-fp16" if fp16_weights else "")
        if shapes:
            tag += "-" + sha256_text(shape_arg)[:8]
        out = models_cache_dir() / "ncnn" / f"{onnx_path.stem}-{tag}.ncnn.param"
        if out.exists() and ncnn_weights_of(out).exists():
            return out
    binary = pnnx_binary()
    out = out.absolute()  # pnnx runs in a folder of its own
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pnnx-", dir=out.parent) as work:
        source = Path(work) / "model.onnx"
        shutil.copyfile(onnx_path, source)  # pnnx writes its by-products beside its input
        argv = [str(binary), str(source), f"inputshape={shape_arg}", f"fp16={int(fp16_weights)}"]
        try:
            proc = subprocess.run(
                argv, cwd=work, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise ModelError(f"{onnx_path}: pnnx timed out after {seconds(timeout)} s") from None
        param, weights = Path(work) / "model.ncnn.param", Path(work) / "model.ncnn.bin"
        if proc.returncode != 0 or not param.is_file() or not weights.is_file():
            lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit {proc.returncode}"
            raise ModelError(f"{onnx_path}: pnnx could not convert it to ncnn ({why})")
        check_ncnn_layers(param, source_name=str(onnx_path))
        name_blobs(param, onnx_io_names(onnx_path), dims)
        suffix = f".{os.getpid()}.{threading.get_ident()}"  # devices convert in parallel
        tmp_weights = ncnn_weights_of(out).with_name(ncnn_weights_of(out).name + suffix)
        tmp_param = out.with_name(out.name + suffix)
        shutil.move(weights, tmp_weights)
        shutil.move(param, tmp_param)
        if cached:  # the cache never rewrites its files (edgebench.files); those the caller named are theirs
            seal(tmp_weights)
            seal(tmp_param)
        os.replace(tmp_weights, ncnn_weights_of(out))  # the weights first: a param seen means a pair
        os.replace(tmp_param, out)
    return out


def onnx_io_names(onnx_path: Path) -> tuple[list[str], list[str]]:
    """The graph's input (initializers excluded) and output names, in order."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    return [v.name for v in graph.input if v.name not in initializers], [v.name for v in graph.output]


def ncnn_shape(dims: Sequence[int]) -> list[int]:
    """An ONNX shape as ncnn holds it: no batch axis (a leading 1 dropped), at most four axes c, d, h, w."""
    dims = list(dims)
    return dims[1:] if len(dims) > 1 and dims[0] == 1 else dims


def name_blobs(param: Path, names: tuple[list[str], list[str]], shapes: Sequence[Sequence[int]]) -> None:
    """Give pnnx's `in0..`/`out0..` blobs the ONNX graph's input and output names (so inputs files,
    outputs and comparisons speak of the same tensors on every runtime) and write each input's shape
    into its Input layer (0=w 1=h 11=d 2=c), which is how an ncnn graph declares what it takes. A name
    ncnn's text format cannot hold (whitespace) keeps pnnx's."""
    inputs, outputs = names
    lines = param.read_text().splitlines()
    blobs = {b for line in lines[2:] for b in line.split()[4:]}
    # pnnx numbers the graph's inputs and outputs in the ONNX order; where its count differs (an output
    # it folded away), its own names are kept rather than guessed
    if any(f"in{i}" not in blobs for i in range(len(inputs))) or f"in{len(inputs)}" in blobs:
        inputs = []
    if any(f"out{i}" not in blobs for i in range(len(outputs))) or f"out{len(outputs)}" in blobs:
        outputs = []
    rename = {f"in{i}": n for i, n in enumerate(inputs)} | {f"out{i}": n for i, n in enumerate(outputs)}
    rename = {old: new for old, new in rename.items() if new and not any(c.isspace() for c in new)}
    shape_of = {f"in{i}": ncnn_shape(s) for i, s in enumerate(shapes)}
    out = lines[:2]
    for line in lines[2:]:
        fields = line.split()
        if len(fields) < 4:
            out.append(line)
            continue
        blobs = 4 + int(fields[2]) + int(fields[3])
        parts = line.split(None, blobs)  # the params stay as written (a quoted string may hold spaces)
        head, extra = parts[:blobs], parts[blobs:]
        if fields[0] == "Input" and head[-1] in shape_of and 1 <= len(shape_of[head[-1]]) <= 4:
            axes = ("0", "1", "11", "2") if len(shape_of[head[-1]]) == 4 else ("0", "1", "2")
            declared = dict(zip(axes, reversed(shape_of[head[-1]]), strict=False))
            extra = [f"{k}={v}" for k, v in declared.items()] + [
                kv for kv in extra if kv.split("=")[0] not in declared
            ]
        head = head[:4] + [rename.get(blob, blob) for blob in head[4:]]
        out.append(" ".join(head + extra))
    param.write_text("\n".join(out) + "\n")


def sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ParamLayer:
    """One layer line of an ncnn .param: its type, name, input and output blobs."""

    type: str
    name: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    params: tuple[tuple[str, str], ...] = ()  # its `key=value` fields, as written

    def param(self, key: str, default: str | None = None) -> str | None:
        return next((v for k, v in self.params if k == key), default)


def param_layers(param: Path) -> list[tuple[str, str]]:
    """(type, name) of every layer an ncnn .param text file declares; a ModelError naming the file when
    it is not one."""
    return [(layer.type, layer.name) for layer in param_graph(param)]


def param_outputs(layers: Sequence[ParamLayer]) -> list[str]:
    """The graph's outputs: blobs a layer makes and none consumes, in order."""
    consumed = {b for layer in layers for b in layer.bottoms}
    return [t for layer in layers for t in layer.tops if t not in consumed]


def param_graph(param: Path) -> list[ParamLayer]:
    """Every layer of an ncnn .param text file in its order (ncnn's is topological); a ModelError naming
    the file and line when it is not one."""
    try:
        text = param.read_text(errors="replace")
    except OSError as exc:
        raise ModelError(f"{param}: cannot read ncnn param file: {exc.strerror}") from None
    return param_graph_of_text(text, str(param))


def param_graph_of_text(text: str, source: str) -> list[ParamLayer]:
    """`param_graph` of a .param's text, errors naming `source`."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != NCNN_MAGIC:
        raise ModelError(f"{source}: not an ncnn param file (first line is not the magic {NCNN_MAGIC})")
    layers = []
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if not fields:
            continue
        try:
            bottoms, tops = int(fields[2]), int(fields[3])
        except (IndexError, ValueError):
            bottoms = tops = -1
        if bottoms < 0 or tops < 0 or len(fields) < 4 + bottoms + tops:
            raise ModelError(f"{source}:{number}: malformed ncnn layer line '{line.strip()[:60]}'")
        blobs = fields[4 : 4 + bottoms + tops]
        params = tuple(
            (k, v) for k, _, v in (f.partition("=") for f in fields[4 + bottoms + tops :] if "=" in f)
        )
        layers.append(
            ParamLayer(fields[0], fields[1], tuple(blobs[:bottoms]), tuple(blobs[bottoms:]), params)
        )
    return layers


def check_ncnn_layers(param: Path, source_name: str | None = None) -> None:
    """Refuse a graph with a layer type this ncnn does not know (pnnx writes an op ncnn lacks under its
    own name), naming the first such layer."""
    import ncnn

    for kind, name in param_layers(param):
        if ncnn.layer_to_index(kind) < 0:
            raise ModelError(
                f"{source_name or param}: ncnn has no layer type '{kind}' (layer '{name}'); "
                "the model needs an op this ncnn does not implement"
            )
    if ncnn.Net().load_param(str(param)) != 0:
        raise ModelError(f"{source_name or param}: {load_failure(param)}")


def load_failure(param: Path) -> str:
    """Why ncnn refuses to load a graph, naming the layer: read from ncnn's log in a process of its own
    (the log goes to the process's stderr, which the host's other threads write to)."""
    code = (
        "import sys, ncnn\n"
        "from edgebench.agent.session_ncnn import load_param\n"
        "print(load_param(ncnn.Net(), sys.argv[1], 'the graph pnnx made') or '')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(param)], capture_output=True, text=True, timeout=60
    )
    said = done.stdout.strip().splitlines()
    return said[-1] if said else f"ncnn could not load it ({done.stderr.strip()[-160:] or 'no reason given'})"
