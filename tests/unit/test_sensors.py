"""On-device samplers: discovery and units on a sandbox sysfs tree, the sampler, the cool-down logic."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from edgebench.agent import sensors as S
from edgebench.agent.sustained import cooldown_verdict, power_source, settle_estimate
from edgebench.probes.sensing import parse_sensor_log
from edgebench.testing.sysfs_sim import SimConfig, build_tree, write


@pytest.fixture
def tree(tmp_path: Path) -> SimConfig:
    """A built (not running) sandbox: 4 CPUs in 2 policies, 3 zones, a battery, an INA3221."""
    cfg = SimConfig(root=tmp_path / "board", cpus=4, policies=2)
    build_tree(cfg)
    return cfg


def set_file(cfg: SimConfig, rel: str, value: object) -> None:
    write(cfg.sys / rel, value)


def test_discovers_every_kind_with_units(tree: SimConfig) -> None:
    set_file(tree, "class/thermal/thermal_zone0/temp", 47250)
    set_file(tree, "devices/system/cpu/cpufreq/policy2/scaling_cur_freq", 1_800_000)
    set_file(tree, "class/power_supply/battery/current_now", -412_000)
    set_file(tree, "class/power_supply/battery/voltage_now", 3_912_000)
    set_file(tree, "class/hwmon/hwmon0/curr1_input", 640)
    set_file(tree, "class/hwmon/hwmon0/power1_input", 3_200_000)
    found = S.discover({"sysfs_root": str(tree.root)})
    values = {c.id: c.read() for c in found.channels}
    assert values["temp:cpu-thermal"] == pytest.approx(47.25)
    assert values["freq_mhz:2-3"] == pytest.approx(1800.0)
    assert values["freq_cap_mhz:0-1"] == pytest.approx(2400.0)
    assert values["current:battery"] == pytest.approx(-412.0)  # sign kept: calibrated by the host
    assert values["voltage:battery"] == pytest.approx(3.912)
    assert values["current_ma:ina3221/VDD_IN@hwmon0"] == pytest.approx(640.0)
    assert values["power_mw:ina3221/VDD_IN@hwmon0"] == pytest.approx(3200.0)
    assert values["voltage_v:ina3221/VDD_CPU@hwmon0"] == pytest.approx(5.0)
    # Per-CPU cpufreq dirs that are symlinks to one policy are one frequency domain.
    assert sorted(c.labels["cpus"] for c in found.of("freq_mhz")) == ["0-1", "2-3"]
    assert found.static["cpufreq"]["0-1"]["cpuinfo_max_mhz"] == pytest.approx(2400.0)
    assert {s.id for s in found.statuses} == {"status:battery", "online:usb"}
    assert found.read_temps()["cpu-thermal"] == pytest.approx(47.25)


def test_copied_mirror_groups_cpus_by_related_cpus(tmp_path: Path) -> None:
    """A mirror made with copies (no symlinks) still gives one channel per frequency domain."""
    root = tmp_path / "mirror"
    for cpu in range(4):
        d = root / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        d.mkdir(parents=True)
        write(d / "related_cpus", "0 1 2 3")
        write(d / "scaling_cur_freq", 1_000_000)
    found = S.discover({"sysfs_root": str(root)})
    assert [c.labels["cpus"] for c in found.of("freq_mhz")] == ["0-3"]


def test_zone_filter_names_and_missing_zone_warning(tree: SimConfig) -> None:
    found = S.discover({"sysfs_root": str(tree.root), "thermal_zones": ["battery", "thermal_zone0", "npu"]})
    assert sorted(c.labels["zone"] for c in found.of("temp_c")) == ["battery", "cpu-thermal"]
    assert any("npu" in w and "cpu-thermal" in w for w in found.warnings)


def test_broken_and_duplicate_zones(tree: SimConfig) -> None:
    zone = tree.sys / "class/thermal/thermal_zone3"
    zone.mkdir()
    write(zone / "type", "cpu-thermal")
    write(zone / "temp", 52000)
    dead = tree.sys / "class/thermal/thermal_zone4"
    dead.mkdir()
    write(dead / "type", "disabled")
    write(dead / "temp", -273000)
    zones = [c.labels["zone"] for c in S.discover({"sysfs_root": str(tree.root)}).of("temp_c")]
    assert "cpu-thermal@thermal_zone3" in zones and "disabled" not in zones


@pytest.mark.parametrize(("raw", "celsius"), [(45000, 45.0), (450, 45.0), (45, 45.0), (-5000, -5.0)])
def test_temperature_units(raw: int, celsius: float) -> None:
    assert raw * S.temperature_scale(raw) == pytest.approx(celsius)


def test_old_gauge_in_millivolts(tree: SimConfig) -> None:
    set_file(tree, "class/power_supply/battery/voltage_now", 3850)
    set_file(tree, "class/power_supply/battery/current_now", 300)
    found = S.discover({"sysfs_root": str(tree.root)})
    values = {c.id: c.read() for c in found.channels}
    assert values["voltage:battery"] == pytest.approx(3.85)
    assert values["current:battery"] == pytest.approx(300.0)


def test_descriptor_power_files_take_units_from_their_names(tree: SimConfig) -> None:
    found = S.discover(
        {
            "sysfs_root": str(tree.root),
            "current": "/sys/class/hwmon/hwmon0/curr1_input",
            "voltage": "/sys/class/hwmon/hwmon0/in1_input",
        }
    )
    mine = [c for c in found.channels if c.labels.get("source") == "descriptor"]
    assert {c.metric: c.scale for c in mine} == {"current_ma": 1.0, "voltage_v": 0.001}
    assert power_source(found, {})["kind"] == "descriptor"
    found = S.discover(
        {"sysfs_root": str(tree.root), "current": "/sys/class/power_supply/battery/current_now"}
    )
    assert power_source(found, {})["kind"] == "battery"
    missing = S.discover({"sysfs_root": str(tree.root), "current": "/sys/nope/current_now"})
    assert any("sensors.power.current" in w for w in missing.warnings)


def test_power_source_order(tree: SimConfig, tmp_path: Path) -> None:
    found = S.discover({"sysfs_root": str(tree.root)})
    assert power_source(found, {})["kind"] == "battery"
    assert power_source(found, {"monitor": True})["kind"] == "monitor"
    board = SimConfig(root=tmp_path / "board2", battery=False)
    build_tree(board)
    assert power_source(S.discover({"sysfs_root": str(board.root)}), {})["kind"] == "rail"
    assert power_source(S.discover({"sysfs_root": str(tmp_path / "empty")}), {})["kind"] == "none"


def test_sampler_timestamps_statuses_and_log(tree: SimConfig) -> None:
    found = S.discover({"sysfs_root": str(tree.root)})
    origin = time.monotonic()
    sampler = S.Sampler(found, period_s=0.05, origin=origin, dumpsys=False).start()
    time.sleep(0.2)
    set_file(tree, "class/power_supply/battery/status", "Charging")
    time.sleep(0.2)
    log = sampler.stop()
    t = log["t"]
    assert len(t) >= 5 and t == sorted(t) and t[0] < 0.05
    assert all(len(c["values"]) == len(t) for c in log["channels"])
    assert [text for _, text in log["status"]["status:battery"]] == ["Discharging", "Charging"]
    parsed = parse_sensor_log(log)
    assert parsed.hottest()[0] == pytest.approx(35.0)
    assert parsed.statuses_seen() == {"Discharging", "Charging"}
    assert 10 < parsed.rate_hz < 25


def test_cpu_list_round_trip() -> None:
    assert S.cpu_list([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    assert S.parse_cpu_list("0-3,6,8-9") == [0, 1, 2, 3, 6, 8, 9]
    assert S.parse_cpu_list("0 1 2") == [0, 1, 2]


def test_thermalservice_parse() -> None:
    text = """IsStatusOverride: false
Thermal Status: 2
Cached temperatures:
\tTemperature{mValue=99.0, mType=0, mName=old, mStatus=0}
Current temperatures from HAL:
\tTemperature{mValue=41.5, mType=0, mName=CPU0, mStatus=0}
\tTemperature{mValue=33.25, mType=2, mName=battery, mStatus=0}

Current cooling devices from HAL:
\tCoolingDevice{mValue=0, mType=2, mName=battery}
"""
    parsed = S.parse_thermalservice(text)
    assert parsed == {"status": 2, "temps": {"CPU0": 41.5, "battery": 33.25}}


# ---- cool-down logic -------------------------------------------------------------------------------
def cooling(t: float, idle: float = 35.0, start: float = 60.0, tau: float = 30.0) -> float:
    return idle + (start - idle) * math.exp(-t / tau)


def test_settle_estimate_finds_the_asymptote_of_a_cooling_curve() -> None:
    times = [float(i) for i in range(0, 40)]
    temps = [round(cooling(t), 1) for t in times]  # quantised like a real zone
    idle, is_cooling = settle_estimate(times, temps)
    assert is_cooling and idle == pytest.approx(35.0, abs=1.0)


def test_settle_estimate_flat_or_warming() -> None:
    times = [float(i) for i in range(20)]
    assert settle_estimate(times, [40.0] * 20) == (40.0, False)
    assert settle_estimate(times, [40.0 + 0.1 * i for i in range(20)])[1] is False


def test_verdict_waits_while_cooling_and_passes_near_idle() -> None:
    early = [float(i) for i in range(0, 15)]
    v = cooldown_verdict(early, {"cpu": [cooling(t) for t in early], "bat": [30.0] * 15}, 2.0, 10.0)
    assert not v["cooled"] and v["zone"] == "cpu" and v["idle_c"]["cpu"] == pytest.approx(35.0, abs=1.5)
    late = [float(i) for i in range(0, 100)]
    v = cooldown_verdict(late, {"cpu": [cooling(t) for t in late]}, 2.0, 10.0)
    assert v["cooled"]
    assert not cooldown_verdict([0.0, 1.0], {"cpu": [50.0, 50.0]}, 2.0, 10.0)["cooled"]  # still observing


def test_verdict_with_given_idle_reading() -> None:
    assert cooldown_verdict([0.0], {"cpu": [36.5]}, 2.0, 10.0, {"cpu": 35.0})["cooled"]
    assert not cooldown_verdict([0.0], {"cpu": [38.0]}, 2.0, 10.0, 35.0)["cooled"]
    v = cooldown_verdict([0.0], {"cpu": [38.0], "gpu": [36.0]}, 2.0, 10.0, 35.0)
    assert v["zone"] == "cpu" and v["idle_c"] == {"cpu": 35.0}
    assert cooldown_verdict([], {}, 2.0, 10.0)["cooled"]  # no zones: nothing to wait for


def test_sandbox_tree_has_the_kernel_layout(tree: SimConfig) -> None:
    link = tree.sys / "devices/system/cpu/cpu3/cpufreq"
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    assert (link / "scaling_max_freq").read_text().strip() == "2400000"
    assert (tree.sys / "devices/system/cpu/possible").read_text().strip() == "0-3"
    assert (tree.sys / "class/power_supply/battery/type").read_text().strip() == "Battery"


def test_sampler_polls_android_thermal_service(
    tree: SimConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where `dumpsys` exists (a stand-in here), its status and HAL temperatures join the log and samples."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dumpsys"
    fake.write_text(
        "#!/bin/sh\nprintf 'Thermal Status: 1\\nCurrent temperatures from HAL:\\n"
        "\\tTemperature{mValue=44.0, mType=0, mName=CPU0, mStatus=1}\\n'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    sampler = S.Sampler(S.discover({"sysfs_root": str(tree.root)}), period_s=0.05, dumpsys=True).start()
    time.sleep(0.3)
    log = sampler.stop()
    assert log["android_thermal"]["status"][0][1] == 1
    assert log["android_thermal"]["temps"]["CPU0"][0][1] == 44.0
    from edgebench.probes.sensing import sensor_samples
    from edgebench.records import RecordContext

    samples = sensor_samples(RecordContext("r", "d", "thermal"), parse_sensor_log(log))
    hal = [s for s in samples if s.params.get("series") == "android_hal" and s.metric == "temp_c"]
    assert hal and hal[0].params["zone"] == "CPU0" and hal[0].values == (44.0,)


def test_load_loop_back_to_back_and_duty_cycle() -> None:
    from edgebench.agent.sustained import run_load

    origin = time.monotonic()
    busy = run_load(lambda: time.sleep(0.002), 0.3, 0.0, origin)
    assert len(busy["t"]) > 50 and all(b > a for a, b in zip(busy["t"], busy["t"][1:], strict=False))
    assert min(busy["latencies_ms"]) >= 2.0
    paced = run_load(lambda: time.sleep(0.002), 0.5, 50.0, time.monotonic())
    gaps = [b - a for a, b in zip(paced["t"], paced["t"][1:], strict=False)]
    assert len(paced["t"]) == 25 and min(gaps) > 0.015 and paced["missed"] == 0
    late = run_load(lambda: time.sleep(0.03), 0.3, 100.0, time.monotonic())
    assert late["missed"] > 0  # each inference outlasts the 10 ms period


def test_voltage_only_hwmon_and_peripheral_batteries_are_not_power_sensors(tmp_path: Path) -> None:
    root = tmp_path / "pi"
    chip = root / "sys/class/hwmon/hwmon0"
    chip.mkdir(parents=True)
    write(chip / "name", "rpi_volt")
    write(chip / "in0_input", 0)
    mouse = root / "sys/class/power_supply/hidpp_battery_0"
    mouse.mkdir(parents=True)
    for name, value in (
        ("type", "Battery"),
        ("scope", "Device"),
        ("current_now", 5000),
        ("status", "Charging"),
    ):
        write(mouse / name, value)
    found = S.discover({"sysfs_root": str(root)})
    assert power_source(found, {})["kind"] == "none"
    assert not any("supply" in c.labels for c in found.channels)
