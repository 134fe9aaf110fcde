"""`edgebench bench` on `local` with real onnxruntime and MNN, through the real CLI process."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

FAST = ["--runs", "400", "--min-seconds", "0", "--warmup", "1"]  # p99 needs 368 samples


def small_dynamic_model(path: Path) -> Path:
    """y = relu(x @ W) with a dynamic batch and sequence length."""
    w = helper.make_tensor(
        "w", TensorProto.FLOAT, [64, 32], np.random.default_rng(0).standard_normal(64 * 32)
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def metrics(doc: dict) -> dict[tuple[str, str | None], float]:
    return {(r["metric"], r["params"].get("stat")): r["value"] for r in doc["records"]}


@pytest.mark.parametrize("runtime", ["onnxruntime", "mnn"])
def test_bench_json_and_store(workdir: Path, runtime: str) -> None:
    res = edgebench(
        "bench",
        "builtin:convnet",
        "--device",
        "local",
        "--runtime",
        runtime,
        "--threads",
        "1",
        *FAST,
        "--json",
        cwd=workdir,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # stdout is the JSON document and nothing else, even with MNN
    got = metrics(doc)
    for stat in ("p50", "p90", "p99", "mean", "min", "max"):
        assert got[("latency_ms", stat)] > 0
    assert got[("latency_ms", "min")] <= got[("latency_ms", "p50")] <= got[("latency_ms", "p99")]
    for metric in ("import_ms", "load_ms", "first_inference_ms", "peak_rss_mb", "rss_increase_mb"):
        assert got[(metric, None)] > 0
    # the increase over the process before the model loaded leaves out the interpreter and the runtime
    assert got[("rss_increase_mb", None)] < got[("peak_rss_mb", None)]
    assert all(
        r["runtime"] == runtime and r["model"] == "convnet" and r["device"] == "local" for r in doc["records"]
    )
    assert all(r["params"]["threads"] == 1 for r in doc["records"])
    with sqlite3.connect(workdir / "edgebench.db") as db:
        [(vals,)] = db.execute("SELECT vals FROM samples WHERE metric='latency_ms'").fetchall()
        stored = db.execute("SELECT count(*) FROM records WHERE run_id=?", (doc["run_id"],)).fetchone()[0]
        fingerprint = db.execute("SELECT fingerprint FROM devices").fetchone()[0]
    samples = json.loads(vals)
    assert len(samples) >= 400
    assert np.percentile(samples, 50) == pytest.approx(got[("latency_ms", "p50")])
    assert stored == len(doc["records"])
    assert json.loads(fingerprint)["runtimes"]["onnxruntime"]


def test_results_exports_json_and_csv(workdir: Path) -> None:
    assert edgebench("bench", "builtin:convnet", *FAST, "--threads", "1", cwd=workdir).returncode == 0
    res = edgebench("results", "--json", cwd=workdir)
    assert res.returncode == 0, res.stderr
    assert {r["metric"] for r in json.loads(res.stdout)["records"]} >= {"latency_ms", "load_ms"}
    csv = edgebench("results", "--csv", cwd=workdir)
    assert (
        csv.stdout.splitlines()[0]
        == "run_id,device,probe,model,runtime,metric,value,unit,params,ts,annotations"
    )
    pq = edgebench("results", "--parquet", str(workdir / "r.parquet"), cwd=workdir)
    assert pq.returncode == 0 and (workdir / "r.parquet").stat().st_size > 0


def test_dynamic_shapes_and_p99_refusal(workdir: Path) -> None:
    model = small_dynamic_model(workdir / "dyn.onnx")
    res = edgebench(
        "bench",
        str(model),
        "--shape",
        "x=2x7x64",
        "--runs",
        "20",
        "--min-seconds",
        "0",
        "--affinity",
        "0",
        "--json",
        cwd=workdir,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert ("latency_ms", "p99") not in metrics(doc)
    assert "p99 needs at least 368 samples" in res.stderr
    assert doc["records"][0]["params"]["shapes"] == {"x": [2, 7, 64]}
    assert doc["records"][0]["params"]["affinity"] == [0]
    # Without --shape the dynamic dims default to 1, loudly.
    res = edgebench("bench", str(model), "--runs", "10", "--min-seconds", "0", "--json", cwd=workdir)
    assert res.returncode == 0 and "dimension 1 (seq) is dynamic" in res.stderr


def test_inputs_from_npz(workdir: Path) -> None:
    model = small_dynamic_model(workdir / "dyn.onnx")
    np.savez(workdir / "in.npz", x=np.ones((3, 5, 64), np.float32))
    res = edgebench(
        "bench",
        str(model),
        "--inputs",
        str(workdir / "in.npz"),
        "--runs",
        "5",
        "--min-seconds",
        "0",
        "--json",
        cwd=workdir,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["records"][0]["params"]["inputs"] == "in.npz"


def one_line_error(res: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert res.returncode == code, (res.returncode, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("edgebench: error:")]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0]


def test_bad_input_is_one_line_and_keeps_the_store(workdir: Path) -> None:
    assert (
        edgebench("bench", "builtin:convnet", "--runs", "5", "--min-seconds", "0", cwd=workdir).returncode
        == 0
    )
    before = json.loads(edgebench("results", "--all", "--json", cwd=workdir).stdout)["records"]
    (workdir / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 50)
    (workdir / "corrupt.mnn").write_bytes(b"not an mnn flatbuffer" * 10)
    (workdir / "devices").mkdir()
    one_line_error(edgebench("bench", "missing.onnx", cwd=workdir), 2, "missing.onnx", "not found")
    one_line_error(edgebench("bench", "corrupt.onnx", cwd=workdir), 2, "corrupt.onnx", "not a valid ONNX")
    one_line_error(edgebench("bench", "corrupt.mnn", "--runtime", "mnn", cwd=workdir), 2, "local", "model")
    one_line_error(edgebench("bench", "builtin:convnet", "--device", "pixel9", cwd=workdir), 2, "pixel9")
    one_line_error(edgebench("bench", "builtin:convnet", "--shape", "image=1xbad", cwd=workdir), 2, "--shape")
    one_line_error(
        edgebench("bench", "builtin:convnet", "--shape", "nope=1x3", "--runs", "2", cwd=workdir),
        2,
        "unknown input 'nope'",
    )
    (workdir / "devices" / "board.toml").write_text('transport = "ssh"\nhots = "10.0.0.2"\n')
    one_line_error(edgebench("bench", "builtin:convnet", cwd=workdir), 2, "board.toml", "hots")
    (workdir / "devices" / "board.toml").unlink()
    one_line_error(edgebench("results", "--run", "no-such-run", cwd=workdir), 2, "unknown run")
    assert json.loads(edgebench("results", "--all", "--json", cwd=workdir).stdout)["records"] == before


def test_a_built_in_model_benched_and_stored_is_on_disk_once(workdir: Path) -> None:
    """The built-in, its copy in the local device's cache and the store's kept copy are one inode
    (edgebench.files): a GB-sized GGUF measured nightly costs its bytes once."""
    import hashlib
    import os

    from edgebench.descriptors import default_local_workdir
    from edgebench.models.refs import resolve_model

    res = edgebench("bench", "builtin:convnet", "--runs", "5", "--min-seconds", "0", "--store", "s.db",
                    cwd=workdir)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    model = resolve_model("builtin:convnet").path
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    cached = Path(default_local_workdir()) / "cache" / f"{digest}.onnx"
    kept = workdir / "s.db.models" / f"{digest}.onnx"
    assert os.environ["XDG_CACHE_HOME"] in str(cached)  # the test's own cache, not the user's
    assert model.stat().st_ino == cached.stat().st_ino == kept.stat().st_ino
    assert model.stat().st_nlink >= 3
