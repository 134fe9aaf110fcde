"""LiteRT as a runtime: the built-in .tflite model, written from the wheel's flatbuffer schema, computes what
the ONNX built-in computes (onnxruntime is the independent reference), and the session computes on the
inputs of every call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (scripts/install-test-deps.sh)")

from edgebench.agent.session_litert import LiteRtSession
from edgebench.agent.session_onnxruntime import OrtSession
from edgebench.errors import ModelError
from edgebench.models.refs import check_model_file, resolve_model
from edgebench.probes.common import model_file_for, runtime_of


def test_builtin_tflite_mlp_matches_the_onnx_builtin() -> None:
    tfl, onx = resolve_model("builtin:mlp.tflite"), resolve_model("builtin:mlp")
    assert tfl.name == onx.name == "mlp" and tfl.format == "tflite"
    x = np.random.default_rng(3).uniform(-1, 1, (1, 1024)).astype(np.float32)
    got = LiteRtSession(str(tfl.path), threads=1).outputs({"x": x})["y"]
    ref = OrtSession(str(onx.path), threads=1).outputs({"x": x})["y"]
    assert got.shape == ref.shape == (1, 1024)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_builtin_tflite_bytes_are_deterministic(tmp_path: Path) -> None:
    from edgebench.models.tflite_builtin import tflite_builtin_model

    _, a = tflite_builtin_model("mlp.tflite", tmp_path / "a")
    _, b = tflite_builtin_model("mlp.tflite", tmp_path / "b")
    assert a.read_bytes() == b.read_bytes() and a.read_bytes()[4:8] == b"TFL3"


def test_session_declares_inputs_and_how_xnnpack_placed_the_graph() -> None:
    session = LiteRtSession(str(resolve_model("builtin:mlp.tflite").path), threads=2)
    [info] = session.inputs
    assert info.name == "x" and info.shape == [None, 1024] and info.dtype == "float32"
    execution = session.execution()
    assert execution["delegate"] == "xnnpack" and execution["delegated"] == "full"
    assert execution["graph_ops"] == 3 and execution["num_threads"] == 2


def test_every_step_computes_on_the_inputs_given() -> None:
    """The step's refresh (which the harness calls before every timed run) copies the feed in: changing the
    array between timed calls changes the output, and a fresh inference on the last input matches the last
    timed one."""
    session = LiteRtSession(str(resolve_model("builtin:mlp.tflite").path), threads=1)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 1024)).astype(np.float32)
    step = session.prepare({"x": x})
    step()
    first = session.read_outputs()["y"].copy()
    x *= -2.0  # the same array object, new values
    step.refresh()
    step()
    timed = session.read_outputs()["y"]
    assert not np.allclose(timed, first)
    fresh = LiteRtSession(str(resolve_model("builtin:mlp.tflite").path), threads=1).outputs({"x": x.copy()})
    assert np.array_equal(fresh["y"], timed)


def test_dynamic_batch_is_resized() -> None:
    session = LiteRtSession(str(resolve_model("builtin:mlp.tflite").path), threads=1)
    y = session.outputs({"x": np.ones((3, 1024), np.float32)})["y"]
    assert y.shape == (3, 1024) and np.allclose(y[0], y[2])


def test_runtime_follows_the_model_file_and_refuses_the_wrong_pair(tmp_path: Path) -> None:
    tfl, onx = resolve_model("builtin:mlp.tflite"), resolve_model("builtin:mlp")
    assert runtime_of(tfl, None) == "litert" and runtime_of(onx, None) == "onnxruntime"
    assert model_file_for(tfl, "litert") == tfl.path
    with pytest.raises(ModelError, match="use --runtime litert"):
        model_file_for(tfl, "onnxruntime")
    with pytest.raises(ModelError, match="LiteRT runs .tflite models"):
        model_file_for(onx, "litert")
    bad = tmp_path / "junk.tflite"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="not a TFLite model"):
        check_model_file(bad)
