"""The shell sensor sampler (for devices without Python) gives the Python sampler's channels and values."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from edgebench.descriptors import Sensors, builtin_local
from edgebench.lab.device import Device
from edgebench.native.shell_sampler import parse_sampler_output, sensor_log, start_sampler, stop_sampler
from edgebench.probes.sensing import parse_sensor_log, sensor_samples, sensors_config
from edgebench.records import RecordContext

pytestmark = pytest.mark.integration


def put(root: Path, rel: str, value: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")


def sysfs_tree(root: Path) -> None:
    put(root, "sys/class/thermal/thermal_zone0/temp", "45500")
    put(root, "sys/class/thermal/thermal_zone0/type", "cpu-thermal")
    put(root, "sys/class/thermal/thermal_zone1/temp", "38000")
    put(root, "sys/class/thermal/thermal_zone1/type", "battery")
    for cpu in (0, 1, 2, 3):
        base = f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        big = cpu >= 2
        put(root, f"{base}/scaling_cur_freq", "2400000" if big else "1800000")
        put(root, f"{base}/scaling_max_freq", "2400000" if big else "2000000")
        put(root, f"{base}/cpuinfo_max_freq", "2400000" if big else "2000000")
        put(root, f"{base}/related_cpus", "2 3" if big else "0 1")
    put(root, "sys/class/power_supply/battery/type", "Battery")
    put(root, "sys/class/power_supply/battery/current_now", "-350000")
    put(root, "sys/class/power_supply/battery/voltage_now", "3900000")
    put(root, "sys/class/power_supply/battery/status", "Discharging")
    put(root, "sys/class/power_supply/usb/type", "USB")
    put(root, "sys/class/power_supply/usb/online", "0")
    put(root, "sys/class/hwmon/hwmon0/name", "ina3221")
    put(root, "sys/class/hwmon/hwmon0/in1_label", "VDD_CPU")
    put(root, "sys/class/hwmon/hwmon0/in1_input", "5000")
    put(root, "sys/class/hwmon/hwmon0/curr1_input", "120")
    put(root, "sys/class/hwmon/hwmon0/power1_input", "600000")


def local_device(tmp_path: Path) -> Device:
    spec = dataclasses.replace(
        builtin_local(), workdir=str(tmp_path / "work"), sensors=Sensors(sysfs_root=str(tmp_path / "root"))
    )
    return Device(spec)


def channels(log: dict) -> dict[str, tuple]:
    return {c["id"]: (c["metric"], c["unit"], c["labels"], c["values"][0]) for c in log["channels"]}


def test_shell_and_python_samplers_agree(tmp_path: Path) -> None:
    sysfs_tree(tmp_path / "root")
    with local_device(tmp_path) as device:
        config = sensors_config(device.spec, 0.1)
        python_log = device.run_agent({"kind": "sample", "sensors": config, "duration_s": 0.3}, 60).result[
            "sensors"
        ]
        handle = start_sampler(device, 0.1, 0.5, timeout=10)
        time.sleep(0.6)
        shell_log = sensor_log(stop_sampler(device, handle, timeout=10), config, 0.1)
    assert channels(shell_log) == channels(python_log)
    assert {
        "temp:cpu-thermal",
        "freq_mhz:0-1",
        "freq_cap_mhz:2-3",
        "current:battery",
        "voltage:battery",
        "power_mw:ina3221/VDD_CPU@hwmon0",
    } <= set(channels(shell_log))
    assert shell_log["static"] == python_log["static"]
    assert set(shell_log["status"]) == set(python_log["status"]) == {"status:battery", "online:usb"}
    # The same records, through the same host code.
    ctx = RecordContext("r", "local", "sample")
    shell = {(s.metric, s.params.get("sensor")) for s in sensor_samples(ctx, parse_sensor_log(shell_log))}
    python = {(s.metric, s.params.get("sensor")) for s in sensor_samples(ctx, parse_sensor_log(python_log))}
    assert shell == python


def test_shell_sampler_follows_changes_on_the_device_clock(tmp_path: Path) -> None:
    sysfs_tree(tmp_path / "root")
    with local_device(tmp_path) as device:
        handle = start_sampler(device, 0.1, 1.0, timeout=10)
        time.sleep(0.45)
        put(tmp_path / "root", "sys/class/thermal/thermal_zone0/temp", "47000")
        put(tmp_path / "root", "sys/class/power_supply/battery/status", "Charging")
        time.sleep(0.4)
        log = sensor_log(stop_sampler(device, handle, timeout=10), sensors_config(device.spec, 0.1), 0.1)
    temps = next(c["values"] for c in log["channels"] if c["id"] == "temp:cpu-thermal")
    assert temps[0] == 45.5 and temps[-1] == 47.0 and len(temps) >= 5
    assert all(b > a for a, b in zip(log["t"], log["t"][1:], strict=False))
    assert [text for _, text in log["status"]["status:battery"]] == ["Discharging", "Charging"]


def test_partial_lines_are_skipped() -> None:
    trace = parse_sampler_output(
        "S\tsys/class/thermal/thermal_zone0/type\tsoc\nT\t12.5\n"
        "V\tsys/class/thermal/thermal_zone0/temp\t41000\nT\t12.7\nV\tsys/cl"
    )
    assert trace.static == {"sys/class/thermal/thermal_zone0/type": "soc"}
    assert [t for t, _ in trace.ticks] == [12.5, 12.7] and trace.ticks[1][1] == {}
