"""On-device sensor samplers: thermal zones, cpufreq, battery fuel gauge, hwmon rails, Android thermal HAL.

Everything is read from sysfs under `sysfs_root` (a lab can point it at a mirror, tests at a sandbox
tree) by a background thread every `period_s` (250 ms by default). Timestamps come from this device's
monotonic clock, so they line up with the inference timestamps the agent takes on the same clock.

Units are converted at the source: temperatures to °C (sysfs gives millidegrees), frequencies to MHz
(kHz), currents to mA (fuel gauge µA, hwmon mA), voltages to V (fuel gauge µV, hwmon mV), power to mW
(µW). Currents keep the kernel's sign: which sign means "discharging" differs between kernels and is
calibrated by the host from status and load.

Standard library only: this module ships inside the agent zipapp.
"""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PERIOD_S = 0.25
DUMPSYS_PERIOD_S = 5.0
CHARGING_STATUSES = ("Charging", "Full", "Not charging")
# A zone reading outside this range (after unit conversion) is a disabled or broken sensor.
PLAUSIBLE_C = (-60.0, 250.0)


@dataclass
class Channel:
    """One numeric sensor file: what it measures, its unit and how to turn its raw text into that unit."""

    id: str
    metric: str  # temp_c | freq_mhz | freq_cap_mhz | freq_hw_mhz | current_ma | voltage_v | power_mw
    unit: str
    path: str
    scale: float
    labels: dict[str, str] = field(default_factory=dict)

    def read(self) -> float | None:
        raw = read_number(self.path)
        return None if raw is None else raw * self.scale

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "metric": self.metric,
            "unit": self.unit,
            "labels": self.labels,
            "path": self.path,
        }


@dataclass
class StatusFile:
    """A text sensor (battery status, charger online) recorded only when it changes."""

    id: str
    path: str


@dataclass
class SensorSet:
    """The sensors found on this device, and what could not be found."""

    root: str
    channels: list[Channel] = field(default_factory=list)
    statuses: list[StatusFile] = field(default_factory=list)
    static: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def of(self, metric: str) -> list[Channel]:
        return [c for c in self.channels if c.metric == metric]

    def read_temps(self) -> dict[str, float]:
        """Current temperature of every zone, °C (zones that fail to read are left out)."""
        out = {}
        for ch in self.of("temp_c"):
            value = ch.read()
            if value is not None and PLAUSIBLE_C[0] < value < PLAUSIBLE_C[1]:
                out[ch.labels.get("zone", ch.id)] = value
        return out


# ---- reading -------------------------------------------------------------------------------------
def read_text(path: str) -> str | None:
    try:
        with open(path, errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def read_number(path: str) -> float | None:
    text = read_text(path)
    if not text:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        return None


def under_root(root: str, path: str) -> str:
    """A device path resolved under the sysfs root ("/" leaves it as is)."""
    if not root or root == "/":
        return path
    return os.path.join(root, path.lstrip("/"))


def cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> "0-3,6" (the kernel's own list format)."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_cpu_list(text: str | None) -> list[int]:
    cpus: list[int] = []
    for part in (text or "").replace(" ", ",").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            cpus += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
        except ValueError:
            continue
    return cpus


def temperature_scale(raw: float) -> float:
    """sysfs zones give millidegrees; a few drivers give tenths or whole degrees."""
    if abs(raw) >= 1000:
        return 0.001
    if abs(raw) >= 200:
        return 0.1
    return 1.0 if raw != 0 else 0.001


def _numbered(pattern: str) -> list[str]:
    """glob sorted by the number in the last path element (thermal_zone10 after thermal_zone9)."""

    def key(path: str) -> tuple[int, str]:
        digits = re.findall(r"\d+", os.path.basename(path.rstrip("/")))
        return (int(digits[-1]) if digits else -1, path)

    return sorted(glob.glob(pattern), key=key)


# ---- discovery -----------------------------------------------------------------------------------
def discover_thermal(root: str, wanted: str | list[str], found: SensorSet) -> None:
    """Thermal zones whose temperature reads; `wanted` is "auto" or a list of zone types (or dir names)."""
    zones: list[tuple[str, str, float]] = []
    for zdir in _numbered(under_root(root, "/sys/class/thermal/thermal_zone*")):
        raw = read_number(os.path.join(zdir, "temp"))
        if raw is None:
            continue
        scale = temperature_scale(raw)
        if not PLAUSIBLE_C[0] < raw * scale < PLAUSIBLE_C[1]:
            continue
        zone_type = read_text(os.path.join(zdir, "type")) or os.path.basename(zdir)
        zones.append((zone_type, zdir, scale))
    if wanted != "auto":
        names = set(wanted)
        chosen = [z for z in zones if z[0] in names or os.path.basename(z[1]) in names]
        missing = names - {z[0] for z in chosen} - {os.path.basename(z[1]) for z in chosen}
        if missing:
            have = ", ".join(sorted({z[0] for z in zones})) or "none"
            found.warnings.append(f"thermal zones not found: {', '.join(sorted(missing))} (have: {have})")
        zones = chosen
    seen: dict[str, int] = {}
    for zone_type, zdir, scale in zones:
        seen[zone_type] = seen.get(zone_type, 0) + 1
        # Two zones may share a type (e.g. two "cpu-thermal"): the directory name tells them apart.
        name = zone_type if seen[zone_type] == 1 else f"{zone_type}@{os.path.basename(zdir)}"
        found.channels.append(
            Channel(f"temp:{name}", "temp_c", "C", os.path.join(zdir, "temp"), scale, {"zone": name})
        )
    if wanted == "auto" and not zones:
        discover_hwmon_temps(root, found)


def discover_hwmon_temps(root: str, found: SensorSet) -> None:
    """Boards without thermal zones (many x86 hosts) expose temperatures as hwmon temp*_input (m°C)."""
    for chip in _numbered(under_root(root, "/sys/class/hwmon/hwmon*")):
        chip_name = read_text(os.path.join(chip, "name")) or os.path.basename(chip)
        for path in sorted(glob.glob(os.path.join(chip, "temp*_input"))):
            if read_number(path) is None:
                continue
            label = read_text(path.replace("_input", "_label")) or os.path.basename(path).split("_")[0]
            name = f"{chip_name}/{label}"
            found.channels.append(Channel(f"temp:{name}", "temp_c", "C", path, 0.001, {"zone": name}))


def _cpufreq_groups(root: str) -> list[tuple[list[int], str]]:
    """(CPUs, cpufreq dir) per frequency domain; per-CPU dirs that are one policy are merged."""
    by_dir: dict[str, list[int]] = {}
    for cpu_dir in glob.glob(under_root(root, "/sys/devices/system/cpu/cpu[0-9]*/cpufreq")):
        match = re.search(r"cpu(\d+)/cpufreq$", cpu_dir)
        if match and os.path.isdir(cpu_dir):
            by_dir.setdefault(os.path.realpath(cpu_dir), []).append(int(match.group(1)))
    for policy in glob.glob(under_root(root, "/sys/devices/system/cpu/cpufreq/policy[0-9]*")):
        real = os.path.realpath(policy)
        if real not in by_dir:
            cpus = parse_cpu_list(
                read_text(os.path.join(policy, "related_cpus"))
                or read_text(os.path.join(policy, "affected_cpus"))
            )
            by_dir[real] = cpus or [int(re.findall(r"\d+", os.path.basename(policy))[-1])]
    groups: dict[tuple[int, ...], str] = {}
    for path, cpus in by_dir.items():
        # A mirror made of copies (not symlinks) has one dir per CPU: group them by related_cpus.
        related = parse_cpu_list(read_text(os.path.join(path, "related_cpus"))) or cpus
        groups.setdefault(tuple(sorted(set(related) | set(cpus))), path)
    return sorted(((list(cpus), path) for cpus, path in groups.items()), key=lambda g: g[0][0])


def discover_cpufreq(root: str, found: SensorSet) -> None:
    """Current frequency, the cap (scaling_max_freq) and, when readable, the hardware's own reading."""
    limits: dict[str, dict[str, Any]] = {}
    for cpus, path in _cpufreq_groups(root):
        name = cpu_list(cpus)
        labels = {"cpus": name}
        for metric, fname in (
            ("freq_mhz", "scaling_cur_freq"),
            ("freq_cap_mhz", "scaling_max_freq"),
            ("freq_hw_mhz", "cpuinfo_cur_freq"),
        ):
            fpath = os.path.join(path, fname)
            if read_number(fpath) is not None:
                found.channels.append(Channel(f"{metric}:{name}", metric, "MHz", fpath, 0.001, dict(labels)))
        limit = {
            k: read_number(os.path.join(path, f))
            for k, f in (("cpuinfo_max_mhz", "cpuinfo_max_freq"), ("cpuinfo_min_mhz", "cpuinfo_min_freq"))
        }
        group: dict[str, Any] = {k: v / 1000.0 for k, v in limit.items() if v is not None}
        group["governor"] = read_text(os.path.join(path, "scaling_governor"))
        limits[name] = group
    if limits:
        found.static["cpufreq"] = limits


def _supply_scales(supply_dir: str) -> tuple[float, float]:
    """(current -> mA, voltage -> V). The ABI says µA and µV; a few old gauges report mA and mV."""
    volts = read_number(os.path.join(supply_dir, "voltage_now"))
    if volts is not None and 0 < abs(volts) < 100_000:
        return 1.0, 0.001  # mV (e.g. 3850), so the current is in mA too
    return 0.001, 1e-6


def discover_supplies(root: str, found: SensorSet) -> None:
    """Battery fuel gauges (current_now, voltage_now, status) and chargers' `online`."""
    for sdir in sorted(glob.glob(under_root(root, "/sys/class/power_supply/*"))):
        name = os.path.basename(sdir)
        kind = read_text(os.path.join(sdir, "type")) or ""
        if kind == "Battery" and read_text(os.path.join(sdir, "scope")) == "Device":
            continue  # a peripheral's battery (a wireless mouse), not the device's own
        if kind == "Battery":
            ma, volt = _supply_scales(sdir)
            labels = {"supply": name}
            current = os.path.join(sdir, "current_now")
            voltage = os.path.join(sdir, "voltage_now")
            power = os.path.join(sdir, "power_now")
            if read_number(current) is not None:
                found.channels.append(
                    Channel(f"current:{name}", "current_ma", "mA", current, ma, dict(labels))
                )
            if read_number(voltage) is not None:
                found.channels.append(
                    Channel(f"voltage:{name}", "voltage_v", "V", voltage, volt, dict(labels))
                )
            if read_number(power) is not None:  # some laptop gauges give power instead of current
                found.channels.append(Channel(f"power:{name}", "power_mw", "mW", power, 0.001, dict(labels)))
            if os.path.exists(os.path.join(sdir, "status")):
                found.statuses.append(StatusFile(f"status:{name}", os.path.join(sdir, "status")))
        elif kind in ("Mains", "USB", "Wireless", "USB_PD", "USB_C") and os.path.exists(
            os.path.join(sdir, "online")
        ):
            found.statuses.append(StatusFile(f"online:{name}", os.path.join(sdir, "online")))


HWMON_KINDS = (
    ("in", "voltage_v", "V", 0.001),
    ("curr", "current_ma", "mA", 1.0),
    ("power", "power_mw", "mW", 0.001),
)


def discover_hwmon_rails(root: str, found: SensorSet) -> None:
    """INA219/INA3221-style rails: in*_input (mV), curr*_input (mA), power*_input (µW), with *_label."""
    for chip in _numbered(under_root(root, "/sys/class/hwmon/hwmon*")):
        chip_name = read_text(os.path.join(chip, "name")) or os.path.basename(chip)
        for prefix, metric, unit, scale in HWMON_KINDS:
            for path in sorted(glob.glob(os.path.join(chip, f"{prefix}[0-9]*_input"))):
                index = re.findall(r"\d+", os.path.basename(path))[0]
                if read_number(path) is None:
                    continue
                # INA3221 labels only in*_label: the current and power of channel N share that label.
                label = (
                    read_text(os.path.join(chip, f"{prefix}{index}_label"))
                    or read_text(os.path.join(chip, f"in{index}_label"))
                    or f"{prefix}{index}"
                )
                rail = f"{chip_name}/{label}"
                found.channels.append(
                    Channel(
                        f"{metric}:{rail}@{os.path.basename(chip)}",
                        metric,
                        unit,
                        path,
                        scale,
                        {"rail": rail, "chip": os.path.basename(chip), "channel": index},
                    )
                )


def power_file_channel(root: str, role: str, path: str) -> Channel | None:
    """A descriptor-named power file: its unit follows from its name (sysfs ABI vs hwmon)."""
    full = under_root(root, path)
    base = os.path.basename(full)
    table = [
        (r"^power\d*_input$", "power_mw", "mW", 0.001),
        (r"^power_now$", "power_mw", "mW", 0.001),
        (r"^curr\d*_input$", "current_ma", "mA", 1.0),
        (r"^in\d*_input$", "voltage_v", "V", 0.001),
        (r"^current_(now|avg)$", "current_ma", "mA", None),
        (r"^voltage_(now|avg|ocv)$", "voltage_v", "V", None),
    ]
    for pattern, metric, unit, scale in table:
        if re.match(pattern, base):
            if scale is None:
                ma, volt = _supply_scales(os.path.dirname(full))
                scale = ma if metric == "current_ma" else volt
            return Channel(
                f"{metric}:descriptor", metric, unit, full, scale, {"source": "descriptor", "role": role}
            )
    # Unknown name: take the role at face value in the fuel-gauge ABI units.
    metric, unit, scale = ("current_ma", "mA", 0.001) if role == "current" else ("voltage_v", "V", 1e-6)
    return Channel(f"{metric}:descriptor", metric, unit, full, scale, {"source": "descriptor", "role": role})


def discover_descriptor_power(root: str, config: dict[str, Any], found: SensorSet) -> None:
    for role in ("current", "voltage"):
        path = config.get(role)
        if not path:
            continue
        channel = power_file_channel(root, role, path)
        if channel is None or read_number(channel.path) is None:
            found.warnings.append(f"sensors.power.{role} {path} is not readable under {root}")
            continue
        found.channels.append(channel)
        status = os.path.join(os.path.dirname(channel.path), "status")
        if os.path.exists(status) and not any(s.path == status for s in found.statuses):
            found.statuses.append(
                StatusFile(f"status:{os.path.basename(os.path.dirname(channel.path))}", status)
            )


def discover(config: dict[str, Any]) -> SensorSet:
    """Every sensor the task's `sensors` config asks for and the device has."""
    root = config.get("sysfs_root") or "/"
    found = SensorSet(root=root)
    discover_thermal(root, config.get("thermal_zones", "auto"), found)
    discover_cpufreq(root, found)
    discover_descriptor_power(root, config, found)
    discover_supplies(root, found)
    discover_hwmon_rails(root, found)
    return found


# ---- Android thermal service ---------------------------------------------------------------------
_HAL_TEMP = re.compile(
    r"Temperature\{mValue=([-\d.]+),\s*mType=(-?\d+),\s*mName=([^,}]+)(?:,\s*mStatus=(-?\d+))?"
)


def parse_thermalservice(text: str) -> dict[str, Any]:
    """`dumpsys thermalservice`: the throttling status and the HAL's current temperatures."""
    status = None
    match = re.search(r"Thermal Status:\s*(-?\d+)", text)
    if match:
        status = int(match.group(1))
    temps: dict[str, float] = {}
    section = text.split("Current temperatures from HAL:", 1)
    body = section[1] if len(section) == 2 else ""
    body = re.split(r"\n\s*\n|Current cooling devices|Temperature static thresholds", body)[0]
    for m in _HAL_TEMP.finditer(body):
        temps[m.group(3).strip()] = float(m.group(1))
    return {"status": status, "temps": temps}


def dumpsys_path() -> str | None:
    return shutil.which("dumpsys")


# ---- sampling ------------------------------------------------------------------------------------
class Sampler:
    """A background thread reading every channel each `period_s`, on the monotonic clock.

    Times are seconds since `origin` (a time.monotonic() value the caller chooses, e.g. the start of
    the measurement), so sensor and inference timestamps share one axis.
    """

    def __init__(
        self,
        sensors: SensorSet,
        period_s: float = DEFAULT_PERIOD_S,
        origin: float | None = None,
        dumpsys: bool = True,
    ) -> None:
        self.sensors = sensors
        self.period_s = max(0.01, float(period_s))
        self.origin = time.monotonic() if origin is None else origin
        self.t: list[float] = []
        self.values: list[list[float | None]] = [[] for _ in sensors.channels]
        self.status_changes: dict[str, list[list[Any]]] = {s.id: [] for s in sensors.statuses}
        self.late = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edgebench-sampler", daemon=True)
        self._dumpsys = dumpsys_path() if dumpsys else None
        self._android: dict[str, Any] = {"status": [], "temps": {}}
        self._dumpsys_thread = (
            threading.Thread(target=self._dumpsys_loop, name="edgebench-dumpsys", daemon=True)
            if self._dumpsys
            else None
        )

    def sample_now(self) -> None:
        now = time.monotonic() - self.origin
        self.t.append(now)
        for series, channel in zip(self.values, self.sensors.channels, strict=True):
            series.append(channel.read())
        for status in self.sensors.statuses:
            text = read_text(status.path)
            changes = self.status_changes[status.id]
            if not changes or changes[-1][1] != text:
                changes.append([now, text])

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while True:
            self.sample_now()
            next_tick += self.period_s
            now = time.monotonic()
            if next_tick < now:  # the device was too busy to sample on time: skip the missed ticks
                self.late += 1
                next_tick = now + self.period_s
            if self._stop.wait(next_tick - now):
                return

    def _dumpsys_loop(self) -> None:
        while True:
            self._poll_dumpsys()
            if self._stop.wait(DUMPSYS_PERIOD_S):
                return

    def _poll_dumpsys(self) -> None:
        try:
            out = subprocess.run(
                [self._dumpsys or "dumpsys", "thermalservice"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return
        parsed = parse_thermalservice(out)
        now = time.monotonic() - self.origin
        if parsed["status"] is not None:
            self._android["status"].append([now, parsed["status"]])
        for name, value in parsed["temps"].items():
            self._android["temps"].setdefault(name, []).append([now, value])

    def start(self) -> Sampler:
        self._thread.start()
        if self._dumpsys_thread:
            self._dumpsys_thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop the thread (after one last reading) and return the log."""
        self._stop.set()
        self._thread.join()
        if self._dumpsys_thread:
            self._dumpsys_thread.join()
        self.sample_now()
        return self.log()

    def log(self) -> dict[str, Any]:
        channels = []
        for channel, series in zip(self.sensors.channels, self.values, strict=True):
            channels.append({**channel.describe(), "values": [_round(v, 4) for v in series]})
        log: dict[str, Any] = {
            "clock": "monotonic",
            "period_s": self.period_s,
            "origin": self.origin,
            "late_ticks": self.late,
            "t": [round(t, 4) for t in self.t],
            "channels": channels,
            "status": self.status_changes,
            "static": self.sensors.static,
            "warnings": list(self.sensors.warnings),
        }
        if self._dumpsys:
            log["android_thermal"] = self._android
        return log


def _round(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def battery_status(sensors: SensorSet) -> tuple[str | None, str | None]:
    """(status, supply) of the first battery that reports one."""
    for status in sensors.statuses:
        if status.id.startswith("status:"):
            text = read_text(status.path)
            if text:
                return text, status.id.split(":", 1)[1]
    return None, None
