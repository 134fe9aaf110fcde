"""Soak and contention with short durations, on the host, through the CLI; the co-runner leaves no process
behind, even when the agent is killed under it."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgebench.agent.contention import MARK
from edgebench.models.refs import resolve_model
from edgebench.testing.bare import OwnSession, bare_onnxruntime_slowdown
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration


def corunners(token: str | None = None) -> list[int]:
    """Pids of live co-runner processes (by the mark in their argv), optionally of one run's token."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if MARK.encode() in argv and state != "Z" and (token is None or token.encode() in argv):
            found.append(int(pid))
    return found


def test_soak_of_a_model_that_does_not_leak_has_growth_interval_holding_zero(
    tiny_onnx: Path, tmp_path: Path
) -> None:
    pytest.importorskip("MNN")
    res = edgebench(
        "probe", "soak", "--model", tiny_onnx, "--runtime", "mnn", "--minutes", 0.15, "--rate-hz", 50,
        "--period-s", 0.5, "--threads", 1, "--store", tmp_path / "s.db", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    records = doc["records"]
    rss = [r for r in records if r["metric"] == "rss_mb"]
    assert len(rss) >= 12 and all(r["params"]["t_s"] >= 0 for r in rss)
    [growth] = [r for r in records if r["metric"] == "rss_growth_mb_per_hour"]
    notes = growth["annotations"]
    assert notes["ci_low"] <= 0.0 <= notes["ci_high"] and notes["verdict"] == "none"
    [drift] = [r for r in records if r["metric"] == "latency_drift_ratio"]
    # The reference: the late over the early quarter of the windows' own p50 records, recomputed here (a
    # ratio bound would only measure the machine: beside two busy loops a tiny model drifted 9x).
    windows = sorted(
        (r["params"]["t_s"], r["value"])
        for r in records
        if r["metric"] == "latency_ms" and "t_s" in r["params"] and r["value"] is not None
    )
    quarter = max(1, len(windows) // 4)
    early = statistics.median(v for _, v in windows[:quarter])
    late = statistics.median(v for _, v in windows[-quarter:])
    assert drift["value"] > 0 and drift["value"] == pytest.approx(late / early)
    [n] = [r for r in records if r["metric"] == "samples_n"]
    # The reference: 50 Hz for 9 s is an exact count, less the start-up of the loop.
    assert 0.9 * 450 <= n["value"] <= 451
    assert doc["summary"]["leak"] == "none"
    report = edgebench("report", "--store", tmp_path / "s.db", "--out", tmp_path / "r.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert 'data-section="soak" data-state="data"' in html and "rss_growth_mb_per_hour" in html


def test_contention_slows_both_sides_and_leaves_no_corunner(tmp_path: Path) -> None:
    res = edgebench(
        "probe", "contention", "--model", "builtin:mlp", "--threads", 1, "--corunner-threads", 2,
        "--runs", 30, "--min-seconds", 1, "--store", tmp_path / "s.db", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)["records"]
    got = {
        (
            r["metric"],
            r["params"].get("stat"),
            r["params"].get("corunner_threads"),
            r["params"].get("victim"),
        ): r
        for r in records
    }
    alone, beside = got[("latency_ms", "p50", 0, None)], got[("latency_ms", "p50", 2, None)]
    model = got[("corunner_slowdown", None, 2, "model")]
    corunner = got[("corunner_slowdown", None, 2, "corunner")]
    alone_mean, beside_mean = got[("latency_ms", "mean", 0, None)], got[("latency_ms", "mean", 2, None)]
    assert model["value"] == pytest.approx(beside_mean["value"] / alone_mean["value"])
    assert model["annotations"]["p50_ratio"] == pytest.approx(beside["value"] / alone["value"])
    # Three busy threads on the CPUs the model had: both sides lose (generous bounds: a shared machine).
    cpus = model["annotations"]["cpus"]
    print(f"contention on {cpus} CPUs: model x{model['value']:.2f}, co-runner x{corunner['value']:.2f}")
    if cpus <= 2:
        assert model["value"] > 1.05 and corunner["value"] > 1.05
    if cpus == len(os.sched_getaffinity(0)):
        # The independent reference: a bare onnxruntime loop of the same model, alone and beside two busy
        # interpreters of the test's own (no edgebench code), on the same CPUs, in a session of their own as
        # the agent and its co-runners are (autogroup scheduling shares the CPUs per session, and busy work
        # in the test's session must weigh on both sides alike: beside the suite and two busy loops, the loop
        # in the test's process read x2.39 against the agent's x4.46, in its own session x3.25 against x3.80).
        # Measured apart in time on a machine whose load drifts: held to a factor 2.
        feeds = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 1024)).astype(np.float32)}
        with OwnSession() as own:
            bare = own.call(bare_onnxruntime_slowdown, str(resolve_model("builtin:mlp").path), feeds, 2)
        print(f"bare onnxruntime loop beside two busy processes: x{bare:.2f}")
        assert 0.5 <= model["value"] / bare <= 2.0, (model["value"], bare)
    assert corunner["annotations"]["alone_per_s"] > 0 and corunner["annotations"]["beside_per_s"] > 0
    assert corunners(model["annotations"]["corunner_token"]) == []
    report = edgebench("report", "--store", tmp_path / "s.db", "--out", tmp_path / "r.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert 'data-section="contention" data-state="data"' in (tmp_path / "r.html").read_text()


def test_corunners_do_not_outlive_a_killed_agent(tiny_onnx: Path, tmp_path: Path) -> None:
    """The agent is SIGKILLed while the co-runner runs (no finally runs): each co-runner exits by itself."""
    task = {
        "kind": "contention", "model": str(tiny_onnx), "threads": 1, "corunner_threads": [2],
        "corunner_seconds": 30.0, "runs": 10, "min_seconds": 0, "warmup_seconds": 0,
    }  # fmt: skip
    agent = subprocess.Popen(
        [sys.executable, "-m", "edgebench.agent", "--task", json.dumps(task)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(corunners()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(corunners()) >= 2, "the co-runner never started"
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while corunners() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert corunners() == []
