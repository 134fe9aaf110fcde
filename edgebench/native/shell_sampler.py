"""Sensor sampling without Python: a loop in the device's own `sh` (toybox or busybox).

The loop reads the same sysfs files the agent's sampler reads (thermal zones, cpufreq, power supplies,
hwmon rails) under the descriptor's sysfs_root and stamps each tick with the device clock
(/proc/uptime). It first prints a snapshot of every candidate file; the host rebuilds that snapshot as a
folder and runs the agent's own sensor discovery on it, so channel names, units and scales are exactly
those of the Python sampler, and the log it returns has the Python sampler's shape.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..agent.sensors import discover
from ..errors import TransportError
from ..lab.device import Device

# Arguments: $1 sysfs root (ending in /), $2 interval in seconds, $3 ticks, $4 output file.
# Only positional parameters carry data into the script: nothing is spliced into its text.
SAMPLER_SCRIPT = r"""
root=$1; interval=$2; count=$3; out=$4
cd "$root" || exit 1
statics='sys/class/thermal/thermal_zone*/type
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/related_cpus
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/affected_cpus
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_max_freq
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_min_freq
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor
 sys/devices/system/cpu/cpufreq/policy[0-9]*/related_cpus
 sys/devices/system/cpu/cpufreq/policy[0-9]*/affected_cpus
 sys/devices/system/cpu/cpufreq/policy[0-9]*/cpuinfo_max_freq
 sys/devices/system/cpu/cpufreq/policy[0-9]*/cpuinfo_min_freq
 sys/devices/system/cpu/cpufreq/policy[0-9]*/scaling_governor
 sys/class/power_supply/*/type
 sys/class/power_supply/*/scope
 sys/class/hwmon/hwmon*/name
 sys/class/hwmon/hwmon*/*_label'
dynamics='sys/class/thermal/thermal_zone*/temp
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_max_freq
 sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_cur_freq
 sys/devices/system/cpu/cpufreq/policy[0-9]*/scaling_cur_freq
 sys/devices/system/cpu/cpufreq/policy[0-9]*/scaling_max_freq
 sys/devices/system/cpu/cpufreq/policy[0-9]*/cpuinfo_cur_freq
 sys/class/power_supply/*/current_now
 sys/class/power_supply/*/voltage_now
 sys/class/power_supply/*/power_now
 sys/class/power_supply/*/status
 sys/class/power_supply/*/online
 sys/class/hwmon/hwmon*/in[0-9]*_input
 sys/class/hwmon/hwmon*/curr[0-9]*_input
 sys/class/hwmon/hwmon*/power[0-9]*_input
 sys/class/hwmon/hwmon*/temp[0-9]*_input'
{
  for f in $statics; do [ -r "$f" ] && read -r v < "$f" && printf 'S\t%s\t%s\n' "$f" "$v"; done
  i=0
  while [ "$i" -lt "$count" ] && [ ! -e "$out.stop" ]; do
    read -r up _ < /proc/uptime
    printf 'T\t%s\n' "$up"
    for f in $dynamics; do [ -r "$f" ] && read -r v < "$f" && printf 'V\t%s\t%s\n' "$f" "$v"; done
    i=$((i+1))
    sleep "$interval"
  done
} >> "$out"
"""

_TEXT_DYNAMICS = ("status", "online")


@dataclass
class ShellTrace:
    """The sampler's output: static file contents and, per tick, (device time, {relpath: raw text})."""

    static: dict[str, str] = field(default_factory=dict)
    ticks: list[tuple[float, dict[str, str]]] = field(default_factory=list)


@dataclass
class SamplerHandle:
    """A sampler running as a foreground command in a host thread: it dies with the connection, so a
    lost host never leaves a loop behind on the device."""

    output: str
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)


def parse_sampler_output(text: str) -> ShellTrace:
    """Parse the sampler's lines; a final line without its newline (the loop died mid-write) is dropped."""
    trace = ShellTrace()
    for line in text.split("\n")[:-1]:
        parts = line.split("\t")
        try:
            if parts[0] == "S" and len(parts) == 3:
                trace.static[parts[1]] = parts[2]
            elif parts[0] == "T" and len(parts) == 2:
                trace.ticks.append((float(parts[1]), {}))
            elif parts[0] == "V" and len(parts) == 3 and trace.ticks:
                trace.ticks[-1][1][parts[1]] = parts[2]
        except ValueError:
            continue
    return trace


def sensor_log(trace: ShellTrace, config: dict[str, Any], period_s: float) -> dict[str, Any]:
    """The Python sampler's log, built from the shell trace with the agent's own discovery."""
    if not trace.ticks:
        return {
            "clock": "device uptime",
            "period_s": period_s,
            "origin": 0.0,
            "t": [],
            "channels": [],
            "status": {},
            "static": {},
            "warnings": ["the shell sampler recorded no tick"],
            "late_ticks": 0,
        }
    with tempfile.TemporaryDirectory(prefix="edgebench-sysfs-") as snap:
        # The first tick's values and the static files, laid out as a sysfs tree for discovery.
        for rel, value in {**trace.ticks[0][1], **trace.static}.items():
            path = os.path.join(snap, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(value + "\n")
        found = discover({**config, "sysfs_root": snap})
        rel_of = {id(c): os.path.relpath(c.path, snap) for c in found.channels}
        rel_status = {s.id: os.path.relpath(s.path, snap) for s in found.statuses}
    origin = trace.ticks[0][0]
    channels = []
    for c in found.channels:
        values = [_scaled(tick.get(rel_of[id(c)]), c.scale) for _, tick in trace.ticks]
        channels.append({**c.describe(), "path": "/" + rel_of[id(c)], "values": values})
    status: dict[str, list[list[Any]]] = {}
    for sid, rel in rel_status.items():
        changes: list[list[Any]] = []
        for t, tick in trace.ticks:
            text = tick.get(rel)
            if not changes or changes[-1][1] != text:
                changes.append([round(t - origin, 4), text])
        status[sid] = changes
    return {
        "clock": "device uptime",
        "period_s": period_s,
        "origin": origin,
        "late_ticks": 0,
        "t": [round(t - origin, 4) for t, _ in trace.ticks],
        "channels": channels,
        "status": status,
        "static": found.static,
        "warnings": list(found.warnings),
    }


def _scaled(raw: str | None, scale: float) -> float | None:
    try:
        return round(float(raw) * scale, 4) if raw is not None else None
    except ValueError:
        return None


def start_sampler(device: Device, period_s: float, duration_s: float, timeout: float) -> SamplerHandle:
    """Start the loop for at most `duration_s`; returns once its first tick is on the device."""
    root = posixpath.join(device.spec.sensors.sysfs_root, "")
    out = posixpath.join(device.spec.workdir, f"sensors-{time.time_ns()}.log")
    ticks = max(1, int(duration_s / period_s) + 1)
    device.transport.run(["mkdir", "-p", device.spec.workdir], timeout=timeout).check(device.name)
    argv = ["sh", "-c", SAMPLER_SCRIPT, "sampler", root, f"{period_s:g}", str(ticks), out]
    handle = SamplerHandle(out, threading.Thread(target=lambda: None))

    def loop() -> None:
        try:
            device.transport.run(argv, timeout=duration_s + timeout)
        except BaseException as exc:  # noqa: BLE001 - reported by stop_sampler
            handle.errors.append(exc)

    handle.thread = threading.Thread(target=loop, name=f"shell-sampler-{device.name}", daemon=True)
    handle.thread.start()
    _wait_for_first_tick(device, handle, timeout)
    return handle


def _wait_for_first_tick(device: Device, handle: SamplerHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = device.transport.run(["grep", "-c", "^T", handle.output], timeout=timeout)
        if res.stdout.strip() not in ("", "0"):
            return
        if not handle.thread.is_alive():
            break
        time.sleep(0.05)
    if handle.errors:
        raise handle.errors[0]
    raise TransportError("the shell sensor sampler did not start", device=device.name)


def stop_sampler(device: Device, handle: SamplerHandle, timeout: float) -> ShellTrace:
    """Stop the loop (if still running), read what it wrote, and remove its files."""
    # A stop file, not a signal: the loop ends at its next tick, whatever pid namespace it runs in.
    device.transport.run(["touch", handle.output + ".stop"], timeout=timeout)
    handle.thread.join(timeout)
    text = device.transport.read_text(handle.output, timeout=timeout)
    device.transport.run(["rm", "-f", handle.output, handle.output + ".stop"], timeout=timeout)
    return parse_sampler_output(text)
