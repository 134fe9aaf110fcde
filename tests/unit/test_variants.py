"""Units of the variants and numerics tooling: weight discovery (also in subgraphs), fake quantization,
graph rewrites that must not change results, calibration files, output comparison, variant failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebench.agent.numerics import SNR_CAP_DB, compare_arrays
from edgebench.errors import UserError
from edgebench.jobs import ModelRef
from edgebench.models.quantize import (
    DeclaredInput,
    compact_names,
    constants_to_initializers,
    declared_inputs,
    fake_quantize,
    overridable_weights,
    weight_array,
    weight_layers,
)
from edgebench.models.variants import load_calibration, make_variants, variant_outcomes, write_mnn_calibration

RNG = np.random.default_rng(7)


def tensor(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def constant(output: str, shape: tuple[int, ...]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [output], value=tensor(output, shape))


def branch(name: str, weight_name: str) -> onnx.GraphProto:
    """A subgraph whose MatMul weight is a Constant node defined inside it (as exporters inline them)."""
    return helper.make_graph(
        [
            constant(weight_name, (8, 8)),
            helper.make_node("MatMul", ["h", weight_name], [f"{name}_out"], name=f"{name}/mm"),
        ],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1, 8])],
    )


def zoo_model() -> onnx.ModelProto:
    """Every kind of weight: initializer and Constant, Conv, Gemm (transB), MatMul with a constant A,
    Gather embeddings, one weight shared by two nodes, and If branches whose weights share one name."""
    n = helper.make_node
    nodes = [
        n("Conv", ["img", "conv.w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Flatten", ["c"], ["cf"], name="flat"),
        constant("fc.w", (8, 4 * 4 * 4)),
        n("Gemm", ["cf", "fc.w"], ["g"], name="fc", transB=1),
        n("Gather", ["emb.table", "ids"], ["e"], name="embed"),
        n("ReduceMean", ["e"], ["em"], name="emb_mean", axes=[1], keepdims=0),
        n("Add", ["g", "em"], ["h0"], name="mix"),
        n("MatMul", ["h0", "shared.w"], ["h1"], name="shared_a"),
        n("MatMul", ["h1", "shared.w"], ["h"], name="shared_b"),
        n("MatMul", ["left.w", "col"], ["lc"], name="left_mm"),
        n(
            "If",
            ["flag"],
            ["branch_out"],
            name="gate",
            then_branch=branch("then", "branch.w"),
            else_branch=branch("else", "branch.w"),
        ),
        n("ReduceSum", ["lc"], ["lcs"], name="lc_sum", keepdims=0),
        n("Mul", ["branch_out", "lcs"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "zoo",
        [
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 2, 4, 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3]),
            helper.make_tensor_value_info("col", TensorProto.FLOAT, [5, 1]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [
            tensor("conv.w", (4, 2, 3, 3)),
            tensor("emb.table", (10, 8)),
            tensor("shared.w", (8, 8)),
            tensor("left.w", (3, 5)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def feeds() -> dict[str, np.ndarray]:
    return {
        "img": RNG.standard_normal((1, 2, 4, 4)).astype(np.float32),
        "ids": np.array([[1, 4, 9]], dtype=np.int64),
        "col": RNG.standard_normal((5, 1)).astype(np.float32),
        "flag": np.array(True),
    }


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def test_weight_layers_finds_every_kind_of_weight_with_its_channel_axis() -> None:
    layers = {layer.node: layer for layer in weight_layers(zoo_model())}
    assert set(layers) == {"conv", "fc", "embed", "shared_a", "left_mm", "then/mm", "else/mm"}
    assert layers["conv"].axis == 0 and layers["conv"].shape == (4, 2, 3, 3)
    assert layers["fc"].axis == 0  # Gemm with transB=1: weight is (out, in)
    assert layers["embed"].axis == 0 and layers["embed"].op_type == "Gather"
    assert layers["shared_a"].nodes == ("shared_a", "shared_b")  # one weight, two users: one entry
    assert layers["shared_a"].axis == 1  # MatMul B (in, out): per output column
    assert layers["left_mm"].axis == 0  # MatMul with a constant A (out, in): per row
    assert layers["then/mm"].scope.endswith("then_branch") and layers["else/mm"].scope.endswith("else_branch")
    # the two branches define the same name: each gets its own overridable input
    assert layers["then/mm"].input_name != layers["else/mm"].input_name


def test_overridable_model_computes_the_same_and_each_weight_can_be_replaced() -> None:
    model = zoo_model()
    inputs = feeds()
    reference = run(model, inputs)
    overridable, layers = overridable_weights(model)
    onnx.checker.check_model(overridable)
    np.testing.assert_allclose(run(overridable, inputs), reference, rtol=1e-6, atol=1e-6)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(overridable.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    assert {i.name for i in session.get_overridable_initializers()} >= {layer.input_name for layer in layers}
    for layer in layers:  # flag=True: only the then branch runs, so the else weight changes nothing
        zeroed = np.zeros(layer.shape, dtype=np.float32)
        out = session.run(None, {**inputs, layer.input_name: zeroed})[0]
        if layer.node == "else/mm":
            np.testing.assert_allclose(out, reference, rtol=1e-6)
        else:
            assert not np.allclose(out, reference), layer.node
    np.testing.assert_array_equal(
        weight_array(overridable, layers[0]), numpy_helper.to_array(model.graph.initializer[0])
    )


@pytest.mark.parametrize("bits", [8, 4])
def test_fake_quantize_is_symmetric_per_channel(bits: int) -> None:
    w = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    w[2] *= 100.0  # one loud channel must not coarsen the others' scale
    w[5] = 0.0
    q = fake_quantize(w, bits, axis=0)
    qmax = 2 ** (bits - 1) - 1
    assert q.dtype == w.dtype and q.shape == w.shape
    for c in range(6):
        scale = np.abs(w[c]).max() / qmax if np.abs(w[c]).max() else 1.0
        levels = np.round(q[c] / scale)
        np.testing.assert_allclose(q[c], levels * scale, rtol=1e-5, atol=1e-7)
        assert np.abs(levels).max() <= qmax
        assert np.abs(q[c] - w[c]).max() <= scale / 2 + 1e-6
    assert np.all(q[5] == 0)
    assert np.abs(q[0] - w[0]).max() < np.abs(w[2]).max() / qmax / 10  # its own, finer scale
    per_tensor = fake_quantize(w, bits, axis=None)
    assert np.abs(per_tensor[0] - w[0]).mean() > np.abs(q[0] - w[0]).mean()


def test_four_bits_cost_more_than_eight() -> None:
    w = RNG.standard_normal((64, 64)).astype(np.float32)
    err8 = np.abs(fake_quantize(w, 8, 1) - w).mean()
    err4 = np.abs(fake_quantize(w, 4, 1) - w).mean()
    assert err4 > 8 * err8
    with pytest.raises(ValueError):
        fake_quantize(w, 9, 1)


def test_rewrites_for_quantizers_do_not_change_results() -> None:
    model = zoo_model()
    inputs = feeds()
    reference = run(model, inputs)
    moved = constants_to_initializers(model)
    assert moved == 3  # fc.w and the two branch weights
    assert not any(n.op_type == "Constant" for n in model.graph.node)
    np.testing.assert_allclose(run(model, inputs), reference, rtol=1e-6)
    before = model.ByteSize()
    compact_names(model)
    assert model.ByteSize() < before
    assert [i.name for i in model.graph.input] == ["img", "ids", "col", "flag"]
    assert [n.name for n in model.graph.node][:2] == ["conv", "flat"]  # node names are kept
    np.testing.assert_allclose(run(model, inputs), reference, rtol=1e-6)


def test_declared_inputs_report_dynamic_dims() -> None:
    model = zoo_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    inputs = {i.name: i for i in declared_inputs(model)}
    assert inputs["img"].shape == ("batch", 2, 4, 4) and inputs["img"].dynamic
    assert inputs["ids"].dtype == "int64" and not inputs["ids"].dynamic
    assert inputs["flag"].shape == ()


# ---- calibration ---------------------------------------------------------------------------------------
def test_calibration_samples_from_a_leading_axis_or_a_batch(tmp_path: Path) -> None:
    decl = [DeclaredInput("x", ("batch", 4), "float32"), DeclaredInput("n", (), "int64")]
    path = tmp_path / "c.npz"
    np.savez(path, x=np.ones((5, 1, 4)), n=np.array(3))
    cal = load_calibration(path, decl)
    assert len(cal.feeds) == 5 and cal.feeds[0]["x"].shape == (1, 4) and cal.feeds[0]["x"].dtype == np.float32
    assert cal.feeds[4]["n"] == 3 and cal.source == "c.npz" and not cal.random
    np.savez(path, x=np.ones((6, 4)), n=np.array(3))  # a batch of 6 rows: 6 samples of one row
    assert [f["x"].shape for f in load_calibration(path, decl).feeds] == [(1, 4)] * 6
    assert len(load_calibration(path, decl, limit=2).feeds) == 2


def test_calibration_errors_name_the_file_and_the_input(tmp_path: Path) -> None:
    decl = [DeclaredInput("x", (1, 4), "float32")]
    path = tmp_path / "c.npz"
    np.savez(path, y=np.ones((1, 4)))
    with pytest.raises(UserError, match=r"c.npz: no array 'x'.*it has: y"):
        load_calibration(path, decl)
    np.savez(path, x=np.ones((2, 2, 2, 4)))
    with pytest.raises(UserError, match="rank 2"):
        load_calibration(path, decl)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="bad.npz"):
        load_calibration(tmp_path / "bad.npz", decl)


def test_mnn_calibration_layout(tmp_path: Path) -> None:
    decl = [DeclaredInput("x", ("b", 3), "float32")]
    feeds = [{"x": np.full((1, 3), float(i), np.float32)} for i in range(2)]
    config = write_mnn_calibration(tmp_path / "cal", decl, {"x": [1, 3]}, feeds)
    import json

    cfg = json.loads(config.read_text())
    assert cfg["input_type"] == "sequence" and cfg["inputs"] == [{"name": "x", "shape": [1, 3]}]
    assert sorted(p.name for p in (tmp_path / "cal").iterdir()) == ["00000", "00001"]
    assert np.loadtxt(tmp_path / "cal" / "00001" / "x.txt").tolist() == [1.0, 1.0, 1.0]
    assert json.loads((tmp_path / "cal" / "00000" / "input.json").read_text())["inputs"][0]["shape"] == [1, 3]


# ---- comparison ------------------------------------------------------------------------------------------
def test_compare_arrays_metrics() -> None:
    ref = RNG.standard_normal(1000)
    same = compare_arrays(ref, ref.copy())
    assert same["cosine"] == pytest.approx(1.0) and same["max_abs_err"] == 0 and same["snr_db"] == SNR_CAP_DB
    noise = RNG.standard_normal(1000) * 0.01
    got = compare_arrays(ref, ref + noise)
    expected_snr = 10 * np.log10(np.sum(ref**2) / np.sum(noise**2))
    assert got["snr_db"] == pytest.approx(expected_snr)
    assert got["max_abs_err"] == pytest.approx(np.abs(noise).max())
    assert got["mean_abs_err"] == pytest.approx(np.abs(noise).mean())
    assert compare_arrays(ref, -ref)["cosine"] == pytest.approx(-1.0)
    assert compare_arrays(np.zeros(3), np.zeros(3))["cosine"] == 1.0
    assert compare_arrays(np.zeros(3), np.ones(3))["cosine"] == 0.0
    bad = ref.copy()
    bad[:10] = np.nan
    assert compare_arrays(ref, bad)["nonfinite"] == 10
    with pytest.raises(ValueError):
        compare_arrays(np.zeros(3), np.zeros(4))


# ---- variants that cannot be made ---------------------------------------------------------------------
def test_a_variant_that_cannot_be_made_is_an_entry_not_a_crash(tmp_path: Path) -> None:
    """A model with a dynamic input and no --shape: MNN full int8 cannot be made, and says why."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [tensor("w", (16, 8))]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    vset = make_variants(ModelRef("m", path), tmp_path / "out", kinds=["int8-dynamic", "mnn-int8"])
    made, failed = vset.variants
    assert made.ok and made.path is not None and made.path.name == "m.int8-dynamic.onnx"
    assert not failed.ok and failed.path is None
    assert "calibration needs the shape of input" in failed.error and "--shape x=Nx16" in failed.error
    assert not (tmp_path / "out" / "m.int8.mnn").exists()
    outcomes = variant_outcomes("run1", vset)
    assert [o.status for o in outcomes] == ["ok", "ok", "error"]
    assert outcomes[2].error == failed.error and outcomes[2].job.params == {"variant": "mnn-int8"}
    sizes = {r.params["variant"]: r.value for o in outcomes for r in o.records if r.metric == "size_bytes"}
    assert sizes == {"fp32": path.stat().st_size, "int8-dynamic": made.size_bytes}
    with pytest.raises(UserError, match="unknown variant 'int4'"):
        make_variants(ModelRef("m", path), tmp_path / "out", kinds=["int4"])


def test_device_npz_takes_any_tensor_name(tmp_path: Path) -> None:
    from edgebench.agent.numerics import _save_npz
    from edgebench.probes.numerics import read_npz

    arrays = {"file": np.ones(3), "save_infer_model/scale_0.tmp_1": np.arange(4), "allow_pickle": np.eye(2)}
    path = tmp_path / "deep" / "out.npz"
    _save_npz(str(path), arrays)
    back = read_npz(path)
    assert set(back) == set(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(back[name], value)


def test_recurrent_weights_and_weights_behind_identity() -> None:
    n = helper.make_node
    hidden = 4
    graph = helper.make_graph(
        [
            n("LSTM", ["x", "W", "R"], ["", "h"], name="lstm", hidden_size=hidden),
            n("Squeeze", ["h", "axes0"], ["h2"], name="squeeze"),
            n("Identity", ["proj.w"], ["proj.w.alias"], name="alias"),
            n("MatMul", ["h2", "proj.w.alias"], ["y"], name="proj"),
        ],
        "rnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [
            tensor("W", (1, 4 * hidden, 5)),
            tensor("R", (1, 4 * hidden, hidden)),
            tensor("proj.w", (hidden, 2)),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "axes0"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 7
    layers = weight_layers(model)
    assert [(layer.node, layer.weight, layer.axis) for layer in layers] == [
        ("lstm", "W", 1),
        ("lstm", "R", 1),
        ("proj", "proj.w", 1),
    ]
    inputs = {"x": RNG.standard_normal((3, 1, 5)).astype(np.float32)}
    overridable, _ = overridable_weights(model)
    np.testing.assert_allclose(run(overridable, inputs), run(model, inputs), rtol=1e-6)
