"""ncnn's Vulkan backend on a real driver (Mesa's lavapipe), end to end through the CLI: where each layer
ran, read back from the loaded Net and checked against exact counts of the model's own .param; strict mode
refusing a model with layers ncnn has no Vulkan kernel for, naming them; the silent fallback of a machine
without a Vulkan driver recorded as the CPU; and the backend's fp16 numerics against the CPU's fp32, down to
the first divergent layer, with the fp32 remedy shown to restore them, all checked against ncnn driven
directly in the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from edgebench.jobs import ncnn_weights_of
from edgebench.models.builtin import builtin_model
from edgebench.models.convert_ncnn import onnx_to_ncnn, param_graph
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration
ncnn = pytest.importorskip("ncnn", reason="ncnn is not installed (pip install -e .)")

BENCH = ["--runs", "10", "--min-seconds", "0", "--warmup", "1", "--timeout", "300", "--threads", "1"]
NO_VULKAN = ("MatMul",)  # ncnn layers with no Vulkan kernel (layer/vulkan/ has none for them)
S, D = 16, 32


def has_vulkan_device() -> bool:
    """Whether this machine's ncnn finds a Vulkan device, asked in a child so this process keeps none."""
    code = "import ncnn, sys; sys.exit(0 if ncnn.get_gpu_count() > 0 else 3)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


@pytest.fixture(scope="module", autouse=True)
def _lavapipe() -> None:
    if not has_vulkan_device():
        pytest.fail("ncnn finds no Vulkan device: install mesa-vulkan-drivers and libvulkan1 (README)")


@pytest.fixture(scope="module")
def attention(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-attention block (MatMul, Transpose, MatMul, Softmax, MatMul, MatMul) whose two activation
    x activation products pnnx turns into ncnn MatMul layers, which have no Vulkan kernel."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((D, D)) * 0.2).astype(np.float32), "W")
    w2 = numpy_helper.from_array((rng.standard_normal((D, D)) * 0.2).astype(np.float32), "W2")
    nodes = [
        oh.make_node("MatMul", ["x", "W"], ["a"], name="proj"),
        oh.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1], name="tr"),
        oh.make_node("MatMul", ["a", "at"], ["s"], name="scores"),
        oh.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
        oh.make_node("MatMul", ["p", "a"], ["c"], name="mix"),
        oh.make_node("MatMul", ["c", "W2"], ["y"], name="out"),
    ]
    graph = oh.make_graph(
        nodes,
        "attention",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, S, D])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, S, D])],
        [w1, w2],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("attention") / "attention.onnx"
    onnx.save(model, path)
    return path


def run_json(*argv: object, cwd: Path, code: int = 0) -> dict:
    res = edgebench(*argv, "--json", cwd=cwd)
    assert res.returncode == code, res.stderr[-3000:]
    return {**json.loads(res.stdout), "stderr": res.stderr}  # warnings are said on stderr


def p50_of(doc: dict) -> dict:
    return next(r for r in doc["records"] if r["metric"] == "latency_ms" and r["params"].get("stat") == "p50")


def declared(param: Path) -> tuple[int, list[str]]:
    """The exact reference: the layers the .param declares (its header's count, less its Input layers),
    and the names of its layers of a type ncnn has no Vulkan kernel for, in the file's order."""
    header = param.read_text().splitlines()[1].split()
    layers = param_graph(param)
    assert int(header[0]) == len(layers)
    ops = [x for x in layers if x.type != "Input"]  # an Input layer computes nothing: not an op
    return len(ops), [f"{x.name} ({x.type})" for x in ops if x.type in NO_VULKAN]


def test_partial_model_names_its_cpu_layers_and_strict_mode_refuses_it(
    attention: Path, tmp_path: Path
) -> None:
    store = ["--store", str(tmp_path / "s.db")]
    kept = run_json("bench", "builtin:tinymlp", "--runtime", "ncnn", *BENCH, *store, cwd=tmp_path)["records"]
    total, on_cpu = declared(onnx_to_ncnn(attention))
    assert len(on_cpu) == 2, on_cpu

    doc = run_json(
        "bench", attention, "--runtime", "ncnn", "--backend", "vulkan", *BENCH, *store, cwd=tmp_path
    )
    p50 = p50_of(doc)
    placement = p50["annotations"]["placement"]
    assert p50["params"]["backend"] == "vulkan" and p50["annotations"]["backend_actual"] == "vulkan+cpu"
    assert placement["ops_by_unit"] == {"vulkan": total - 2, "cpu": 2}, placement
    assert placement["fallback_ops"] == on_cpu
    # input..proj on Vulkan, the scores product on the CPU, softmax back, the mix on the CPU, out on Vulkan
    assert placement["partitions"] == 5, placement
    assert placement["precision"]["mode"] in ("fp16", "fp16-storage"), placement["precision"]
    assert "asked for vulkan, ran on vulkan+cpu" in doc["stderr"], doc["stderr"]

    res = edgebench(
        "bench", attention, "--runtime", "ncnn", "--backend", "vulkan", "--require-backend", *BENCH, *store,
        cwd=tmp_path,
    )  # fmt: skip
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert res.returncode == 1 and len(errors) == 1, res.stderr
    assert "the backend is required: vulkan was asked for; 2 of" in errors[0], errors[0]
    assert all(op.split(" ")[0] in errors[0] for op in on_cpu), errors[0]
    with Store(tmp_path / "s.db") as kept_store:
        failed = [e for e in kept_store.errors() if e["model"] == "attention"]
    assert [e["kind"] for e in failed] == ["backend"], failed

    res = edgebench(
        "bench", attention, "--runtime", "ncnn", "--backend", "cuda", *BENCH, *store, cwd=tmp_path
    )
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert res.returncode != 0 and len(errors) == 1, res.stderr
    assert "backend: ncnn has no backend 'cuda' (it has: cpu, vulkan)" in errors[0], errors[0]

    after = run_json("results", *store, "--run", kept[0]["run_id"], cwd=tmp_path)["records"]
    assert len(after) == len(kept)

    res = edgebench("report", *store, "--out", tmp_path / "r.html", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "r.html").read_text()
    section = page[page.index('<section id="placement"') :]
    section = section[: section.index("</section>")]
    assert 'data-state="data"' in section and section.count("<tr>") == 2, section  # heading + the one run
    assert "vulkan+cpu" in section and "not wholly on it" in section and "5</td>" in section
    assert all(op.split(" ")[0] in section for op in on_cpu), section
    assert f"{total - 2} vulkan, 2 cpu" in section, section

    # fit's row for the Vulkan run names what left it (and the CPU's tinymlp row says nothing of it)
    doc = run_json("fit", *store, "--budget", "latency_p50_ms=100000", "--no-store", cwd=tmp_path)
    rows = {
        (r["model"], r["runtime"]): r["annotations"]["why"] for r in doc["records"] if r["metric"] == "fits"
    }
    why = rows[("attention", "ncnn@vulkan")]
    assert f"partly on vulkan, 2 of {total} ops elsewhere" in why and on_cpu[0] in why, rows
    assert "placement" not in rows[("tinymlp", "ncnn")], rows


def test_a_model_wholly_on_vulkan_passes_strict_mode(tmp_path: Path) -> None:
    param = onnx_to_ncnn(builtin_model("convnet"))
    total, on_cpu = declared(param)
    assert on_cpu == []
    doc = run_json(
        "bench", "builtin:convnet", "--runtime", "ncnn", "--backend", "vulkan", "--require-backend", *BENCH,
        "--no-store", cwd=tmp_path,
    )  # fmt: skip
    placement = p50_of(doc)["annotations"]["placement"]
    assert placement["actual"] == "vulkan" and placement["ops_by_unit"] == {"vulkan": total}, placement
    assert placement["partitions"] == 1 and placement["fallback_ops"] == []
    assert "llvmpipe" in placement["evidence"], placement["evidence"]


def test_no_vulkan_driver_is_recorded_as_cpu_never_as_vulkan(tmp_path: Path) -> None:
    hidden = {"VK_ICD_FILENAMES": str(tmp_path / "none.json")}
    # the reference: ncnn itself, in a process with that environment, finds no device and says nothing
    probe = subprocess.run(
        [sys.executable, "-c", "import ncnn; print(ncnn.get_gpu_count())"],
        env={**os.environ, **hidden},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.stdout.strip() == "0", probe
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "nogpu.toml").write_text(
        f'name = "nogpu"\ntransport = "local"\nworkdir = "{tmp_path / "work"}"\n'
        f'env = {{VK_ICD_FILENAMES = "{hidden["VK_ICD_FILENAMES"]}"}}\n'
    )
    common = (
        "builtin:convnet",
        "--runtime",
        "ncnn",
        "--backend",
        "vulkan",
        "--device",
        "nogpu",
        "--lab",
        lab,
    )
    store = ["--store", str(tmp_path / "s.db")]
    doc = run_json("bench", *common, *BENCH, *store, cwd=tmp_path)
    p50 = p50_of(doc)
    assert p50["annotations"]["backend_actual"] == "cpu", p50["annotations"]
    assert "0 Vulkan devices" in p50["annotations"]["placement"]["evidence"]
    # fit does not answer for Vulkan from a run on the CPU, however generous the budget
    res = edgebench("fit", *store, "--budget", "latency_p50_ms=100000", "--json", "--no-store", cwd=tmp_path)
    (row,) = [r for r in json.loads(res.stdout)["records"] if r["metric"] == "fits"]
    assert row["runtime"] == "ncnn@vulkan" and row["annotations"]["verdict"] == "uncertain", row
    assert "vulkan asked for, ran on cpu" in row["annotations"]["why"], row
    res = edgebench("bench", *common, "--require-backend", *BENCH, "--no-store", cwd=tmp_path)
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert res.returncode == 1 and len(errors) == 1 and "ran on cpu" in errors[0], res.stderr


def direct_blobs(param: Path, x: np.ndarray, vulkan: bool, fp16: bool | None) -> dict[str, np.ndarray]:
    """Every blob of the graph computed by ncnn driven directly (no edgebench code), on the CPU in fp32 or
    on Vulkan at its default precision (fp16: None) or with fp16 off."""
    net = ncnn.Net()
    net.opt.num_threads = 1
    if vulkan:
        net.opt.use_vulkan_compute = True
        net.set_vulkan_device(0)
    if fp16 is not None:
        for name in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
            setattr(net.opt, name, fp16)
    assert net.load_param(str(param)) == 0 and net.load_model(str(ncnn_weights_of(param))) == 0
    ex = net.create_extractor()
    ex.input(net.input_names()[0], ncnn.Mat(np.ascontiguousarray(x[0])).clone())
    blobs = {}
    for layer in param_graph(param):
        for top in layer.tops:
            rc, mat = ex.extract(top)
            assert rc == 0, top
            blobs[top] = np.array(mat).copy()
    return blobs


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))


def test_vulkan_fp16_numerics_name_the_first_divergent_layer_and_fp32_restores_them(
    attention: Path, tmp_path: Path
) -> None:
    x = np.random.default_rng(1).standard_normal((1, S, D)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    tolerance = 5e-4
    doc = run_json(
        "accuracy", attention, "--runtime", "ncnn", "--backend", "vulkan", "--per-op", "--inputs",
        tmp_path / "x.npz", "--tolerance", tolerance, "--no-store", cwd=tmp_path,
    )  # fmt: skip
    records = doc["records"]
    asked = {r["metric"]: r for r in records if r["params"].get("output") and not r["params"].get("remedy")}
    fixed = {r["metric"]: r for r in records if r["params"].get("output") and r["params"].get("remedy")}

    param = onnx_to_ncnn(attention)
    cpu = direct_blobs(param, x, vulkan=False, fp16=False)
    gpu = direct_blobs(param, x, vulkan=True, fp16=None)
    gpu32 = direct_blobs(param, x, vulkan=True, fp16=False)
    out = param_graph(param)[-1].tops[0]
    want = float(np.abs(gpu[out] - cpu[out]).max())
    assert want > 1e-4  # lavapipe's fp16 moves the output
    assert asked["max_abs_err"]["value"] == pytest.approx(want, rel=0.05), (asked["max_abs_err"], want)
    assert asked["max_abs_err"]["annotations"]["placement"]["precision"]["mode"] != "fp32"

    first = next(
        layer.name for layer in param_graph(param) if any(rel(cpu[t], gpu[t]) > tolerance for t in layer.tops)
    )
    found = [r for r in records if r["metric"] == "first_divergent_op" and not r["params"].get("remedy")]
    assert len(found) == 1 and found[0]["params"]["op"] == first, (found, first)

    assert fixed["max_abs_err"]["params"]["remedy"] == "precision=fp32"
    assert fixed["max_abs_err"]["annotations"]["remedy_restores"] is True
    assert fixed["max_abs_err"]["annotations"]["placement"]["precision"]["mode"] == "fp32"
    assert fixed["max_abs_err"]["value"] == pytest.approx(
        float(np.abs(gpu32[out] - cpu[out]).max()), abs=1e-6
    )
    assert fixed["max_abs_err"]["value"] < want / 100
    assert "(precision=fp32) restores them" in doc["stderr"], doc["stderr"]


def test_the_gate_fails_a_candidate_whose_model_left_the_backend(tmp_path: Path) -> None:
    """The night a phone's GPU driver went missing: the same device and model, the baseline on Vulkan,
    the candidate silently on the CPU. The latency may even look fine; the gate says where it ran."""
    store = ["--store", str(tmp_path / "s.db")]
    runs = []
    for lab, env in (("before", ""), ("after", f'env = {{VK_ICD_FILENAMES = "{tmp_path / "none.json"}"}}\n')):
        (tmp_path / lab).mkdir()
        (tmp_path / lab / "phone.toml").write_text(
            f'name = "phone"\ntransport = "local"\nworkdir = "{tmp_path / lab / "work"}"\n{env}'
        )
        doc = run_json(
            "bench", "builtin:convnet", "--runtime", "ncnn", "--backend", "vulkan", "--device", "phone",
            "--lab", tmp_path / lab, *BENCH, *store, cwd=tmp_path,
        )  # fmt: skip
        runs.append(doc["records"][0]["run_id"])
    res = edgebench(
        "gate", "--baseline", runs[0], "--candidate", runs[1], *store, "--max-slowdown", "10000%", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-2000:]
    verdict = json.loads(res.stdout)
    placed = [p for p in verdict["pairs"] if p["metric"] == "placement"]
    assert len(placed) == 1 and placed[0]["verdict"] == "FAIL", placed
    assert placed[0]["baseline"] == 1.0 and placed[0]["candidate"] == 0.0
    assert "ran on vulkan" in placed[0]["reason"] and "now on cpu" in placed[0]["reason"], placed[0]
