"""Defaults that make good artefacts: a calibrated variant of a dynamic model is refused without a shape
or data (instead of calibrating at 1x1), and converter noise goes to a log file with a one-line summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebench.jobs import ModelRef
from edgebench.models.variants import make_variants
from edgebench.testing.cli import edgebench


def dynamic_model(path: Path, tiny_weights: bool = False) -> Path:
    """y = relu(x @ W) with a dynamic batch and length; tiny weights make float16 conversion warn."""
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    if tiny_weights:
        w[:, :4] *= 1e-30  # under fp16's smallest normal: onnxconverter-common warns once per value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_int8_static_refuses_a_dynamic_model_without_a_shape(tmp_path: Path) -> None:
    model = ModelRef("dyn", dynamic_model(tmp_path / "dyn.onnx"))
    vset = make_variants(model, tmp_path / "out", kinds=["int8-static", "int8-dynamic"])
    static, dynamic = vset.variants
    assert not static.ok and static.path is None and dynamic.ok  # the others are still made
    assert static.error is not None and "\n" not in static.error
    assert "input 'x'" in static.error and "--shape x=Nx" in static.error and "--calib" in static.error
    made = make_variants(model, tmp_path / "out2", kinds=["int8-static"], shapes={"x": [2, 5, 16]})
    assert made.variants[0].ok and made.variants[0].params["calibration"] == "random"


def test_converter_noise_goes_to_a_log_with_a_one_line_summary(tmp_path: Path) -> None:
    model = dynamic_model(tmp_path / "noisy.onnx", tiny_weights=True)
    res = edgebench("variants", model, "--out", tmp_path / "v", "--only", "fp16", "--no-store", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    log = tmp_path / "v" / "noisy.variants.log"
    text = log.read_text()
    warned = text.count("will be truncated")
    assert warned >= 2 and "UserWarning" in text  # what the converter said is kept
    assert "truncated" not in res.stderr and "UserWarning" not in res.stderr
    summary = [line for line in res.stderr.splitlines() if str(log) in line]
    assert len(summary) == 1 and f"printed {warned} line(s)" in summary[0]
    manifest = json.loads((tmp_path / "v" / "noisy.variants.json").read_text())
    assert manifest["log"] == str(log)
