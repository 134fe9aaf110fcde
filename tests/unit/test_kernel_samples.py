"""Kernel samples: every sample of the default grid builds, runs in onnxruntime and computes what it says,
is the kernel kind it samples as the predictor sees it, and the calibration suite profiles exactly the grid;
bad keys are one line; the predictor never holds a sample out as a model."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgebench.analysis import kernel_predict as kp
from edgebench.analysis.cost import analyze
from edgebench.analysis.kernels import Kernel, graph_kernels
from edgebench.errors import ModelError
from edgebench.models.kernel_samples import (
    CALIBRATION,
    is_kernel_sample,
    parse_sample,
    sample_key,
    sample_model,
)
from edgebench.models.refs import resolve_model

ROOT = Path(__file__).resolve().parents[2]

# the kinds each op samples, as kernels.graph_kernels names them (the ones a profile is fitted per)
SAMPLED_KINDS = {
    "conv": {"conv", "gemm", "gemv"},  # a 1x1 convolution is a GEMM (a GEMV over few positions)
    "conv1d": {"conv", "gemv"},  # over few frames each weight serves a few multiply-adds: a GEMV
    "dwconv": {"conv_dw"},
    "deconv": {"deconv"},
    "attention": {"matmul", "softmax", "copy"},  # the transpose of its keys is a copy
    "lstm": {"recurrent"},
    "norm": {"norm"},
    "skipnorm": {"norm"},  # onnxruntime's SkipLayerNormalization, the residual Add inside
    "gelu": {"elementwise"},
    "hardswish": {"elementwise"},
    "convswish": {"conv", "gemm"},  # then the hard-swish's element-wise parts
    "add": {"elementwise"},
    "pool": {"pool"},
    "resize": {"resize"},
    "transpose": {"copy", "layout"},
}


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_every_sample_of_the_grid_builds_runs_and_is_the_kind_it_samples(tmp_path: Path) -> None:
    names = set()
    for key in CALIBRATION:
        name, path = sample_model(key, tmp_path)
        assert is_kernel_sample(name) and name not in names, key
        names.add(name)
        s = session(path)
        rng = np.random.default_rng(0)
        y = s.run(None, {x.name: rng.random(x.shape, np.float32) for x in s.get_inputs()})[0]
        assert np.isfinite(y).all() and list(y.shape) == s.get_outputs()[0].shape, key
        op = parse_sample(key).op
        kinds = {k.kind for k in graph_kernels(analyze(path))} - {"view", "shape"}
        expected = {"gemv"} if op == "gemm" and "m=1," in key else SAMPLED_KINDS.get(op, {"gemm"})
        assert kinds and kinds <= expected | {"elementwise"}, (key, kinds)
        assert kinds & expected, (key, kinds)


def test_a_gemv_sample_computes_relu_of_x_w_plus_b(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    _, path = sample_model("kernel:gemm,m=1,k=64,n=32", tmp_path)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    y = session(path).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, np.maximum(x @ inits["w"] + inits["b"], 0), rtol=1e-5, atol=1e-5)


def test_a_conv1d_sample_computes_relu_of_its_strided_padded_convolution(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    _, path = sample_model("kernel:conv1d,c=3,o=5,l=20,k=4,s=3", tmp_path)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    w, b = inits["w"], inits["b"]
    x = np.random.default_rng(1).standard_normal((1, 3, 20)).astype(np.float32)
    y = session(path).run(None, {"x": x})[0]
    padded = np.pad(x[0], ((0, 0), (2, 2)))  # k // 2 each side
    steps = (20 + 4 - 4) // 3 + 1
    ref = np.stack([np.einsum("ock,ck->o", w, padded[:, 3 * t : 3 * t + 4]) + b for t in range(steps)], -1)
    assert y.shape == (1, 5, steps)
    np.testing.assert_allclose(y[0], np.maximum(ref, 0), rtol=1e-5, atol=1e-5)


def test_a_convswish_sample_computes_the_hard_swish_of_its_strided_convolution(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    _, path = sample_model("kernel:convswish,c=3,o=4,h=6,w=10,k=3,s=2", tmp_path)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    w, b = inits["w"], inits["b"]
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 10)).astype(np.float32)
    y = session(path).run(None, {"x": x})[0]
    padded = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    conv = (
        np.stack(
            [
                np.stack(
                    [
                        np.einsum("ocij,cij->o", w, padded[:, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3])
                        for j in range(5)
                    ],
                    -1,
                )
                for i in range(3)
            ],
            -2,
        )
        + b[:, None, None]
    )
    assert y.shape == (1, 4, 3, 5)
    np.testing.assert_allclose(y[0], conv * np.clip(conv + 3, 0, 6) / 6, rtol=1e-5, atol=1e-5)


def test_the_same_key_gives_the_same_bytes(tmp_path: Path) -> None:
    a = sample_model("kernel:conv,c=8,o=8,hw=16", tmp_path / "a")[1].read_bytes()
    b = sample_model("kernel:conv,o=8,c=8,hw=16,k=3,s=1,g=1", tmp_path / "b")[1].read_bytes()
    assert a == b


def test_a_stored_sample_name_gives_back_its_key() -> None:
    for key in CALIBRATION:
        assert parse_sample(sample_key(parse_sample(key).name)).name == parse_sample(key).name
    assert (
        sample_key("mlp") is None
        and sample_key("kernel-nope-c1") is None
        and sample_key("kernel-gemm-x") is None
    )


def test_a_sample_resolves_as_a_builtin_with_its_identity() -> None:
    ref = resolve_model("builtin:kernel:dwconv,c=16,hw=20,k=5")
    assert ref.name == "kernel-dwconv-c16-hw20-k5-s1" and ref.path.is_file()


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("kernel:nope,c=1", "unknown op 'nope'"),
        ("kernel:gemm,m=1,k=8", "missing n"),
        ("kernel:gemm,m=1,k=8,n=x", "n='x' is not an integer"),
        ("kernel:gemm,m=1,k=8,n=8,q=3", "'q=3' is not KEY=VALUE"),
        ("kernel:conv,c=6,o=8,hw=8,g=4", "must divide by the groups"),
        ("kernel:gemm,m=0,k=8,n=8", "m=0 must be positive"),
    ],
)
def test_a_bad_key_is_one_line_naming_what_is_wrong(key: str, says: str) -> None:
    with pytest.raises(ModelError, match=says) as info:
        resolve_model("builtin:" + key)
    assert "\n" not in str(info.value)


def test_the_calibration_suite_profiles_exactly_the_default_grid() -> None:
    suite = tomllib.loads((ROOT / "suites" / "calibrate.toml").read_text())
    assert suite["models"] == [f"builtin:{key}" for key in CALIBRATION]
    kinds = [p["kind"] for p in suite["probe"]]
    assert kinds == ["profile", "bandwidth"] and suite["probe"][1]["params"]["sweep"] is True
    # the sweep is taken at the profiles' thread count (the predictor charges bytes at it)
    assert suite["probe"][0]["params"]["threads"] == suite["probe"][1]["params"]["threads"]


def test_samples_are_trained_on_but_never_held_out() -> None:
    def run(name: str, ms: float) -> kp.ProfiledRun:
        k = Kernel("gemm", ms * 1e8, 1e4, 1e4)
        return kp.ProfiledRun("dev", "onnxruntime", 1, name, "{}", ms + 0.01, ((k, ms),))

    runs = [run(f"m{i}", 0.1 * (i + 1)) for i in range(3)] + [
        run(f"kernel-gemm-s{i}", 0.05 * i + 0.02) for i in range(4)
    ]
    graphs = {(r.model, r.shapes): [k for k, _ in r.kernels] for r in runs}
    held = kp.cross_validate(runs, graphs)
    assert sorted(h.run.model for h in held) == ["m0", "m1", "m2"]
