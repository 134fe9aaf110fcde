"""`edgebench doctor` on the host, a real ssh board and the emulated adb phone: the harness against bare
loops on each device, stored as device health and shown in the report beside the device's numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

# Five rounds: each side's corroborated fastest round needs more than two on a loaded host (two read 2.2)
QUICK = ["--rounds", "5", "--runs", "40", "--matmul-n", "256", "--bandwidth-mb", "16", "--timeout", "300"]


def test_doctor_measures_the_harness_against_bare_loops_and_the_report_shows_it(
    lab_device: tuple[Path, str], tmp_path: Path
) -> None:
    lab, name = lab_device
    store = tmp_path / "s.db"
    common = ["--device", name, "--lab", str(lab), "--store", str(store)]
    res = edgebench("doctor", *common, *QUICK, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    got = {(r["metric"], r["runtime"], r["params"].get("kind")): r for r in doc["records"]}
    assert got[("timer_resolution_ns", None, None)]["value"] > 0
    overhead = got[("harness_overhead", "onnxruntime", None)]
    # Generous: the figure is the product's; this test holds that it is measured and sane on every device.
    assert 0.5 < overhead["value"] < 2.0, overhead
    assert overhead["annotations"]["bare_p50_ms"] > 0 and overhead["annotations"]["rounds"] == 5
    assert got[("noise_cv", "onnxruntime", None)]["value"] >= 0
    # every runtime the device has is checked, LiteRT on its own flatbuffer model
    runtimes = {r["runtime"] for r in doc["records"] if r["metric"] == "harness_overhead"}
    assert runtimes == {"onnxruntime", "mnn", "litert", "ncnn"}, runtimes
    assert got[("harness_overhead", "litert", None)]["annotations"]["model"] == "mlp"  # builtin:mlp.tflite
    assert 0.5 < got[("harness_overhead", "litert", None)]["value"] < 2.0
    for backend in ("numpy", "onnxruntime"):
        reach = got[("probe_reach", backend, "matmul")]
        assert 0.3 < reach["value"] < 3.0 and reach["annotations"]["bare_gflops"] > 0
    assert got[("probe_reach", None, "bandwidth")]["annotations"]["bare_gbps"] > 0
    cpus = [r for r in doc["records"] if r["metric"] == "cpu_freq_mhz"]  # none where sysfs has no cpufreq
    assert all((r["value"] is None or r["value"] > 0) and "governor" in r["annotations"] for r in cpus)
    flags = got[("health_flags", None, None)]
    assert flags["value"] == len(doc["flags"]) == len(flags["annotations"]["flags"])
    assert all(r["device"] == name and r["probe"] == "doctor" for r in doc["records"])

    # a later bench of the same device: a report of that run alone carries the device's health
    bench = ["--runs", "20", "--min-seconds", "0", "--timeout", "120", "--json"]
    res = edgebench("bench", "builtin:mlp", *common, *bench, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "r.html"
    args = ["report", "--store", str(store), "--run", json.loads(res.stdout)["run_id"], "--out", str(out)]
    report = edgebench(*args, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    html = out.read_text()
    section = re.search(
        r'<section id="health" data-section="health" data-state="(\w+)">(.*?)</section>', html, re.S
    )
    assert section and section.group(1) == "data" and name in section.group(2)
    assert f"{overhead['value']:.3f}" in section.group(2)
