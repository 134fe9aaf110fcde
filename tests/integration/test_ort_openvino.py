"""onnxruntime's OpenVINO execution provider (onnxruntime-openvino, in the venv
scripts/install-openvino-env.sh makes) as a backend, end to end through the CLI on a `local` device whose
python is that venv's: where each node ran, with the op OpenVINO does not take (Hardmax) named and strict
mode refusing it while a model it takes whole passes; an EP the onnxruntime at hand lacks, or cannot open,
refused in one line naming the backend and where it comes from; and OpenVINO's numerics against the CPU's
fp32 at its default precision and with a bf16 hint, down to the first divergent op, all checked against
onnxruntime driven directly in the venv (no edgebench code)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from edgebench.models.refs import resolve_model
from edgebench.testing.cli import edgebench
from edgebench.testing.openvino import openvino_python

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BENCH = ["--runs", "10", "--min-seconds", "0", "--warmup", "1", "--timeout", "300", "--threads", "1"]
D = 16
OV = "OpenVINOExecutionProvider"

# onnxruntime with the OpenVINO EP on its own, run by the venv's python: each named configuration's
# outputs (null: the CPU provider alone; else the OpenVINO EP's options, the CPU provider after it)
REFERENCE = """
import json, sys
import numpy as np, onnxruntime as ort
model, inputs, out, configs = sys.argv[1:5]
feeds = dict(np.load(inputs))
saved = {}
for tag, options in json.loads(configs).items():
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    eps = ["CPUExecutionProvider"] if options is None else [("OpenVINOExecutionProvider", options), "CPUExecutionProvider"]
    sess = ort.InferenceSession(model, opts, providers=eps)
    assert options is None or "OpenVINOExecutionProvider" in sess.get_providers()
    for o, v in zip(sess.get_outputs(), sess.run(None, feeds)):
        saved[tag + "/" + o.name] = v
np.savez(out, **saved)
"""
# onnxruntime's own strict mode: no CPU fallback, so a model the EP does not take whole is refused
STRICT = """
import sys, onnxruntime as ort
opts = ort.SessionOptions()
opts.log_severity_level = 4
opts.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
try:
    ort.InferenceSession(sys.argv[1], opts, providers=[("OpenVINOExecutionProvider", {"device_type": "CPU"})])
except Exception as exc:
    print("refused: " + str(exc).splitlines()[0])
else:
    print("taken")
"""


@pytest.fixture(scope="module")
def venv_python() -> str:
    """The OpenVINO venv's python (made on the first run, from PyPI; cached after)."""
    return openvino_python()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, venv_python: str) -> Path:
    folder = tmp_path_factory.mktemp("lab")
    work = tmp_path_factory.mktemp("work")
    (folder / "ov.toml").write_text(
        f'name = "ov"\ntransport = "local"\nworkdir = "{work}"\npython = "{venv_python}"\n'
    )
    return folder


def chain(folder: Path, middle: str) -> Path:
    """MatMul, Relu, MatMul, `middle` (over the last axis), MatMul, Relu, MatMul on [1, 8, D]."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((D, D)) * 0.3).astype(np.float32), f"W{i}")
        for i in range(4)
    ]
    nodes = [
        oh.make_node("MatMul", ["x", "W0"], ["a"], name="mm1"),
        oh.make_node("Relu", ["a"], ["b"], name="relu1"),
        oh.make_node("MatMul", ["b", "W1"], ["c"], name="mm2"),
        oh.make_node(middle, ["c"], ["d"], name=middle.lower(), axis=-1),
        oh.make_node("MatMul", ["d", "W2"], ["e"], name="mm3"),
        oh.make_node("Relu", ["e"], ["f"], name="relu2"),
        oh.make_node("MatMul", ["f", "W3"], ["y"], name="mm4"),
    ]
    graph = oh.make_graph(
        nodes,
        middle.lower(),
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, D])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, D])],
        weights,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / f"{middle.lower()}.onnx"
    onnx.save(model, path)
    return path


def run_json(*argv: object, cwd: Path, code: int = 0) -> dict:
    res = edgebench(*argv, "--json", cwd=cwd)
    assert res.returncode == code, res.stderr[-3000:]
    return {**json.loads(res.stdout), "stderr": res.stderr}


def p50_of(doc: dict) -> dict:
    return next(r for r in doc["records"] if r["metric"] == "latency_ms" and r["params"].get("stat") == "p50")


def one_error(res: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert res.returncode == 1 and len(errors) == 1, res.stderr[-3000:]
    return errors[0]


def test_hardmax_falls_back_named_strict_mode_refuses_it_and_a_whole_model_passes(
    lab: Path, venv_python: str, tmp_path: Path
) -> None:
    partial, whole = chain(tmp_path, "Hardmax"), chain(tmp_path, "Softmax")
    # the reference: onnxruntime's own no-fallback mode refuses the one and takes the other
    strict = [
        subprocess.run([venv_python, "-c", STRICT, str(p)], capture_output=True, text=True, timeout=300)
        for p in (partial, whole)
    ]
    assert strict[0].stdout.startswith("refused: ") and "fallback to CPU EP" in strict[0].stdout, strict[0]
    assert strict[1].stdout.strip() == "taken", strict[1]

    store = ["--store", str(tmp_path / "s.db")]
    on_ov = ["--runtime", "onnxruntime", "--backend", "openvino", "--device", "ov", "--lab", lab, *BENCH]
    kept = run_json("bench", whole, *on_ov, *store, cwd=tmp_path)["records"]
    doc = run_json("bench", partial, *on_ov, *store, cwd=tmp_path)
    p50 = p50_of(doc)
    placement = p50["annotations"]["placement"]
    assert p50["params"]["backend"] == "openvino" and p50["annotations"]["backend_actual"] == "openvino+cpu"
    assert placement["ops_by_unit"] == {"openvino": 6, "cpu": 1}, placement
    assert placement["fallback_ops"] == ["hardmax (Hardmax)"]
    assert placement["partitions"] == 3, placement  # mm1..mm2 on OpenVINO, Hardmax on the CPU, mm3..mm4
    assert placement["precision"]["mode"] == "fp32" and placement["precision"]["device_type"] == "CPU"
    assert "asked for openvino, ran on openvino+cpu" in doc["stderr"], doc["stderr"]

    error = one_error(edgebench("bench", partial, *on_ov, "--require-backend", *store, cwd=tmp_path))
    assert "the backend is required: openvino was asked for; 1 of 7 ops ran elsewhere" in error, error
    assert "hardmax (Hardmax)" in error and "3 partitions" in error, error

    doc = run_json("bench", whole, *on_ov, "--require-backend", *store, cwd=tmp_path)
    placement = p50_of(doc)["annotations"]["placement"]
    assert placement["actual"] == "openvino" and placement["ops_by_unit"] == {"openvino": 7}, placement
    assert placement["partitions"] == 1 and placement["fallback_ops"] == []

    after = run_json("results", *store, "--run", kept[0]["run_id"], cwd=tmp_path)["records"]
    assert len(after) == len(kept)


def test_an_ep_the_onnxruntime_lacks_or_cannot_open_is_refused_never_run_on_the_cpu(
    lab: Path, tmp_path: Path
) -> None:
    model = chain(tmp_path, "Softmax")
    store = ["--store", str(tmp_path / "s.db")]
    common = ["bench", model, "--runtime", "onnxruntime", *BENCH, *store]
    # the main environment's plain onnxruntime has no OpenVINO EP
    error = one_error(edgebench(*common, "--backend", "openvino", cwd=tmp_path))
    assert "backend 'openvino' needs OpenVINOExecutionProvider, which onnxruntime" in error, error
    assert "it comes with onnxruntime-openvino (scripts/install-openvino-env.sh)" in error, error
    on_ov = ["--device", "ov", "--lab", lab]
    error = one_error(edgebench(*common, *on_ov, "--backend", "cuda", cwd=tmp_path))
    assert "backend 'cuda' needs CUDAExecutionProvider" in error and "onnxruntime-gpu" in error, error
    assert "(it has: OpenVINOExecutionProvider, CPUExecutionProvider)" in error, error
    # in the wheel, but no OpenVINO GPU here: onnxruntime drops the EP with a warning and would run on the
    # CPU alone; the session refuses, with the reason OpenVINO gave
    error = one_error(edgebench(*common, *on_ov, "--backend", "openvino-gpu", cwd=tmp_path))
    assert "did not take OpenVINOExecutionProvider for backend 'openvino-gpu'" in error, error
    assert "Device GPU is not available" in error, error
    assert run_json("results", *store, cwd=tmp_path)["records"] == []


def reference(venv: str, model: Path, x: Path, folder: Path, configs: dict) -> dict[str, np.ndarray]:
    out = folder / f"ref-{model.stem}.npz"
    res = subprocess.run(
        [venv, "-c", REFERENCE, str(model), str(x), str(out), json.dumps(configs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return dict(np.load(out))


def every_tensor(model: Path, folder: Path) -> tuple[Path, list[tuple[str, str]]]:
    """The model with each node's output made a graph output, and (node, tensor) in graph order."""
    proto = onnx.load(model)
    made = [(n.name, t) for n in proto.graph.node for t in n.output]
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(
        oh.make_tensor_value_info(t, TensorProto.FLOAT, None) for _, t in made if t not in have
    )
    path = folder / f"{model.stem}-every-tensor.onnx"
    onnx.save(proto, path)
    return path, made


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(a)), 1e-30))


def test_openvino_matches_the_cpu_in_fp32_and_its_bf16_hint_diverges_from_the_first_conv(
    lab: Path, venv_python: str, tmp_path: Path
) -> None:
    model = Path(resolve_model("builtin:convnet").path)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)
    np.savez(tmp_path / "x.npz", image=x)
    tolerance = 1e-3
    bf16 = {"device_type": "CPU", "load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "bf16"}})}
    configs = {"cpu": None, "ov": {"device_type": "CPU"}, "bf16": bf16}
    ref = reference(venv_python, model, tmp_path / "x.npz", tmp_path, configs)
    want32 = float(np.abs(ref["ov/logits"] - ref["cpu/logits"]).max())
    want16 = float(np.abs(ref["bf16/logits"] - ref["cpu/logits"]).max())
    assert want32 < 1e-5 < 1e-4 < want16, (want32, want16)

    common = ["accuracy", model, "--runtime", "onnxruntime", "--backend", "openvino", "--device", "ov"]
    common += ["--lab", lab, "--inputs", tmp_path / "x.npz", "--tolerance", tolerance, "--no-store"]
    doc = run_json(*common, cwd=tmp_path)
    got = {r["metric"]: r for r in doc["records"]}
    assert got["max_abs_err"]["value"] == pytest.approx(want32, abs=1e-6)
    assert got["max_abs_err"]["annotations"]["placement"]["precision"]["mode"] == "fp32"

    doc = run_json(*common, "--precision", "bf16", cwd=tmp_path)
    asked = {r["metric"]: r for r in doc["records"] if not r["params"].get("remedy")}
    fixed = {r["metric"]: r for r in doc["records"] if r["params"].get("remedy")}
    assert asked["max_abs_err"]["value"] == pytest.approx(want16, rel=0.02), (asked["max_abs_err"], want16)
    precision = asked["max_abs_err"]["annotations"]["placement"]["precision"]
    assert precision["mode"] == "bf16" and precision["INFERENCE_PRECISION_HINT"] == "bf16", precision
    assert fixed["max_abs_err"]["params"]["remedy"] == "precision=fp32"
    assert fixed["max_abs_err"]["annotations"]["remedy_restores"] is True
    assert fixed["max_abs_err"]["value"] == pytest.approx(want32, abs=1e-6)
    assert "(precision=fp32) restores them" in doc["stderr"], doc["stderr"]

    # per op: onnxruntime adds every intermediate tensor as an output, on OpenVINO too
    instrumented, made = every_tensor(model, tmp_path)
    ref = reference(venv_python, instrumented, tmp_path / "x.npz", tmp_path, {"cpu": None, "bf16": bf16})
    errors = {node: rel(ref[f"cpu/{t}"], ref[f"bf16/{t}"]) for node, t in made}
    first = next(node for node, _ in made if errors[node] > tolerance)
    doc = run_json(*common, "--precision", "bf16", "--per-op", cwd=tmp_path)
    found = [
        r for r in doc["records"] if r["metric"] == "first_divergent_op" and not r["params"].get("remedy")
    ]
    assert len(found) == 1 and found[0]["params"]["op"] == first, (found, first, errors)
    assert found[0]["value"] == pytest.approx(errors[first], rel=0.02)
    per_op = {
        r["params"]["op"]: r["value"]
        for r in doc["records"]
        if r["metric"] == "op_rel_error" and not r["params"].get("remedy")
    }
    assert per_op == pytest.approx(errors, rel=0.02)
    cleared = [r for r in doc["records"] if r["metric"] == "first_divergent_op" and r["params"].get("remedy")]
    assert len(cleared) == 1 and cleared[0]["params"]["op"] is None, cleared
