"""`devices --check`: reach each device and say what it has (arch, cores, memory, runtimes, sensors)."""

from __future__ import annotations

import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

from .device import Device
from .errors import EdgebenchError, one_line
from .lab import Lab

HEALTH_TIMEOUT_S = 60.0


@dataclass
class DeviceCheck:
    name: str
    transport: str
    reachable: bool = False
    arch: str | None = None
    cores: int | None = None
    memory_mb: float | None = None
    kernel: str | None = None
    python: str | None = None
    runtimes: dict[str, Any] = field(default_factory=dict)
    sensors: dict[str, int] = field(default_factory=dict)
    runners: dict[str, bool] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sensor_counts(device: Device, timeout: float) -> dict[str, int]:
    """How many thermal zones, cpufreq policies, power supplies and hwmon chips the device exposes."""
    root = device.spec.sensors.sysfs_root
    globs = {
        "thermal_zones": "sys/class/thermal/thermal_zone*",
        "cpufreq": "sys/devices/system/cpu/cpu*/cpufreq",
        "power_supply": "sys/class/power_supply/*",
        "hwmon": "sys/class/hwmon/hwmon*",
    }
    counts = {}
    for name, pattern in globs.items():
        # `sh -c` receives the root as $1, so the glob is expanded remotely without splicing strings.
        res = device.transport.run(
            ["sh", "-c", 'cd "$1" 2>/dev/null && for p in ' + pattern + '; do [ -e "$p" ] && echo "$p"; done',
             "sh", posixpath.join(root, "")], timeout=timeout)
        counts[name] = len([ln for ln in res.stdout.splitlines() if ln.strip()])
    return counts


def runner_presence(device: Device, timeout: float) -> dict[str, bool]:
    found = {}
    for name, runner in device.spec.runners.items():
        res = device.transport.run(["sh", "-c", 'test -x "$1"', "sh", runner.path], timeout=timeout)
        found[name] = res.returncode == 0 or runner.host_path is not None
    return found


def check_device(lab: Lab, name: str) -> DeviceCheck:
    spec = lab.get(name)
    report = DeviceCheck(name=name, transport=spec.transport)
    try:
        with Device(spec) as device:
            report.runners = runner_presence(device, HEALTH_TIMEOUT_S)
            report.sensors = sensor_counts(device, HEALTH_TIMEOUT_S)
            report.reachable = True
            if spec.agent == "python":
                fp = device.fingerprint(HEALTH_TIMEOUT_S)
                report.arch, report.cores, report.memory_mb = fp.get("arch"), fp.get("cores"), fp.get("memory_mb")
                report.kernel, report.python = fp.get("kernel"), fp.get("python")
                report.runtimes = {k: v for k, v in (fp.get("runtimes") or {}).items() if v}
            else:
                uname = device.transport.run(["uname", "-srm"], timeout=HEALTH_TIMEOUT_S)
                parts = uname.stdout.split()
                report.kernel = " ".join(parts[:2]) or None
                report.arch = parts[2] if len(parts) > 2 else None
    except EdgebenchError as exc:
        report.error = one_line(exc)
    return report


def check_devices(lab: Lab, names: list[str]) -> list[DeviceCheck]:
    return [check_device(lab, n) for n in names]
