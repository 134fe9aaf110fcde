"""`gate --confirm` through the real CLI on the local host, a real ssh board and the emulated adb phone.

The model file is replaced on disk after each run, so the confirmation can only have measured the store's
kept copies: the confirm run's records name the content they measured (`model_sha256`), checked against
hashlib on the bytes each run benched. A 2x heavier build (twice the MatMul layers) must be confirmed FAIL,
its Hodges-Lehmann ratio within bounds of an independent reference: both builds timed in-process by
onnxruntime, alternately, in the same test. An unchanged model whose candidate run was disturbed (its
stored samples doubled, so the first stage says FAIL) must not be FAIL once confirmed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from edgebench.testing.cli import edgebench
from edgebench.testing.pytest_adb import AdbPhoneLab
from edgebench.testing.sshd import SshBoard
from tests.integration.test_gate_cli import mlp

pytestmark = pytest.mark.integration

WIDTH, LAYERS = 256, 6
FAST = ["--threads", "1", "--runs", "30", "--warmup", "1", "--warmup-seconds", "0", "--min-seconds", "0"]
CONFIRM = ["--confirm", "--confirm-pairs", "20", "--confirm-budget", "240"]  # more pairs under load


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reference_ratio(light: Path, heavy: Path, rounds: int = 9) -> float:
    """Heavy/light median CPU time, in-process onnxruntime on one thread, the two alternated per round."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sessions = [
        ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for p in (light, heavy)
    ]
    width = int(sessions[0].get_inputs()[0].shape[1])
    x = np.random.default_rng(0).standard_normal((16, width)).astype(np.float32)
    ratios = []
    for _ in range(rounds):
        times = []
        for s in sessions:
            s.run(None, {"x": x})
            t0 = time.process_time()  # CPU time: what a neighbour takes is not counted
            for _ in range(20):
                s.run(None, {"x": x})
            times.append(time.process_time() - t0)
        ratios.append(times[1] / times[0])
    return float(np.median(ratios))


def bench(cwd: Path, device: str, lab: Path, *models: Path) -> str:
    res = edgebench(
        "bench", *models, "--device", device, "--lab", lab, *FAST, "--store", "s.db", "--json", cwd=cwd
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["run_id"]


def gate(cwd: Path, lab: Path, base: str, cand: str, *extra: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    res = edgebench(
        "gate",
        "--baseline",
        base,
        "--candidate",
        cand,
        "--store",
        "s.db",
        "--lab",
        lab,
        *extra,
        "--json",
        cwd=cwd,
    )
    return res.returncode, json.loads(res.stdout) if res.stdout.strip() else {}, res.stderr


def latency(doc: dict, model: str) -> dict:  # type: ignore[type-arg]
    [pair] = [p for p in doc["pairs"] if p["model"] == model and p["metric"] == "latency_ms"]
    return pair


def measured_contents(cwd: Path, run_id: str, model: str) -> dict[str, set[str]]:
    """The contents (sha256) the confirm run measured per side, from its stored record annotations."""
    out: dict[str, set[str]] = {}
    with sqlite3.connect(cwd / "s.db") as db:
        for (ann,) in db.execute(
            "SELECT annotations FROM records WHERE run_id=? AND model=?", (run_id, model)
        ):
            a = json.loads(ann)
            out.setdefault(a["confirm_side"], set()).add(a["model_sha256"])
    return out


def double_candidate_samples(cwd: Path, run_id: str, model: str) -> None:
    """A disturbed candidate run: its stored latencies of this model twice what they were."""
    with sqlite3.connect(cwd / "s.db") as db:
        rows = db.execute(
            "SELECT id, vals FROM samples WHERE run_id=? AND model=? AND metric='latency_ms'", (run_id, model)
        ).fetchall()
        for row_id, vals in rows:
            db.execute(
                "UPDATE samples SET vals=? WHERE id=?",
                (json.dumps([2 * v for v in json.loads(vals)]), row_id),
            )
        db.execute(
            "UPDATE records SET value = 2 * value WHERE run_id=? AND model=? AND metric='latency_ms'",
            (run_id, model),
        )


def heavier_confirmed(cwd: Path, device: str, lab: Path) -> None:
    """Bench net.onnx, replace it by a 2x heavier build, bench again, spoil the file, gate --confirm."""
    model = mlp(cwd / "net.onnx", WIDTH, LAYERS)
    light_sha = sha(model)
    shutil.copy(model, cwd / "light.onnx")
    base = bench(cwd, device, lab, model)
    mlp(model, WIDTH, 2 * LAYERS)
    heavy_sha = sha(model)
    shutil.copy(model, cwd / "heavy.onnx")
    cand = bench(cwd, device, lab, model)
    model.write_bytes(b"not a model any more")  # whatever is on disk now, the kept copies are measured
    # alpha 0.05: the first of two looks comes at 6 pairs (8 at 0.01, as the local test shows); the
    # transport is what is tested
    code, doc, err = gate(cwd, lab, base, cand, *CONFIRM, "--alpha", "0.05")
    assert code == 1, (err, doc.get("pairs"))
    pair = latency(doc, "net")
    assert pair["verdict"] == "FAIL" and pair["method"].startswith("confirm:"), pair
    assert "alternated pairs" in pair["reason"] and pair["q_value"] is None
    [ev] = [c for c in doc["confirmations"] if c["model"] == "net" and c["metric"] == "latency_ms"]
    ratio = ev["confirmed"]["ratio"]
    assert ev["confirmed"]["pairs"] >= 6 and ev["confirmed"]["ci_low"] > 0.05
    reference = reference_ratio(cwd / "light.onnx", cwd / "heavy.onnx")
    assert 1.3 < reference < 3.0, reference
    assert reference / 1.5 < ratio < reference * 1.5, (ratio, reference)
    assert measured_contents(cwd, doc["confirm_run"], "net") == {
        "baseline": {light_sha},
        "candidate": {heavy_sha},
    }
    runs = edgebench("runs", "--store", "s.db", "--json", cwd=cwd)
    kinds = {r["run_id"]: r["kind"] for r in json.loads(runs.stdout)["runs"]}
    assert kinds[doc["confirm_run"]] == "confirm"
    (cwd / "empty-lab").mkdir()  # a lab without the device: one line naming it, exit 2, nothing lost
    code, _, err = gate(cwd, cwd / "empty-lab", base, cand, *CONFIRM)
    assert code == 2 and err.count("\n") == 1 and f"unknown device '{device}'" in err, err
    again = edgebench("runs", "--store", "s.db", "--json", cwd=cwd)
    assert {r["run_id"] for r in json.loads(again.stdout)["runs"]} == set(kinds)


def test_confirm_on_local_fails_the_heavier_build_and_clears_a_disturbed_run(tmp_path: Path) -> None:
    lab = tmp_path / "devices"  # local needs no descriptor
    light = mlp(tmp_path / "net.onnx", WIDTH, LAYERS)
    same = mlp(tmp_path / "same.onnx", WIDTH, LAYERS)
    light_sha = sha(light)
    base = bench(tmp_path, "local", lab, light, same)
    mlp(light, WIDTH, 2 * LAYERS)
    heavy_sha = sha(light)
    cand = bench(tmp_path, "local", lab, light, same)
    double_candidate_samples(tmp_path, cand, "same")
    light.write_bytes(b"replaced on disk after the runs")
    code, first, err = gate(tmp_path, lab, base, cand, "--no-store")
    # one invocation per side: stage one cannot FAIL the disturbed run, it says NOISY and --confirm decides
    assert code == 0 and latency(first, "same")["verdict"] == "NOISY", err
    assert latency(first, "net")["verdict"] == "NOISY", first
    start = time.monotonic()
    code, doc, err = gate(tmp_path, lab, base, cand, *CONFIRM, "--junit", "g.xml", "--markdown", "g.md")
    took = time.monotonic() - start
    assert code == 1, err
    heavy, unchanged = latency(doc, "net"), latency(doc, "same")
    assert heavy["verdict"] == "FAIL" and heavy["method"].startswith("confirm:"), heavy
    assert unchanged["verdict"] in ("PASS", "NOISY") and "first stage: NOISY" in unchanged["reason"], (
        unchanged
    )
    assert measured_contents(tmp_path, doc["confirm_run"], "net") == {
        "baseline": {light_sha},
        "candidate": {heavy_sha},
    }
    for text in ((tmp_path / "g.xml").read_text(), (tmp_path / "g.md").read_text()):
        assert "alternated pairs" in text and "HL ratio" in text
    stored = edgebench("runs", "--store", "s.db", "--json", cwd=tmp_path)
    gate_run = json.loads(stored.stdout)["runs"][-1]
    assert gate_run["kind"] == "gate", gate_run
    print(f"local --confirm took {took:.1f} s: {heavy['reason']} | {unchanged['reason']}")
    bad = edgebench(
        "gate",
        "--baseline",
        base,
        "--candidate",
        cand,
        "--store",
        "s.db",
        "--confirm",
        "--confirm-pairs",
        "3",
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--confirm-pairs 3" in bad.stderr, (
        bad.stderr
    )


def test_confirm_on_an_ssh_board(ssh_board: SshBoard, tmp_path: Path) -> None:
    heavier_confirmed(tmp_path, ssh_board.name, ssh_board.lab_dir)


def test_confirm_on_the_emulated_phone(adb_phone: AdbPhoneLab, tmp_path: Path) -> None:
    heavier_confirmed(tmp_path, adb_phone.device_name, adb_phone.lab_dir)
