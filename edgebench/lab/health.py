"""`devices --check`: reach each device and say what it has.

Per device: reachable (and the round trip of a no-op command), arch, cores, memory, kernel, CPU model,
sensors present (thermal zones, cpufreq policies, power supplies, hwmon chips, and the descriptor's own
power files), the interpreter and runtime versions the agent finds, and the native runners. Facts that a
plain shell can give come from one `sh` command, so devices without Python (agent = "native") are checked
too. Devices are checked in parallel, every call bounded; one unreachable device never hides the others.

A device is *reachable* when its transport connects and runs a command; it is *usable* when, in addition,
its agent can run (agent = "python": the interpreter starts the agent; agent = "native": every runner is
present). The CLI exits 3 when any device is unreachable or unusable (a lab failure), naming the reason.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ..descriptors import DeviceSpec, Lab
from ..errors import EdgebenchError, UserError, one_line
from ..transports.base import validate_env
from .device import Device
from .nominal import cluster_summary

HEALTH_TIMEOUT_S = 60.0
MAX_PARALLEL = 8

SENSOR_GLOBS = {
    "thermal_zones": "sys/class/thermal/thermal_zone*",
    "cpufreq": "sys/devices/system/cpu/cpu*/cpufreq",
    "power_supply": "sys/class/power_supply/*",
    "hwmon": "sys/class/hwmon/hwmon*",
}

# One round trip for the facts a POSIX shell can give. $1 is the sysfs root; $2... are files the
# descriptor names (power sensors), reported as readable or not. Nothing is spliced into the script.
FACTS_SCRIPT = (
    "root=$1; shift\n"
    'echo "kernel=$(uname -s 2>/dev/null) $(uname -r 2>/dev/null)"\n'
    'echo "arch=$(uname -m 2>/dev/null)"\n'
    'n=$(getconf _NPROCESSORS_ONLN 2>/dev/null) || n=""\n'
    '[ -n "$n" ] || n=$(grep -c "^processor" /proc/cpuinfo 2>/dev/null)\n'
    'echo "cores=$n"\n'
    'while read -r k v rest; do [ "$k" = "MemTotal:" ] && echo "memkb=$v"; done 2>/dev/null < /proc/meminfo\n'
    + "".join(
        f'n=0; for p in "$root"{pattern}; do [ -e "$p" ] && n=$((n+1)); done; echo "{name}=$n"\n'
        for name, pattern in SENSOR_GLOBS.items()
    )
    + 'for f in "$@"; do if [ -r "$root${f#/}" ]; then echo "file=yes $f"; else echo "file=no $f"; fi; done\n'
)


@dataclass
class DeviceCheck:
    """What `devices --check` found on one device (also its --json form)."""

    name: str
    transport: str
    agent: str = "python"
    reachable: bool = False
    usable: bool = False
    rtt_ms: float | None = None
    arch: str | None = None
    cores: int | None = None
    memory_mb: float | None = None
    kernel: str | None = None
    cpu_model: str | None = None
    python: str | None = None
    runtimes: dict[str, Any] = field(default_factory=dict)
    cpu_flags: list[str] = field(default_factory=list)  # SIMD extensions (x86 flags / Arm Features)
    cpu_clusters: list[dict[str, Any]] = field(default_factory=list)  # cpus, capacity, max_mhz, core
    sensors: dict[str, int] = field(default_factory=dict)
    sensor_files: dict[str, bool] = field(default_factory=dict)
    runners: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    misconfigured: bool = False
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}

    @property
    def status(self) -> str:
        """'ok', or what is wrong in one line."""
        if self.misconfigured:
            return f"misconfigured: {self.error}"
        if not self.reachable:
            return f"unreachable: {self.error or 'unknown reason'}"
        if not self.usable:
            return f"not usable: {self.error or 'agent cannot run'}"
        return "ok"


def parse_facts(stdout: str) -> dict[str, Any]:
    """key=value lines of FACTS_SCRIPT into typed facts (absent or unparsable facts are left out)."""
    facts: dict[str, Any] = {"sensors": {}, "files": {}}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if key == "kernel" and value:
            facts["kernel"] = value
        elif key == "arch" and value:
            facts["arch"] = value
        elif key == "cores" and value.isdigit():
            facts["cores"] = int(value)
        elif key == "memkb" and value.isdigit():
            facts["memory_mb"] = round(int(value) / 1024.0, 1)
        elif key in SENSOR_GLOBS and value.isdigit():
            facts["sensors"][key] = int(value)
        elif key == "file":
            present, _, path = value.partition(" ")
            facts["files"][path] = present == "yes"
    return facts


def sensor_files(spec: DeviceSpec) -> list[str]:
    """Sensor files the descriptor names explicitly (power fuel-gauge files)."""
    power = spec.sensors.power
    return [p for p in (power.current, power.voltage) if p]


def shell_facts(device: Device, timeout: float) -> dict[str, Any]:
    root = device.spec.sensors.sysfs_root.rstrip("/") + "/"
    res = device.transport.run(
        ["sh", "-c", FACTS_SCRIPT, "sh", root, *sensor_files(device.spec)], timeout=timeout
    )
    return parse_facts(res.stdout)


def runner_presence(device: Device, timeout: float) -> dict[str, bool]:
    """Each native runner: present on the device, or pushable from the host."""
    found = {}
    for name, runner in device.spec.runners.items():
        res = device.transport.run(["sh", "-c", 'test -x "$1"', "sh", runner.path], timeout=timeout)
        found[name] = res.returncode == 0 or runner.pushed
    return found


def check_device(lab: Lab, name: str, timeout: float = HEALTH_TIMEOUT_S) -> DeviceCheck:
    """Reach one device and fill in a DeviceCheck; failures become its `error`, never exceptions."""
    spec = lab.get(name)
    report = DeviceCheck(name=name, transport=spec.transport, agent=spec.agent)
    try:
        validate_env(spec.env)
    except UserError as exc:
        # Only this device is unusable; the rest of the lab is still checked.
        report.error, report.misconfigured = f"{spec.source}: env: {one_line(exc)}", True
        return report
    try:
        with Device(spec) as device:
            start = time.monotonic()
            device.transport.run(["true"], timeout=timeout)
            report.rtt_ms = round((time.monotonic() - start) * 1000.0, 2)
            report.reachable = True
            _fill_shell_facts(report, shell_facts(device, timeout))
            report.runners = runner_presence(device, timeout)
            if spec.agent == "python":
                _fill_agent_facts(report, device.fingerprint(timeout))
                report.usable = True
            else:
                missing = [n for n, ok in report.runners.items() if not ok]
                report.usable = not missing
                if missing:
                    report.error = f"runner(s) not found on the device: {', '.join(missing)}"
    except EdgebenchError as exc:
        report.error = _without_device_prefix(one_line(exc), name)
    except Exception as exc:  # noqa: BLE001 - one device's fault must not hide the others' reports
        report.error = f"internal error: {type(exc).__name__}: {one_line(exc)}"
    _add_warnings(report)
    return report


def _fill_shell_facts(report: DeviceCheck, facts: dict[str, Any]) -> None:
    report.kernel = facts.get("kernel")
    report.arch = facts.get("arch")
    report.cores = facts.get("cores")
    report.memory_mb = facts.get("memory_mb")
    report.sensors = facts["sensors"]
    report.sensor_files = facts["files"]


def _fill_agent_facts(report: DeviceCheck, fp: dict[str, Any]) -> None:
    report.python = fp.get("python")
    report.cpu_model = fp.get("cpu_model")
    report.runtimes = {k: v for k, v in (fp.get("runtimes") or {}).items() if v}
    report.cpu_flags = list(fp.get("cpu_flags") or [])
    report.cpu_clusters = list(fp.get("cpu_clusters") or [])
    # The shell's facts win; the agent fills what a minimal shell could not tell.
    report.arch = report.arch or fp.get("arch")
    report.cores = report.cores or fp.get("cores")
    report.kernel = report.kernel or fp.get("kernel")
    if report.memory_mb is None and fp.get("memory_mb") is not None:
        report.memory_mb = round(float(fp["memory_mb"]), 1)


def _add_warnings(report: DeviceCheck) -> None:
    if (
        report.usable
        and report.agent == "python"
        and not (report.runtimes.get("onnxruntime") or report.runtimes.get("mnn"))
    ):
        report.warnings.append("no runtime (onnxruntime or MNN) importable by the device's interpreter")
    for path, present in report.sensor_files.items():
        if not present:
            report.warnings.append(f"sensor file {path} named in the descriptor is not readable")


def _without_device_prefix(message: str, name: str) -> str:
    prefix = f"{name}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def check_devices(lab: Lab, names: list[str], timeout: float = HEALTH_TIMEOUT_S) -> list[DeviceCheck]:
    """Check devices in parallel (each call bounded by `timeout`); results in the order of `names`."""
    if not names:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(names))) as pool:
        return list(pool.map(lambda n: check_device(lab, n, timeout), names))


def failed(reports: list[DeviceCheck]) -> list[DeviceCheck]:
    """Devices that are unreachable or cannot run their agent: the CLI exits 3 when there are any."""
    return [r for r in reports if not (r.reachable and r.usable)]


CHECK_COLUMNS = ["device", "status", "system", "python / runtimes", "sensors"]


def check_rows(reports: list[DeviceCheck]) -> list[list[Any]]:
    """Table rows for CHECK_COLUMNS: compact cells (readable at 80 columns), status naming the reason."""
    short = {"onnxruntime": "ort", "mnn": "mnn", "numpy": "numpy"}
    rows = []
    for r in reports:
        system = [
            r.arch,
            f"{r.cores} cores" if r.cores else None,
            f"{r.memory_mb:.0f} MB" if r.memory_mb is not None else None,
            r.kernel,
        ]
        if (r.arch or "").startswith(("aarch64", "arm")):  # Arm: its SIMD features and big.LITTLE clusters
            system += [" ".join(r.cpu_flags) or None, cluster_summary(r.cpu_clusters) or None]
        versions = [f"py {r.python}"] if r.python else []
        versions += [f"{short[k]} {v}" for k, v in r.runtimes.items() if k in short]
        sensors = [f"{k.split('_')[0]} {v}" for k, v in r.sensors.items()]
        rows.append(
            [
                f"{r.name} ({r.transport})",
                r.status,
                ", ".join(x for x in system if x) or None,
                ", ".join(versions) or None,
                ", ".join(sensors) or None,
            ]
        )
    return rows
