"""ncnn, the fourth runtime, end to end through the CLI: a model converted from ONNX by pnnx and a user's
own `.param`/`.bin` pair, benched on the host, a real ssh board and the emulated adb phone; every model
probe of a suite on it; its errors one line each, losing nothing stored; and one model on the four
runtimes side by side in one report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgebench.analysis.kernel_predict import profiled_runs
from edgebench.jobs import ncnn_weights_of
from edgebench.models.builtin import builtin_model
from edgebench.models.convert_ncnn import onnx_to_ncnn, param_graph, param_layers
from edgebench.results.store import Store
from edgebench.runtimes import runtime as runtime_named
from edgebench.testing.bare import OwnSession, bare_ncnn
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration
pytest.importorskip("ncnn", reason="ncnn is not installed (pip install -e .)")

BENCH = ["--runs", "30", "--min-seconds", "0", "--warmup", "2", "--timeout", "240", "--threads", "1"]
PINNED_OFF = ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage")


def records_of(res: subprocess.CompletedProcess[str]) -> list[dict]:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)["records"]


def own_pair(folder: Path, builtin: str, stem: str) -> Path:
    """A built-in converted by pnnx, copied under plain names as a user holds their ncnn model."""
    param = onnx_to_ncnn(builtin_model(builtin))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{stem}.param"
    shutil.copyfile(param, target)
    shutil.copyfile(ncnn_weights_of(param), ncnn_weights_of(target))
    return target


def test_bench_on_every_device_from_onnx_and_from_a_pair(
    lab_device: tuple[Path, str], tmp_path: Path
) -> None:
    lab, name = lab_device
    pair = own_pair(tmp_path / "mine", "tinymlp", "tiny")
    res = edgebench(
        "bench", "builtin:convnet", str(pair), "--runtime", "ncnn", "--device", name, "--lab", str(lab),
        *BENCH, "--json", cwd=tmp_path,
    )  # fmt: skip
    records = records_of(res)
    assert {(r["device"], r["model"], r["runtime"]) for r in records} == {
        (name, "convnet", "ncnn"),
        (name, "tiny", "ncnn"),
    }
    for model in ("convnet", "tiny"):
        got = {(r["metric"], r["params"].get("stat")): r for r in records if r["model"] == model}
        lo, p50, hi = (got[("latency_ms", s)]["value"] for s in ("min", "p50", "max"))
        assert 0 < lo <= p50 <= hi
        for metric in ("load_ms", "first_inference_ms", "peak_rss_mb"):
            assert got[(metric, None)]["value"] > 0
        p50_record = got[("latency_ms", "p50")]
        options = p50_record["annotations"]["execution"]["ncnn"]
        assert options["backend"] == "cpu" and options["threads"] == 1
        assert not any(options[o] for o in PINNED_OFF), options  # pinned whatever the CPU's default
        assert "use_winograd_convolution" in options and "use_int8_inference" in options
        assert p50_record["annotations"]["self_check"].startswith("the last timed run matches")


def test_every_model_probe_of_a_suite_runs_on_ncnn(tmp_path: Path) -> None:
    suite = tmp_path / "ncnn.toml"
    suite.write_text(
        """
name = "ncnn-probes"
devices = ["local"]
models = ["builtin:convnet"]

[[probe]]
kind = "bench"
params = { runtime = "ncnn", threads = [1, 2], runs = 30, min_seconds = 0, warmup_seconds = 0.1, cold_load = true }

[[probe]]
kind = "threads"
params = { runtime = "ncnn", threads = [1, 2], runs = 30, rounds = 1, min_seconds = 0, warmup_seconds = 0.1 }

[[probe]]
kind = "soak"
params = { runtime = "ncnn", threads = 1, minutes = 0.05 }

[[probe]]
kind = "contention"
params = { runtime = "ncnn", threads = [1], corunner_threads = [1], runs = 30, min_seconds = 0.2, warmup_seconds = 0.1 }

[[probe]]
kind = "thermal"
params = { runtime = "ncnn", threads = 1, duration_s = 3, window_s = 0.5 }
"""
    )
    res = edgebench("run", str(suite), "--store", str(tmp_path / "s.db"), "--json", cwd=tmp_path, timeout=900)
    document = json.loads(res.stdout) if res.stdout.strip() else {}
    assert res.returncode == 0, res.stderr[-3000:]
    assert document.get("errors", []) == [], document.get("errors")
    probes = {(r["probe"], r["runtime"]) for r in document["records"]}
    for probe in ("bench", "threads", "soak", "contention", "thermal"):
        assert (probe, "ncnn") in probes, probe
    cold = [r for r in document["records"] if r["metric"] == "load_ms" and r["params"].get("cache") == "cold"]
    assert cold and all(r["runtime"] == "ncnn" and r["value"] > 0 for r in cold)


def test_errors_are_one_line_name_the_file_or_layer_and_lose_nothing(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    store = tmp_path / "s.db"
    first = records_of(
        edgebench(
            "bench", "builtin:tinymlp", "--runtime", "ncnn", *BENCH, "--store", store, "--json", cwd=tmp_path
        )
    )
    kept = len(records_of(edgebench("results", "--store", store, "--json", cwd=tmp_path)))
    assert kept >= len(first)

    graph = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], axis=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "hardmax.onnx")

    mine = own_pair(tmp_path / "mine", "tinymlp", "net")
    unknown = mine.with_name("odd.param")
    unknown.write_text(
        re.sub(r"^InnerProduct(\s+)linear_", r"Mystery\1linear_", mine.read_text(), flags=re.M)
    )
    shutil.copyfile(ncnn_weights_of(mine), ncnn_weights_of(unknown))
    truncated = mine.with_name("cut.param")
    shutil.copyfile(mine, truncated)
    ncnn_weights_of(truncated).write_bytes(ncnn_weights_of(mine).read_bytes()[:1000])
    corrupt = mine.with_name("corrupt.param")
    corrupt.write_text("not a param file\n")
    ncnn_weights_of(corrupt).write_bytes(b"\0" * 8)
    lonely = tmp_path / "lonely.param"
    lonely.write_text(mine.read_text())

    cases = [
        (["hardmax.onnx", "--runtime", "ncnn"], r"hardmax\.onnx: ncnn has no layer type 'Hardmax' \(layer '"),
        ([str(unknown)], r"ncnn has no layer type 'Mystery' \(layer 'linear_\d+' in .*odd\.param\)"),
        ([str(truncated)], r"ncnn could not load the weights .*cut\.bin for .*cut\.param"),
        (
            [str(mine), "--shape", "x=1x100"],
            r"input 'x': shape \[100\] does not fit the model, made for \[256\]",
        ),
        ([str(corrupt)], r"corrupt\.param: not an ncnn param file"),
        ([str(lonely)], r"lonely\.param: the ncnn weights file lonely\.bin is missing beside it"),
    ]
    for argv, pattern in cases:
        res = edgebench("bench", *argv, *BENCH, "--store", store, cwd=tmp_path)
        assert res.returncode != 0, (argv, res.stderr)
        errors = [line for line in res.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and re.search(pattern, errors[0]), (argv, res.stderr)
        assert "Traceback" not in res.stderr and "/cache/" not in errors[0], errors[0]  # the user's names
    res = edgebench(
        "accuracy", "builtin:tinymlp", "--runtime", "ncnn", "--reference", "builtin:tinymlp", "--per-op",
        "--store", store, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2 and "--per-op: ncnn does not keep" in res.stderr, res.stderr
    after = records_of(
        edgebench("results", "--store", store, "--run", first[0]["run_id"], "--json", cwd=tmp_path)
    )
    assert len(after) == len(first)


def test_four_runtimes_side_by_side_in_one_report(tmp_path: Path) -> None:
    pytest.importorskip(
        "ai_edge_litert", reason="ai-edge-litert is not installed (scripts/install-test-deps.sh)"
    )
    store = ["--store", str(tmp_path / "s.db")]
    shape = ["--shape", "x=1x1024"]
    for runtime in ("onnxruntime", "mnn", "ncnn"):
        records_of(
            edgebench(
                "bench", "builtin:mlp", "--runtime", runtime, *shape, *BENCH, *store, "--json", cwd=tmp_path
            )
        )
        records_of(
            edgebench(
                "accuracy", "builtin:mlp", "--runtime", runtime, "--reference", "builtin:mlp", *shape, *store,
                "--json", cwd=tmp_path,
            )
        )  # fmt: skip
    records_of(edgebench("bench", "builtin:mlp.tflite", *BENCH, *store, "--json", cwd=tmp_path))
    accuracy = records_of(
        edgebench(
            "accuracy",
            "builtin:mlp.tflite",
            "--reference",
            "builtin:mlp",
            *shape,
            *store,
            "--json",
            cwd=tmp_path,
        )
    )
    assert {r["runtime"] for r in accuracy} == {"litert"}
    out = tmp_path / "r.html"
    res = edgebench("report", *store, "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    matrix = html[html.index('<table class="matrix">') :]
    matrix = matrix[: matrix.index("</table>")]  # the answer's device x model matrix
    cells = re.findall(r"<b>mlp</b><br><span class=\"cfg\">([a-z]+)</span>(.*?)</tr>", matrix, flags=re.S)
    assert sorted(runtime for runtime, _ in cells) == ["litert", "mnn", "ncnn", "onnxruntime"]
    for runtime, cell in cells:
        for label in ("p50", "mem", "load", "cosine"):
            assert f"<span>{label}</span>" in cell, (runtime, label)
        cosine = float(re.search(r"<span>cosine</span><span>([0-9.]+)</span>", cell).group(1))  # type: ignore[union-attr]
        assert cosine >= 0.99999, (runtime, cosine)  # the same weights in fp32 on all four


@pytest.mark.parametrize("builtin", ["convnet", "dwnet", "encoder"])
def test_profile_times_every_layer_and_adds_up_to_a_bare_loop(builtin: str, tmp_path: Path) -> None:
    """Per-layer times on ncnn (the wheel has no NCNN_BENCHMARK: each layer's output extracted in order):
    one record per layer of the converted graph (counted in the file), adding up to the p50 of a bare
    ncnn loop run in a session of its own beside it; a sum out of the band is taken again (a busy host)
    and must then have been flagged, and far out of it fails whatever the load."""
    param = onnx_to_ncnn(builtin_model(builtin))
    layers = [(kind, name) for kind, name in param_layers(param) if kind != "Input"]
    inputs = onnx.load(str(builtin_model(builtin)), load_external_data=False).graph.input
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.uniform(-1, 1, [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in inputs
    }
    with OwnSession() as bare_side:
        for _ in range(3):
            res = edgebench(
                "profile", f"builtin:{builtin}", "--runtime", "ncnn", "--threads", "1", "--runs", "40",
                "--json", "--store", str(tmp_path / "s.db"), cwd=tmp_path,
            )  # fmt: skip
            records = records_of(res)
            bare = bare_side.call(bare_ncnn, str(param), feeds, threads=1, runs=200).p50
            ops = [r for r in records if r["metric"] == "op_time_ms"]
            assert sorted((r["params"]["op_type"], r["params"]["node"]) for r in ops) == sorted(layers)
            assert all(r["annotations"]["outputs"] and r["annotations"]["inputs"] for r in ops)
            ratio = sum(r["value"] for r in ops) / bare
            if 0.7 <= ratio <= 1.4:
                break
    assert 0.5 <= ratio <= 2.0, ratio  # a lost layer, a wrong unit, an activation copy per layer
    if not 0.7 <= ratio <= 1.4:
        assert "per-op times add up to" in res.stderr, (ratio, res.stderr)
    # each convolution's work and weights, counted here from the ONNX model's own weights and shapes
    conv = [r for r in ops if r["params"]["op_type"].startswith("Convolution")]
    macs, weights = conv_work_in_onnx(builtin_model(builtin))
    assert sum(r["annotations"]["runtime_flops"] for r in conv) == macs  # multiply-adds, as MNN counts
    assert sum(r["annotations"]["parameter_bytes"] for r in conv) == 4 * weights
    # the kernel predictor's graph side is the profile's kernels, kind by kind and work by work, in order
    with Store(tmp_path / "s.db") as store:
        [run] = profiled_runs(store.records())
    predicted = runtime_named("ncnn").own_graph_kernels()(builtin_model(builtin), json.loads(run.shapes))
    work = lambda k: (k.op_type, k.kind, k.flops, k.weight_bytes, k.bytes)  # noqa: E731
    assert [work(k) for k in predicted] == [work(k) for k, _ in run.kernels]


def conv_work_in_onnx(path: Path) -> tuple[int, int]:
    """(multiply-adds, weights) of every Conv of an ONNX model: its weight's size once per output pixel."""
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    sizes = {t.name: numpy_helper.to_array(t).size for t in model.graph.initializer}
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.value_info}
    dims |= {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.output}
    macs = weights = 0
    for node in model.graph.node:
        if node.op_type == "Conv":
            out = dims[node.output[0]]
            macs += out[-1] * out[-2] * sizes[node.input[1]]
            weights += sizes[node.input[1]]
    return macs, weights


BUILTINS = ("mlp", "tinymlp", "batchmlp", "encoder", "convnet", "dwnet")


@pytest.mark.parametrize("builtin", BUILTINS)
def test_fp32_outputs_match_onnxruntime_on_the_builtins(builtin: str, tmp_path: Path) -> None:
    """Every built-in converted by pnnx, run on ncnn with its fp16 options off, against onnxruntime on the
    same arrays (both run here, not by edgebench): within 1e-5 of the output's scale; and `accuracy`
    reports the very difference measured here."""
    import onnxruntime as ort

    model = builtin_model(builtin)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    feeds = {
        i.name: rng.uniform(-1, 1, [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]).astype(
            np.float32
        )
        for i in session.get_inputs()
    }
    reference = session.run(None, feeds)[0]
    ours = bare_ncnn(str(onnx_to_ncnn(model)), feeds, threads=1, runs=1, warmup_s=0).outputs[0]
    error = float(np.max(np.abs(ours.ravel() - reference.ravel())))
    assert error <= 1e-5 * float(np.max(np.abs(reference))), (builtin, error)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **feeds)
    records = records_of(
        edgebench(
            "accuracy", f"builtin:{builtin}", "--runtime", "ncnn", "--reference", f"builtin:{builtin}",
            "--inputs", str(inputs), "--threads", "1", "--no-store", "--json", cwd=tmp_path,
        )
    )  # fmt: skip
    [reported] = [r["value"] for r in records if r["metric"] == "max_abs_err"]
    assert reported == pytest.approx(error, rel=1e-3, abs=1e-12)


def blobs_here(param: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """Every blob of one inference, computed here on ncnn's own API (fp16 options off), apart from edgebench."""
    import ncnn

    net = ncnn.Net()
    for name in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, name, False)
    net.opt.num_threads = 1
    net.opt.lightmode = False
    assert net.load_param(str(param)) == 0 and net.load_model(str(ncnn_weights_of(param))) == 0
    ex = net.create_extractor()
    data = np.ascontiguousarray(x[0])
    ex.input(net.input_names()[0], ncnn.Mat(data))
    return {b.name: np.array(ex.extract(b.name)[1], copy=True) for b in net.blobs()}


def test_per_op_between_two_ncnn_graphs_names_each_layer(tmp_path: Path) -> None:
    """An ncnn graph and its fp16-weights variant (same blobs): every layer's output compared, by the
    errors computed here on ncnn's API, and the first layer over the tolerance named."""
    res = edgebench(
        "variants", "builtin:convnet", "--out", str(tmp_path / "v"), "--only", "ncnn-fp32,ncnn-fp16", "--no-store",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    fp32, fp16 = tmp_path / "v" / "convnet.fp32.ncnn.param", tmp_path / "v" / "convnet.fp16.ncnn.param"
    x = np.random.default_rng(4).uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)
    np.savez(tmp_path / "in.npz", image=x)
    records = records_of(
        edgebench(
            "accuracy", str(fp16), "--reference", str(fp32), "--per-op", "--tolerance", "1e-6", "--threads", "1",
            "--inputs", str(tmp_path / "in.npz"), "--no-store", "--json", cwd=tmp_path,
        )
    )  # fmt: skip
    got = {r["params"]["op"]: r for r in records if r["metric"] == "op_rel_error"}
    layers = [layer for layer in param_graph(fp32) if layer.type != "Input"]
    assert sorted(got) == sorted(layer.name for layer in layers)
    ref, cand = blobs_here(fp32, x), blobs_here(fp16, x)
    for layer in layers:
        a, b = ref[layer.tops[0]].ravel().astype(np.float64), cand[layer.tops[0]].ravel().astype(np.float64)
        want = float(np.linalg.norm(b - a) / np.linalg.norm(a))
        assert got[layer.name]["value"] == pytest.approx(want, rel=1e-3), layer.name
        assert 0 < want < 1e-2  # fp16 weights: a small, real difference at every layer
    [first] = [r for r in records if r["metric"] == "first_divergent_op"]
    assert first["params"]["op"] == layers[0].name and first["params"]["tensor"] == layers[0].tops[0]
