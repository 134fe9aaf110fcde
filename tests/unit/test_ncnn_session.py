"""The agent's ncnn session on a real converted model: the arrays its Mats wrap stay alive for as long as
the step (an `ncnn.Mat` does not own a numpy array's memory), the options it pins are the options the Net
ran with, and a declared shape is the only one it takes."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgebench.agent.inputs import InputError, make_inputs
from edgebench.agent.session_ncnn import OPTION_NAMES, NcnnSession
from edgebench.models.builtin import builtin_model
from edgebench.models.convert_ncnn import onnx_to_ncnn
from edgebench.models.kernel_samples import sample_model

pytest.importorskip("ncnn")


def test_a_step_keeps_the_arrays_its_mats_wrap() -> None:
    model = builtin_model("convnet")
    session = NcnnSession(str(onnx_to_ncnn(model)), threads=1)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 112, 112))
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"image": x.astype(np.float32)}
    )[0]
    # a float64, non-contiguous view: the session's own float32 copy is all that holds the data
    step = session.prepare({"image": np.asfortranarray(x)})
    del x
    gc.collect()
    np.zeros((1 << 22,), np.float32).fill(7.0)  # reuse freed memory, as a temporary's would be
    for _ in range(3):
        step()
        got = step.outputs()["logits"]
        assert np.max(np.abs(got.ravel() - want.ravel())) <= 1e-5 * np.max(np.abs(want))


def test_the_options_pinned_are_the_nets() -> None:
    session = NcnnSession(str(onnx_to_ncnn(builtin_model("tinymlp"))), threads=2, fp16=True, winograd=False)
    opt = session.net.opt
    recorded = session.execution()["ncnn"]
    assert recorded["threads"] == opt.num_threads == 2
    for name in OPTION_NAMES:
        assert recorded[name] == bool(getattr(opt, name)), name
    assert recorded["use_fp16_arithmetic"] and not recorded["use_winograd_convolution"]
    assert not recorded["use_bf16_storage"]


def test_a_converted_graph_takes_its_shape_with_or_without_the_batch_axis() -> None:
    session = NcnnSession(str(onnx_to_ncnn(builtin_model("tinymlp"))), threads=1)
    [info] = session.inputs
    assert info.shape == [256] and info.fixed and not info.batch_axis
    assert make_inputs(session.inputs, {"x": [1, 256]}, 0, None, [])["x"].shape == (256,)
    assert make_inputs(session.inputs, {"x": [256]}, 0, None, [])["x"].shape == (256,)
    with pytest.raises(
        InputError, match=r"input 'x': shape \[512\] does not fit the model, made for \[256\]"
    ):
        make_inputs(session.inputs, {"x": [1, 512]}, 0, None, [])


def test_an_in_place_layer_on_a_graph_input_neither_crashes_nor_changes_the_input(tmp_path: Path) -> None:
    """A LayerNorm (in place in ncnn) reading the graph's input: on a Mat wrapping a numpy array ncnn
    1.0.20261020 dereferences the Mat's missing reference count (SIGSEGV); the session's own Mats make ncnn
    copy the input first. Run in a process of its own, so a crash fails this test, not the suite."""
    _, model = sample_model("kernel:norm,s=64,d=128")
    x = np.random.default_rng(3).uniform(-1, 1, (1, 64, 128)).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(
        f"""
        import numpy as np
        from edgebench.agent.session_ncnn import NcnnSession
        x = np.load({str(tmp_path / "x.npy")!r})
        session = NcnnSession({str(onnx_to_ncnn(model))!r}, threads=1)
        step = session.prepare({{"x": x}})
        outs = []
        for _ in range(3):
            step()
            outs.append(step.outputs()["y"])
        np.save({str(tmp_path / "y.npy")!r}, np.stack(outs))
        np.save({str(tmp_path / "after.npy")!r}, x)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    outs = np.load(tmp_path / "y.npy")
    assert np.array_equal(np.load(tmp_path / "after.npy"), x)  # the caller's input untouched
    assert np.array_equal(outs[0], outs[2])  # every run read the same input
    assert np.max(np.abs(outs[0].ravel() - want.ravel())) <= 1e-5 * np.max(np.abs(want))


LSTM_AS_PNNX_WROTE_IT = """7767517
7 8
Input in0 0 1 x 0=32 1=1
Input in1 0 1 h0 0=32 1=1
Input in2 0 1 c0 0=32 1=1
MemoryData w 0 1 3 0=32 1=128 2=1
MemoryData r 0 1 4 0=32 1=128 2=1
MemoryData b 0 1 5 0=256 1=1
LSTM LSTM_0 6 2 x 3 4 5 h0 c0 6 y
"""


def test_a_layer_ncnn_refuses_is_named_on_the_agent_and_on_the_host(tmp_path: Path) -> None:
    """A known layer type whose params ncnn's layer refuses (pnnx's ONNX LSTM with its initial states as
    inputs): the agent names the layer and the file as the user gave it; the host refuses the conversion
    naming the ONNX file and the layer, before anything is pushed."""
    import ncnn

    from edgebench.agent.session_ncnn import load_param
    from edgebench.errors import ModelError

    param = tmp_path / "lstm.param"
    param.write_text(LSTM_AS_PNNX_WROTE_IT)
    said = load_param(ncnn.Net(), str(param), "lstm.param")
    assert said is not None and "layer 'LSTM_0' (LSTM) of lstm.param" in said, said
    good = onnx_to_ncnn(builtin_model("tinymlp"))
    assert load_param(ncnn.Net(), str(good)) is None
    _, model = sample_model("kernel:lstm,i=32,h=32,s=1")
    with pytest.raises(ModelError, match=r"lstm.*\.onnx: ncnn could not load layer 'LSTM_0' \(LSTM\)") as err:
        onnx_to_ncnn(model)
    assert "\n" not in str(err.value)


def _without_input_shapes(param: Path, folder: Path, name: str) -> Path:
    """A user's own graph: the converted one with its Input layers' shapes taken out, beside its weights."""
    lines = [
        " ".join(f for f in line.split() if "=" not in f) if line.startswith("Input ") else line
        for line in param.read_text().splitlines()
    ]
    out = folder / f"{name}.param"
    out.write_text("\n".join(lines) + "\n")
    (folder / f"{name}.bin").write_bytes(param.with_suffix(".bin").read_bytes())
    return out


@pytest.mark.parametrize(
    ("model", "good", "bad", "said"),
    [
        (
            "convnet",
            [1, 3, 64, 64],
            [1, 4, 112, 112],
            r"gives 4 channels, but layer 'convrelu_0' \(Convolution\)",
        ),
        (
            "dwnet",
            [1, 3, 32, 32],
            [1, 8, 32, 32],
            r"gives 8 channels, but layer '\S+' \(Convolution\) .* takes 3",
        ),
        ("tinymlp", [1, 256], [1, 100], r"gives 100 values, but layer '\S+' \(InnerProduct\) .* takes 256"),
    ],
)
def test_a_graph_without_input_shapes_refuses_a_shape_its_first_layers_cannot_take(
    tmp_path: Path, model: str, good: list[int], bad: list[int], said: str
) -> None:
    """ncnn runs a convolution over 4 channels with weights for 3 without a word (reading past them): the
    session refuses it from the weights' sizes, for a shape given and for an inputs file alike."""
    param = _without_input_shapes(onnx_to_ncnn(builtin_model(model)), tmp_path, model)
    session = NcnnSession(str(param), threads=1)
    [info] = session.inputs
    assert not info.fixed and info.demands
    feeds = make_inputs(session.inputs, {info.name: good}, 0, None, [])
    session.outputs(feeds)  # the right shape runs
    with pytest.raises(InputError, match=said):
        make_inputs(session.inputs, {info.name: bad}, 0, None, [])
    np.savez(tmp_path / "in.npz", **{info.name: np.zeros(bad, np.float32)})
    with pytest.raises(InputError, match=said):
        make_inputs(session.inputs, {}, 0, str(tmp_path / "in.npz"), [])
