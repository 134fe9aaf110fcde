"""The invocation-level gate on real runs: a two-model suite with `repeats = 3` on the local device, run
twice with the same models (no FAIL), then with one model 15% heavier under the same name (FAIL or NOISY,
never PASS); and `bench --repeats` on a real ssh board, whose agent reads the board's /proc for the
disturbance figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgebench.results.store import Store
from edgebench.testing.cli import edgebench
from edgebench.testing.sshd import SshBoard

pytestmark = pytest.mark.integration

LAYERS, WIDTH, BATCH = 20, 192, 32


def mlp(path: Path, layers: int) -> Path:
    """A chain of `layers` MatMul+Relu of WIDTH x WIDTH: the work grows with `layers`, nothing else."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(layers)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
        ]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, WIDTH])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [BATCH, WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


SUITE = """name = "inv"
devices = ["local"]
models = [{{name = "enc", path = "{enc}"}}, {{name = "dec", path = "{dec}"}}]
[[probe]]
kind = "bench"
params = {{ threads = 1, runs = 30, warmup = 1, warmup_seconds = 0.1, min_seconds = 0.3, repeats = 3 }}
[[gate]]
metric = "latency_ms"
stat = "p50"
probe = "bench"
max_slowdown = "5%"
"""


def run(suite: Path, store: Path, cwd: Path) -> str:
    res = edgebench("run", suite, "--store", store, "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["run_id"])


def gate(store: Path, base: str, cand: str, suite: Path, cwd: Path) -> dict:  # type: ignore[type-arg]
    res = edgebench(
        "gate", "--store", store, "--baseline", base, "--candidate", cand, "--suite", suite, "--json", cwd=cwd
    )
    assert res.returncode in (0, 1), res.stderr
    assert "Traceback" not in res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def test_same_models_never_fail_and_a_heavier_one_never_passes(tmp_path: Path) -> None:
    enc, dec = mlp(tmp_path / "enc.onnx", LAYERS), mlp(tmp_path / "dec.onnx", LAYERS // 2)
    suite = tmp_path / "inv.toml"
    suite.write_text(SUITE.format(enc=enc, dec=dec))
    store = tmp_path / "s.db"
    first, second = run(suite, store, tmp_path), run(suite, store, tmp_path)
    with Store(store) as st:
        jobs = st.jobs([first])
        records = st.records([first])
    # Round-robin: enc1 dec1 enc2 dec2 enc3 dec3, each a job of its own (a fresh agent process).
    order = [
        (j["model"], json.loads(j["params"]) if isinstance(j["params"], str) else j["params"]) for j in jobs
    ]
    assert [m for m, _ in order] == ["enc", "dec"] * 3, order
    p50 = [r for r in records if r.metric == "latency_ms" and r.params.get("stat") == "p50"]
    assert sorted((r.model, r.annotations["invocation"]) for r in p50) == sorted(
        (m, i) for m in ("enc", "dec") for i in (1, 2, 3)
    )
    shares = [r for r in records if r.metric == "disturbance_others_cpu_share"]
    assert len(shares) == 6 and all(0.0 <= (r.value or 0.0) <= 1.0 for r in shares)
    same = gate(store, first, second, suite, tmp_path)
    bench = [p for p in same["pairs"] if p["metric"] == "latency_ms"]
    assert bench and all(p["verdict"] != "FAIL" for p in bench), [(p["model"], p["reason"]) for p in bench]
    assert all("3 vs 3 invocations" in p["method"] for p in bench if p["method"].startswith("welch"))
    # The same name, 15% more work: FAIL, or NOISY where the host was too disturbed to tell; never PASS.
    mlp(enc, LAYERS + 3)
    third = run(suite, store, tmp_path)
    heavier = gate(store, second, third, suite, tmp_path)
    enc_p50 = [p for p in heavier["pairs"] if p["model"] == "enc" and p.get("stat") == "p50"]
    assert enc_p50 and all(p["verdict"] in ("FAIL", "NOISY") for p in enc_p50), enc_p50
    for p in enc_p50:
        print(f"15% heavier enc: {p['verdict']} {p['change']:+.1%}: {p['reason']}")


def test_bench_repeats_on_an_ssh_board_reads_the_boards_proc(ssh_board: SshBoard, tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    res = edgebench(
        "bench", "builtin:mlp", "--device", "board", "--lab", ssh_board.lab_dir, "--repeats", "2",
        "--runs", "20", "--min-seconds", "0", "--warmup", "1", "--timeout", "120",
        "--store", store, "--json", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)["records"]
    p50 = [r for r in records if r["metric"] == "latency_ms" and r["params"].get("stat") == "p50"]
    assert sorted(r["annotations"]["invocation"] for r in p50) == [1, 2]
    shares = {r["metric"]: r["value"] for r in records if r["metric"].startswith("disturbance_")}
    assert 0.0 <= shares["disturbance_others_cpu_share"] <= 1.0
    assert 0.0 <= shares["disturbance_runqueue_wait_share"] <= 1.0
    shown = edgebench("results", "--store", store, cwd=tmp_path)
    assert shown.returncode == 0 and "disturbance_others_cpu_share" in shown.stdout
