"""Sensor sampling without Python: a loop in the device's own `sh` (toybox or busybox).

It reads the same sysfs files as the agent's sampler (thermal zones, cpufreq, power supplies, hwmon rails)
under the descriptor's sysfs_root, stamps each line with the device clock (/proc/uptime), and appends to a
file in the workdir; the host starts it in the background, pulls the file and parses it.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field

from ..device import Device
from ..errors import TransportError

# Arguments: $1 sysfs root (ending in /), $2 interval in seconds, $3 samples, $4 output file.
# Only positional parameters carry data into the script: nothing is spliced into its text.
SAMPLER_SCRIPT = r"""
root=$1; interval=$2; count=$3; out=$4
i=0
: > "$out"
while [ "$i" -lt "$count" ]; do
  read up _ < /proc/uptime
  for z in "$root"sys/class/thermal/thermal_zone*; do
    [ -r "$z/temp" ] || continue
    read t < "$z/temp" || continue
    ty=${z##*/}; [ -r "$z/type" ] && read ty < "$z/type"
    echo "$up T ${z##*/} $t $ty"
  done
  for c in "$root"sys/devices/system/cpu/cpu[0-9]*; do
    f=$c/cpufreq; [ -r "$f/scaling_cur_freq" ] || continue
    read cur < "$f/scaling_cur_freq"
    mx=-; [ -r "$f/scaling_max_freq" ] && read mx < "$f/scaling_max_freq"
    hw=-; [ -r "$f/cpuinfo_max_freq" ] && read hw < "$f/cpuinfo_max_freq"
    ci=-; [ -r "$f/cpuinfo_cur_freq" ] && read ci < "$f/cpuinfo_cur_freq"
    echo "$up F ${c##*/} $cur $mx $hw $ci"
  done
  for p in "$root"sys/class/power_supply/*; do
    [ -r "$p/current_now" ] || continue
    read cu < "$p/current_now"
    vo=-; [ -r "$p/voltage_now" ] && read vo < "$p/voltage_now"
    st=-; [ -r "$p/status" ] && read st < "$p/status"
    echo "$up P ${p##*/} $cu $vo $st"
  done
  for h in "$root"sys/class/hwmon/hwmon*; do
    for f in "$h"/in*_input "$h"/curr*_input "$h"/power*_input; do
      [ -r "$f" ] || continue
      read v < "$f"
      n=${f##*/}; lb=${n%_input}_label; lab=-; [ -r "$h/$lb" ] && read lab < "$h/$lb"
      echo "$up H ${h##*/} $n $v $lab"
    done
  done
  i=$((i+1))
  sleep "$interval"
done >> "$out"
"""

# Starts the sampler detached from the transport's session and prints its pid.
LAUNCHER = 'script=$1; shift; nohup sh -c "$script" sampler "$@" </dev/null >/dev/null 2>&1 & echo $!'


@dataclass
class SensorTrace:
    """Readings by kind, each a list of (t_s on the device clock, ...)."""

    temps: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # zone type -> (t, °C)
    freqs: dict[str, list[tuple[float, float, float | None]]] = field(default_factory=dict)  # cpu -> (t, MHz, cap)
    supplies: dict[str, list[tuple[float, float, float | None, str]]] = field(default_factory=dict)  # (t, µA, µV, st)
    rails: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # "hwmon0/curr1_input" -> (t, raw)

    def start(self) -> float | None:
        times = [s[0] for series in (*self.temps.values(), *self.freqs.values(), *self.supplies.values(),
                                     *self.rails.values()) for s in series]
        return min(times) if times else None


@dataclass(frozen=True)
class SamplerHandle:
    pid: int
    output: str
    started: float


def parse_sampler_output(text: str) -> SensorTrace:
    """Parse the sampler's lines; malformed or partial lines (the loop was killed mid-write) are skipped."""
    trace = SensorTrace()
    lines = text.split("\n")
    # The last line is complete only if the text ends with a newline (the loop may die mid-write).
    for line in lines[:-1]:
        parts = line.split()
        try:
            t, kind = float(parts[0]), parts[1]
            if kind == "T":
                zone_type = " ".join(parts[4:]) or parts[2]
                trace.temps.setdefault(zone_type, []).append((t, int(parts[3]) / 1000.0))
            elif kind == "F":
                cap = None if parts[4] == "-" else int(parts[4]) / 1000.0
                trace.freqs.setdefault(parts[2], []).append((t, int(parts[3]) / 1000.0, cap))
            elif kind == "P":
                volts = None if parts[4] == "-" else float(parts[4])
                trace.supplies.setdefault(parts[2], []).append((t, float(parts[3]), volts, parts[5]))
            elif kind == "H":
                trace.rails.setdefault(f"{parts[2]}/{parts[3]}", []).append((t, float(parts[4])))
        except (IndexError, ValueError):
            continue
    return trace


def start_sampler(device: Device, interval_s: float, duration_s: float, timeout: float) -> SamplerHandle:
    root = posixpath.join(device.spec.sensors.sysfs_root, "")
    out = posixpath.join(device.spec.workdir, f"sensors-{time.time_ns()}.log")
    count = max(1, int(duration_s / interval_s) + 1)
    device.transport.run(["mkdir", "-p", device.spec.workdir], timeout=timeout).check(device.name)
    res = device.transport.run(["sh", "-c", LAUNCHER, "sh", SAMPLER_SCRIPT, root, f"{interval_s:g}", str(count),
                                out], timeout=timeout).check(device.name)
    try:
        pid = int(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise TransportError(f"sensor sampler did not start: {res.stdout!r}", device=device.name) from None
    return SamplerHandle(pid, out, time.monotonic())


def stop_sampler(device: Device, handle: SamplerHandle, timeout: float) -> SensorTrace:
    """Stop the loop (if still running), read what it wrote, and remove the file."""
    device.transport.run(["kill", str(handle.pid)], timeout=timeout)
    text = device.transport.read_text(handle.output, timeout=timeout)
    device.transport.run(["rm", "-f", handle.output], timeout=timeout)
    return parse_sampler_output(text)
