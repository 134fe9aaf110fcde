"""The kernels a model's graph is predicted to run are those the real runtimes run: the built-in encoder and
the fused-op kernel samples profiled with the real onnxruntime and MNN (one `edgebench run` of `profile`
jobs on local), counted per kind against `kernels.graph_kernels`.

What the fusions are: onnxruntime runs a residual Add and its LayerNormalization as one
SkipLayerNormalization, a MatMul of constant weights and its bias as one Gemm (reshaping more than two
dimensions around it), a MatMul and the scalar scale after it as one FusedMatMul; MNN runs an exported
erf-GELU (five nodes) as one unary op, and an LSTM step as its parts (two GEMVs, the gates' element-wise
ops). A predictor that counted the nodes instead charges a kernel per node.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from edgebench.analysis.cost import analyze
from edgebench.analysis.kernel_predict import profiled_runs
from edgebench.analysis.kernels import graph_kernels
from edgebench.models.refs import resolve_model
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench
from tests.integration.kernel_profiles import ocr_models

pytestmark = pytest.mark.integration

MODELS = [
    "builtin:encoder",
    "builtin:kernel:skipnorm,s=64,d=256",
    "builtin:kernel:gelu,s=64,d=256",
    "builtin:kernel:lstm,i=64,h=96",
]
# PP-OCRv4's recognizer on onnxruntime: LayerNorms exported as their parts, sigmoid GELUs, and MatMuls whose
# bias stays an Add (the model's shapes are dynamic, so onnxruntime cannot reshape them into a Gemm)
REC, REC_SHAPE = "ch_PP-OCRv4_rec_infer", [1, 3, 48, 160]
# the kinds both sides must agree on (copies are not: onnxruntime splits and merges Slices and Concats,
# MNN adds Raster copies around its MatMuls, which no graph node stands for)
KINDS = {
    "onnxruntime": ("gemm", "gemv", "matmul", "norm", "softmax", "elementwise", "recurrent"),
    "mnn": ("gemm", "gemv", "norm", "softmax", "elementwise", "recurrent"),
}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    folder = tmp_path_factory.mktemp("fusions")
    names = json.dumps([resolve_model(m).name for m in MODELS])
    # kernel counts are checked, not times: as few runs as make a profile, no time window
    probes = "".join(
        f'[[probe]]\nkind = "profile"\nmodels = {names}\n'
        f'params = {{ threads = 1, runs = 5, warmup = 1, min_seconds = 0.0, runtime = "{rt}" }}\n'
        for rt in KINDS
    )
    probes += (
        f'[[probe]]\nkind = "profile"\nmodels = ["{REC}"]\n'
        f"params = {{ threads = 1, runs = 3, warmup = 1, min_seconds = 0.0, shapes = {{ x = {REC_SHAPE} }} }}\n"
    )
    models = [*MODELS, str(ocr_models()[REC])]
    suite = folder / "fusions.toml"
    suite.write_text(f'name = "fusions"\ndevices = ["local"]\nmodels = {json.dumps(models)}\n\n{probes}')
    res = edgebench("run", suite, "--store", folder / "s.db", cwd=folder)
    assert res.returncode == 0, res.stderr[-3000:]
    with Store(folder / "s.db") as s:
        runs = profiled_runs(s.records())
    assert len(runs) == len(MODELS) * len(KINDS) + 1, [(r.model, r.runtime) for r in runs]
    return {rt: [r for r in runs if r.runtime == rt] for rt in KINDS}


def kinds_of(kernels, runtime: str) -> Counter:
    # a Cast the recognizer runs on its shape values is a `shape` kernel on the graph side (the analysis
    # knows those values), an elementwise one in onnxruntime's profile
    return Counter(k.kind for k in kernels if k.kind in KINDS[runtime] and k.op_type != "Cast")


@pytest.mark.parametrize("runtime", list(KINDS))
def test_graph_kernels_are_the_kernels_the_runtime_runs(profiles: dict[str, list], runtime: str) -> None:
    paths = {resolve_model(m).name: resolve_model(m).path for m in MODELS} | {REC: ocr_models()[REC]}
    for run in profiles[runtime]:
        cost = analyze(Path(paths[run.model]), {k: list(v) for k, v in json.loads(run.shapes).items()})
        graph = graph_kernels(cost, runtime, nchwc_block=1)
        profiled = kinds_of([k for k, _ in run.kernels], runtime)
        print(runtime, run.model, dict(profiled), sorted(k.op_type for k, _ in run.kernels))
        assert kinds_of(graph, runtime) == profiled, (run.model, sorted(k.op_type for k, _ in run.kernels))
    if runtime == "onnxruntime":
        ops = Counter(k.op_type for r in profiles[runtime] for k, _ in r.kernels)
        # the fusions this predicts happened: the encoder's two SkipLayerNorms and the sample's, the
        # recognizer's five LayerNorms and seven QuickGelus
        assert (ops["SkipLayerNormalization"], ops["LayerNormalization"], ops["QuickGelu"]) == (3, 5, 7), ops


# MNN: a hard-swish after a convolution it ran as a GEMM over whole 24-position tiles (a 1x1 or a strided
# one: 288, 1152 positions) against after one it did not (81 positions; a stride-1 3x3), and PP-OCR's
# classifier, whose 1x1 and strided convolutions all end on whole tiles at its 48 x 96 input
TILED = {
    "builtin:kernel:convswish,c=16,o=32,h=12,w=24": 1,
    "builtin:kernel:convswish,c=3,o=16,h=48,w=96,k=3,s=2": 1,
    "builtin:kernel:convswish,c=16,o=32,h=9,w=9": 0,
    "builtin:kernel:convswish,c=16,o=32,h=12,w=24,k=3": 0,
}
CLS, CLS_SHAPE = "ch_ppocr_mobile_v2.0_cls_infer", [1, 3, 48, 96]


def test_mnn_unary_ops_reading_whole_gemm_tiles_are_marked_alike_on_both_sides(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("tiles")
    names = json.dumps([resolve_model(m).name for m in TILED])
    params = 'threads = 1, runs = 20, warmup = 2, min_seconds = 0.0, runtime = "mnn"'
    probes = f'[[probe]]\nkind = "profile"\nmodels = {names}\nparams = {{ {params} }}\n'
    probes += f'[[probe]]\nkind = "profile"\nmodels = ["{CLS}"]\nparams = {{ {params}, shapes = {{ x = {CLS_SHAPE} }} }}\n'
    suite = folder / "tiles.toml"
    suite.write_text(
        f'name = "tiles"\ndevices = ["local"]\nmodels = {json.dumps([*TILED, str(ocr_models()[CLS])])}\n\n{probes}'
    )
    res = edgebench("run", suite, "--store", folder / "s.db", cwd=folder)
    assert res.returncode == 0, res.stderr[-3000:]
    with Store(folder / "s.db") as s:
        runs = {r.model: r for r in profiled_runs(s.records())}
    paths = {resolve_model(m).name: resolve_model(m).path for m in TILED} | {CLS: ocr_models()[CLS]}
    expected = {resolve_model(m).name: n for m, n in TILED.items()}
    per_element = {True: [], False: []}  # ns per element of every unary op, by its mark
    for name, path in paths.items():
        run = runs[name]
        cost = analyze(Path(path), {k: list(v) for k, v in json.loads(run.shapes).items()})
        graph = sum(k.reads_gemm_tiles for k in graph_kernels(cost, "mnn"))
        profiled = sum(k.reads_gemm_tiles for k, _ in run.kernels)
        assert graph == profiled == expected.get(name, profiled), (name, graph, profiled)
        for k, ms in run.kernels:
            if k.op_type == "UnaryOp":
                per_element[k.reads_gemm_tiles].append(ms * 1e6 / (k.bytes / 8))
    assert sum(k.reads_gemm_tiles for k, _ in runs[CLS].kernels) >= 10  # its 1x1 convs' hard-swishes
    # what the mark is for, printed (it is this host's MNN build's, not asserted elsewhere)
    print({m: f"{np.median(v):.2f} ns/element over {len(v)}" for m, v in per_element.items() if v})
