"""Layer-wise divergence: a four-layer MLP with one layer made fragile to int8 by an outlier weight has that
layer named as the first divergent op against its own int8 variants; onnxruntime vs MNN on the same fp32
model finds none. The reference for the figures: onnxruntime run directly on the same inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

D = 256
FRAGILE = 2  # the layer with the outlier weight


def mlp(path: Path, fragile: bool) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(4):
        w = (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)
        if fragile and i == FRAGILE:
            w[3, 5] = 400.0  # per-tensor int8: the scale is set by this one weight, the rest round to 0
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(D, np.float32), f"b{i}"),
        ]
        out = f"h{i}" if i < 3 else "y"
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"fc{i}/MatMul"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"a{i}"], name=f"fc{i}/Add"),
            helper.make_node("Relu" if i < 3 else "Identity", [f"a{i}"], [out], name=f"fc{i}/Act"),
        ]
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, D])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def per_op(variant: Path, reference: Path, cwd: Path, *extra: object) -> list[dict]:
    res = edgebench(
        "accuracy", variant, "--reference", reference, "--per-op", *extra, "--no-store", "--json", cwd=cwd
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["records"]


def first_divergent(records: list[dict]) -> dict:
    [first] = [r for r in records if r["metric"] == "first_divergent_op"]
    return first


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("per-op")
    out = {}
    for name, fragile in (("fragile", True), ("plain", False)):
        model = mlp(folder / f"{name}.onnx", fragile)
        res = edgebench(
            "variants", model, "--out", folder / name, "--only", "int8-dynamic,int8-static", "--no-store",
            cwd=folder,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        out[name] = model
        for kind in ("int8-dynamic", "int8-static"):
            [path] = (folder / name).glob(f"*{kind}.onnx")
            out[f"{name}-{kind}"] = path
    return out


@pytest.mark.parametrize("kind", ["int8-dynamic", "int8-static"])
def test_the_fragile_layer_is_the_first_divergent_op(
    variants: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    records = per_op(variants[f"fragile-{kind}"], variants["fragile"], tmp_path, "--tolerance", 0.05)
    first = first_divergent(records)
    assert first["params"]["op"].startswith(f"fc{FRAGILE}/"), first
    assert first["params"]["tolerance"] == 0.05 and first["value"] > 0.05
    # Every earlier layer was compared and stayed under the tolerance.
    earlier = [
        r
        for r in records
        if r["metric"] == "op_rel_error" and r["annotations"]["order"] < first["annotations"]["order"]
    ]
    assert {r["params"]["op"].split("/")[0] for r in earlier} >= {"fc0", "fc1"}
    assert all(r["value"] <= 0.05 for r in earlier)
    print(
        f"{kind}: first divergent op {first['params']['op']} ({first['params']['tensor']}), rel error {first['value']:.3f}"
    )
    # The same quantization of the model without the outlier has no op over that tolerance.
    plain = first_divergent(
        per_op(variants[f"plain-{kind}"], variants["plain"], tmp_path, "--tolerance", 0.05)
    )
    assert plain["params"]["op"] is None and plain["value"] is None


def test_figures_match_onnxruntime_run_directly(variants: dict[str, Path], tmp_path: Path) -> None:
    import onnxruntime as ort

    x = np.random.default_rng(7).uniform(-1, 1, (1, D)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    records = per_op(
        variants["fragile-int8-dynamic"], variants["fragile"], tmp_path, "--inputs", tmp_path / "x.npz"
    )
    [y] = [r for r in records if r["metric"] == "op_rel_error" and r["params"]["tensor"] == "y"]
    ref = ort.InferenceSession(str(variants["fragile"]), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    out = ort.InferenceSession(str(variants["fragile-int8-dynamic"]), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    want = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref.astype(np.float64))
    assert y["value"] == pytest.approx(want, rel=1e-3)


def test_onnxruntime_and_mnn_on_one_fp32_model_find_no_divergent_op(
    variants: dict[str, Path], tmp_path: Path
) -> None:
    pytest.importorskip("MNN")
    model = variants["fragile"]
    records = per_op(model, model, tmp_path, "--runtime", "mnn")
    first = first_divergent(records)
    assert first["params"]["op"] is None and first["params"]["tolerance"] == 1e-3
    assert {r["runtime"] for r in records} == {"mnn"}
    compared = [r for r in records if r["metric"] == "op_rel_error"]
    assert len(compared) == 12 and max(r["value"] for r in compared) < 1e-5
    # MNN fuses each Relu into the MatMul+Add before it; those tensors are said to be fused, not divergent.
    assert {r["params"]["tensor"] for r in compared if r["annotations"]["fused_into"]} == {"a0", "a1", "a2"}
