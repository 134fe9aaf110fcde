"""The shell sensor sampler (for devices without Python) reads a sysfs tree through the real transport."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from edgebench.device import Device
from edgebench.lab import Sensors, builtin_local
from edgebench.native.shell_sampler import parse_sampler_output, start_sampler, stop_sampler

pytestmark = pytest.mark.integration


def sysfs_tree(root: Path) -> None:
    def put(rel: str, value: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")

    put("sys/class/thermal/thermal_zone0/temp", "45500")
    put("sys/class/thermal/thermal_zone0/type", "cpu-thermal")
    put("sys/class/thermal/thermal_zone1/temp", "38000")
    put("sys/class/thermal/thermal_zone1/type", "battery")
    for cpu in (0, 1):
        put(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq", "1800000")
        put(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_max_freq", "2000000")
        put(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq", "2400000")
    put("sys/class/power_supply/battery/current_now", "-350000")
    put("sys/class/power_supply/battery/voltage_now", "3900000")
    put("sys/class/power_supply/battery/status", "Discharging")
    put("sys/class/hwmon/hwmon0/curr1_input", "120")
    put("sys/class/hwmon/hwmon0/curr1_label", "VDD_CPU")


def test_shell_sampler_reads_every_sensor(tmp_path: Path) -> None:
    sysfs_tree(tmp_path / "root")
    spec = dataclasses.replace(builtin_local(), workdir=str(tmp_path / "work"),
                               sensors=Sensors(sysfs_root=str(tmp_path / "root")))
    with Device(spec) as device:
        handle = start_sampler(device, 0.1, 0.6, timeout=10)
        time.sleep(0.45)
        (tmp_path / "root/sys/class/thermal/thermal_zone0/temp").write_text("47000\n")
        time.sleep(0.4)
        trace = stop_sampler(device, handle, timeout=10)
    cpu = trace.temps["cpu-thermal"]
    assert len(cpu) >= 4 and cpu[0][1] == 45.5 and cpu[-1][1] == 47.0
    assert all(b[0] >= a[0] for a, b in zip(cpu, cpu[1:], strict=False))  # device clock, monotonic
    assert trace.temps["battery"][0][1] == 38.0
    assert trace.freqs["cpu0"][0][1:] == (1800.0, 2000.0) and "cpu1" in trace.freqs
    assert trace.supplies["battery"][0][1:] == (-350000.0, 3900000.0, "Discharging")
    assert trace.rails["hwmon0/curr1_input"][0][1] == 120.0


def test_partial_lines_are_skipped() -> None:
    trace = parse_sampler_output("12.5 T thermal_zone0 41000 soc\n12.7 T thermal_zone0 4")
    assert trace.temps == {"soc": [(12.5, 41.0)]}
