"""Device health: doctor figures judged against their bounds, and shown (flagged) in the report."""

from __future__ import annotations

import pytest

from edgebench.probes.doctor import doctor_records
from edgebench.probes.registry import DoctorParams
from edgebench.records import RecordContext
from edgebench.render.report.health import latest_health


def agent_result(harness: float, bare: float, cv: float, reach: float) -> dict:
    return {
        "timer": {"resolution_ns": 40.0, "read_ns": 25.0, "getres_ns": 1.0},
        "runtimes": {
            "onnxruntime": {
                "version": "1",
                "harness_p50_ms": [harness] * 3,
                "bare_p50_ms": [bare] * 3,
                "noise_cv": [cv] * 3,
                "robust_cv": [cv / 2] * 3,
                "runs": 50,
            },  # fmt: skip
            "mnn": {"error": "MNN is not installed"},
        },
        "cpus": [{"cpu": 0, "governor": "schedutil", "cur_mhz": 1800.0, "min_mhz": 300.0, "max_mhz": 2400.0}],
        "matmul": [
            {
                "backend": "numpy",
                "op": "matmul",
                "n": 512,
                "threads": 1,
                "probe_flops": reach * 1e11,
                "bare_flops": 1e11,
            }
        ],  # fmt: skip
        "bandwidth": {"kernel": "copy", "bytes": 1, "probe_bps": 9e9, "bare_bps": 1e10},
    }


def records(run: str, **kw: float):  # type: ignore[no-untyped-def]
    return doctor_records(
        RecordContext(run, "phone", "doctor"),
        agent_result(**kw),
        DoctorParams(),
        {"onnxruntime": "mlp", "mnn": "mlp"},
    )


def test_a_healthy_device_has_no_flags() -> None:
    out = records("r1", harness=1.01, bare=1.0, cv=0.01, reach=1.0)
    by = {(r.metric, r.runtime): r for r in out.records}
    assert by[("harness_overhead", "onnxruntime")].value == 1.01
    assert by[("health_flags", None)].value == 0
    assert any("mnn not checked" in w for w in out.warnings)
    assert any("governor schedutil" in w for w in out.warnings)


def test_overhead_noise_and_low_reach_are_flagged() -> None:
    out = records("r1", harness=1.3, bare=1.0, cv=0.2, reach=0.5)
    flags = next(r for r in out.records if r.metric == "health_flags").annotations["flags"]
    assert [f.split(":")[0] for f in flags] == ["OVERHEAD", "NOISY", "LOW-REACH"]
    assert {r.metric for r in out.records if r.annotations.get("flag")} == {
        "harness_overhead",
        "noise_cv",
        "probe_reach",
    }


def test_the_report_shows_the_latest_health_of_each_device() -> None:
    old = records("r1", harness=1.3, bare=1.0, cv=0.2, reach=1.0).records
    new = records("r2", harness=1.02, bare=1.0, cv=0.01, reach=1.0).records
    [health] = latest_health(old + new, ["r1", "r2"])
    assert health.run_id == "r2" and not health.flags
    [row] = health.rows
    assert row[2] == "onnxruntime" and row[3] == "1.020" and row[-1] == "ok"
    [flagged] = latest_health(old, ["r1"])
    assert flagged.flags and "⚠" in flagged.rows[0][3]


def test_cpu_frequencies_come_from_cpufreq_under_the_sysfs_root(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from edgebench.agent.doctor import cpu_frequencies

    for cpu, cur in ((0, "1800000"), (1, "600000")):
        folder = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_governor").write_text("schedutil\n")
        (folder / "scaling_cur_freq").write_text(cur + "\n")
        (folder / "cpuinfo_max_freq").write_text("2400000\n")
    got = cpu_frequencies(str(tmp_path))
    assert [(c["cpu"], c["governor"], c["cur_mhz"], c["max_mhz"], c["min_mhz"]) for c in got] == [
        (0, "schedutil", 1800.0, 2400.0, None),
        (1, "schedutil", 600.0, 2400.0, None),
    ]


def test_a_slow_stretch_over_one_side_of_a_round_is_not_harness_overhead() -> None:
    health = agent_result(harness=1.0, bare=1.0, cv=0.01, reach=1.0)
    onnxruntime = health["runtimes"]["onnxruntime"]
    onnxruntime["harness_p50_ms"] = [1.02, 3.0]  # the host stalled for the whole harness side of round 2
    onnxruntime["bare_p50_ms"] = [1.0, 1.01]
    out = doctor_records(
        RecordContext("r1", "phone", "doctor"), health, DoctorParams(), {"onnxruntime": "mlp"}
    )
    overhead = next(r for r in out.records if r.metric == "harness_overhead")
    assert overhead.value == pytest.approx(1.02) and overhead.annotations["flag"] is None
