"""A sandbox sysfs tree driven by real load: thermal zones, cpufreq, a battery fuel gauge, an INA rail.

    python -m edgebench.testing.sysfs_sim --root DIR [--cap-at S] [--burners N] [--charging] ...
    python -m edgebench.testing.sysfs_sim --root DIR --monitor [--hz 20]    # an external power monitor

The first form builds DIR/sys/... (the layout the kernel uses: class/thermal/thermal_zone*,
devices/system/cpu/cpufreq/policy* with cpuN/cpufreq symlinks, class/power_supply/{battery,usb},
class/hwmon/hwmon0 as an INA3221) and then, every `--period` seconds, reads the CPU utilisation u from
/proc/stat and writes what a phone's sensors would show:

    frequency   cur = min(cap, fmin + (fmax - fmin) * min(1, 1.25 u))       scaling_cur_freq (kHz)
    temperature dT/dt = (idle + heat * u * cur/fmax - T) / tau               thermal_zone*/temp (m°C)
    current     draw = idle_ma + ma_per_util * u                             current_now (µA)
    voltage     V = volts - r_ohm * draw                                     voltage_now (µV)

At `--cap-at S` seconds (or on SIGUSR1, or when the hottest zone passes `--trip-c`) scaling_max_freq
drops to `--cap-khz`; `--burners N` starts N CPU-burning processes at that moment, so a model running
on the host really slows down. With `--charging` a charger feeds `--charge-ma` into the battery:
status "Charging" (or `--status`), usb/online = 1, and current_now reports the net flow. The sign of
current_now follows `--discharge-sign` (-1: discharge negative, as modern kernels report it).

Once running it prints one JSON line: {"event": "ready", "pid": ..., "root": DIR, "state": FILE,
"started": <monotonic s>}. The state file (JSON, rewritten every tick) holds the live values and the
moments events happened, on the host's monotonic clock; `--trace FILE` appends one CSV row per tick.
SIGTERM/SIGINT stop it (and its burners; burners also exit on their own when it dies).

`--monitor` instead prints CSV samples `t_s,current_ma,voltage_v` of the sandbox battery (t_s on the
monitor's own clock, from its start), as a Monsoon, Joulescope or INA board logger would.

`SysfsSim` is the Python handle tests use (start, state, trace, descriptor, stop).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

BURNER = (
    "import os,sys\nparent=int(sys.argv[1])\nwhile os.getppid()==parent:\n"
    "    for _ in range(200000):\n        pass\n"
)


@dataclass(frozen=True)
class SimConfig:
    """Everything the simulated board is built and driven with."""

    root: Path
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    policies: int = 1
    util_cpus: tuple[int, ...] = ()  # utilisation of these CPUs only (default: all)
    util_env: str | None = None  # "KEY=VALUE": only processes with it in their environment (plus burners)
    zones: tuple[str, ...] = ("cpu-thermal", "gpu-thermal", "battery")
    idle_c: float = 35.0
    start_c: float | None = None  # start this hot and cool down (default: at idle)
    heat_c: float = 40.0  # rise at full load and full frequency
    tau_s: float = 5.0
    fmin_khz: int = 600_000
    fmax_khz: int = 2_400_000
    cap_khz: int = 1_000_000
    cap_at_s: float | None = None
    trip_c: float | None = None
    burners: int = 0
    burner_cpus: tuple[int, ...] = ()
    battery: bool = True
    idle_ma: float = 150.0
    ma_per_util: float = 1200.0
    volts: float = 3.85
    r_ohm: float = 0.1
    discharge_sign: int = -1
    charging: bool = False
    charge_ma: float = 1500.0
    status: str | None = None
    hwmon: bool = True
    rail_mv: float = 5000.0
    period_s: float = 0.1
    duration_s: float | None = None
    state: Path | None = None
    trace: Path | None = None

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def state_path(self) -> Path:
        return self.state or self.root / "sysfs-sim.json"


# ---- the tree ------------------------------------------------------------------------------------
def write(path: Path, value: object) -> None:
    """Replace a sensor file at once, so a reader never sees half a value."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


def policy_cpus(cfg: SimConfig) -> list[list[int]]:
    """CPUs split into `policies` contiguous frequency domains."""
    count = max(1, min(cfg.policies, cfg.cpus))
    size, extra = divmod(cfg.cpus, count)
    groups, start = [], 0
    for i in range(count):
        n = size + (1 if i < extra else 0)
        groups.append(list(range(start, start + n)))
        start += n
    return groups


def build_tree(cfg: SimConfig) -> None:
    """Create the sysfs layout with idle values (idempotent)."""
    thermal = cfg.sys / "class" / "thermal"
    for i, name in enumerate(cfg.zones):
        zone = thermal / f"thermal_zone{i}"
        zone.mkdir(parents=True, exist_ok=True)
        write(zone / "type", name)
        write(zone / "mode", "enabled")
        write(zone / "temp", int(cfg.idle_c * 1000))
    cpu_root = cfg.sys / "devices" / "system" / "cpu"
    mirror_cpu_topology(cpu_root, cfg.cpus)
    for cpus in policy_cpus(cfg):
        policy = cpu_root / "cpufreq" / f"policy{cpus[0]}"
        policy.mkdir(parents=True, exist_ok=True)
        listed = " ".join(map(str, cpus))
        for name, value in (
            ("related_cpus", listed),
            ("affected_cpus", listed),
            ("cpuinfo_max_freq", cfg.fmax_khz),
            ("cpuinfo_min_freq", cfg.fmin_khz),
            ("scaling_max_freq", cfg.fmax_khz),
            ("scaling_min_freq", cfg.fmin_khz),
            ("scaling_cur_freq", cfg.fmin_khz),
            ("cpuinfo_cur_freq", cfg.fmin_khz),
            ("scaling_governor", "schedutil"),
        ):
            write(policy / name, value)
        for cpu in cpus:
            link = cpu_root / f"cpu{cpu}" / "cpufreq"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                # Relative, as the kernel makes them: it still resolves when the tree is mounted elsewhere.
                link.symlink_to(Path("..") / "cpufreq" / f"policy{cpus[0]}")
    supplies = cfg.sys / "class" / "power_supply"
    if cfg.battery:
        battery = supplies / "battery"
        battery.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("type", "Battery"),
            ("present", 1),
            ("capacity", 80),
            ("technology", "Li-ion"),
            ("status", "Discharging"),
            ("current_now", 0),
            ("voltage_now", int(cfg.volts * 1e6)),
        ):
            write(battery / name, value)
        usb = supplies / "usb"
        usb.mkdir(parents=True, exist_ok=True)
        write(usb / "type", "USB")
        write(usb / "online", 0)
    if cfg.hwmon:
        chip = cfg.sys / "class" / "hwmon" / "hwmon0"
        chip.mkdir(parents=True, exist_ok=True)
        write(chip / "name", "ina3221")
        for ch, label in ((1, "VDD_IN"), (2, "VDD_CPU")):
            write(chip / f"in{ch}_label", label)
            write(chip / f"in{ch}_input", int(cfg.rail_mv))
            write(chip / f"curr{ch}_input", 0)
            write(chip / f"power{ch}_input", 0)


def mirror_cpu_topology(cpu_root: Path, cpus: int) -> None:
    """possible/present/online and per-CPU topology and cache files, copied from the host when readable.

    Runtimes read them to size their thread pools; a device whose /sys is this tree still has them.
    """
    host = Path("/sys/devices/system/cpu")
    cpu_root.mkdir(parents=True, exist_ok=True)
    span = f"0-{cpus - 1}" if cpus > 1 else "0"
    for name in ("possible", "present", "online"):
        write(cpu_root / name, span)
    for cpu in range(cpus):
        for sub in ("topology", "cache"):
            src = host / f"cpu{cpu}" / sub
            if not src.is_dir():
                continue
            for path in src.rglob("*"):
                with contextlib.suppress(OSError):
                    if path.is_file() and not path.is_symlink():
                        dest = cpu_root / f"cpu{cpu}" / sub / path.relative_to(src)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(path.read_bytes())


# ---- the dynamics --------------------------------------------------------------------------------
class CpuMeter:
    """Utilisation (0..1) of the chosen CPUs from /proc/stat, between two calls."""

    def __init__(self, cpus: tuple[int, ...] = ()) -> None:
        self.names = {f"cpu{c}" for c in cpus} if cpus else {"cpu"}
        self.last = self._read()

    def _read(self) -> tuple[int, int]:
        busy = total = 0
        with open("/proc/stat") as fh:
            for line in fh:
                parts = line.split()
                if parts and parts[0] in self.names:
                    values = [int(v) for v in parts[1:]]
                    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
                    total += sum(values[:8])
                    busy += sum(values[:8]) - idle
        return busy, total

    def utilisation(self) -> float:
        busy, total = self._read()
        d_busy, d_total = busy - self.last[0], total - self.last[1]
        self.last = (busy, total)
        return min(1.0, max(0.0, d_busy / d_total)) if d_total > 0 else 0.0


class UtilWindow:
    """Mean utilisation over the last `span_s` seconds."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.points: list[tuple[float, float]] = []

    def add(self, now: float, util: float) -> float:
        self.points = [p for p in self.points if p[0] > now - self.span_s] + [(now, util)]
        return sum(u for _, u in self.points) / len(self.points)


class ProcMeter:
    """Utilisation (0..1 of `cpus` CPUs) of processes tagged with an environment entry, and of `extra` pids.

    The board's own load on a host that other work shares: a device descriptor's `env` tags the agent.
    """

    # A pid first seen between fork and exec still shows its parent's (untagged) environment; an
    # untagged pid is looked at again on every tick until it has been around this long.
    RECHECK_S = 10.0

    def __init__(self, tag: str, cpus: int) -> None:
        self.tag = tag.encode()
        self.cpus = max(1, cpus)
        self.tick_hz = os.sysconf("SC_CLK_TCK")
        self.extra: set[int] = set()
        self._tagged: dict[int, bool] = {}
        self._first_seen: dict[int, float] = {}
        self._ticks: dict[int, int] = {}
        self._last = time.monotonic()

    def _is_tagged(self, pid: int, now: float) -> bool:
        first = self._first_seen.setdefault(pid, now)
        if pid not in self._tagged or (not self._tagged[pid] and now - first < self.RECHECK_S):
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    self._tagged[pid] = self.tag in fh.read().split(b"\0")
            except OSError:
                self._tagged[pid] = False
        return self._tagged[pid]

    @staticmethod
    def _cpu_ticks(pid: int) -> int | None:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime (all threads)
        except (OSError, IndexError, ValueError):
            return None

    def utilisation(self) -> float:
        now = time.monotonic()
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        used = 0
        seen = {}
        for pid in pids:
            if pid not in self.extra and not self._is_tagged(pid, now):
                continue
            ticks = self._cpu_ticks(pid)
            if ticks is None:
                continue
            seen[pid] = ticks
            used += ticks - self._ticks.get(pid, ticks)
        alive = set(pids)
        self._tagged = {p: v for p, v in self._tagged.items() if p in alive}
        self._first_seen = {p: t for p, t in self._first_seen.items() if p in alive}
        self._ticks = seen
        elapsed, self._last = now - self._last, now
        return min(1.0, used / self.tick_hz / (elapsed * self.cpus)) if elapsed > 0 else 0.0


@dataclass
class SimState:
    started: float
    t: float = 0.0
    util: float = 0.0
    temp_c: float = 0.0
    freq_khz: int = 0
    cap_khz: int = 0
    draw_ma: float = 0.0
    current_ua: int = 0
    voltage_uv: int = 0
    status: str = "Discharging"
    capped_at: float | None = None  # monotonic
    burners_at: float | None = None
    burner_pids: list[int] = field(default_factory=list)
    ticks: int = 0


class Simulator:
    """Turns utilisation into sensor values and writes them; one `tick` per period."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        now = time.monotonic()
        self.state = SimState(
            started=now,
            temp_c=cfg.idle_c if cfg.start_c is None else cfg.start_c,
            freq_khz=cfg.fmin_khz,
            cap_khz=cfg.fmax_khz,
        )
        self.meter: CpuMeter | ProcMeter = (
            ProcMeter(cfg.util_env, cfg.cpus) if cfg.util_env else CpuMeter(cfg.util_cpus)
        )
        self.util_window = UtilWindow(max(cfg.period_s, 0.5))
        self.burners: list[subprocess.Popen] = []
        self._cap_requested = False
        self._trace = open(cfg.trace, "a", buffering=1) if cfg.trace else None
        if self._trace and self._trace.tell() == 0:
            self._trace.write(
                "t_monotonic,util,temp_c,freq_khz,cap_khz,draw_ma,current_ua,voltage_uv,status\n"
            )

    def request_cap(self) -> None:
        self._cap_requested = True

    def tick(self, dt: float) -> None:
        cfg, s = self.cfg, self.state
        now = time.monotonic()
        s.t, s.ticks = now, s.ticks + 1
        # Averaged over half a second: /proc tick counters are coarse over one 100 ms period.
        s.util = self.util_window.add(now, self.meter.utilisation())
        due = cfg.cap_at_s is not None and now - s.started >= cfg.cap_at_s
        hot = cfg.trip_c is not None and s.temp_c >= cfg.trip_c
        if s.capped_at is None and (due or hot or self._cap_requested):
            self.cap(now)
        s.freq_khz = int(
            min(s.cap_khz, cfg.fmin_khz + (cfg.fmax_khz - cfg.fmin_khz) * min(1.0, 1.25 * s.util))
        )
        s.freq_khz -= s.freq_khz % 1000
        target = cfg.idle_c + cfg.heat_c * s.util * s.freq_khz / cfg.fmax_khz
        s.temp_c += (target - s.temp_c) * min(1.0, dt / max(cfg.tau_s, 1e-3))
        s.draw_ma = cfg.idle_ma + cfg.ma_per_util * s.util
        charge = cfg.charge_ma if cfg.charging else 0.0
        s.current_ua = int(round(cfg.discharge_sign * (s.draw_ma - charge) * 1000))
        volts = cfg.volts - cfg.r_ohm * (s.draw_ma - charge) / 1000.0
        s.voltage_uv = int(round(volts * 1e6))
        s.status = cfg.status or ("Charging" if cfg.charging else "Discharging")
        self.write_files()
        self.write_state()

    def cap(self, now: float) -> None:
        s = self.state
        s.capped_at, s.cap_khz = now, self.cfg.cap_khz
        if self.cfg.burners:
            for _ in range(self.cfg.burners):
                # Each burner in its own session: with CFS autogroups a session shares the CPU as one
                # task, so burners in the simulator's session would together count as one.
                burner = subprocess.Popen(
                    [sys.executable, "-c", BURNER, str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                if self.cfg.burner_cpus:
                    os.sched_setaffinity(burner.pid, self.cfg.burner_cpus)
                self.burners.append(burner)
                if isinstance(self.meter, ProcMeter):
                    self.meter.extra.add(burner.pid)
            s.burners_at = time.monotonic()
            s.burner_pids = [p.pid for p in self.burners]

    def write_files(self) -> None:
        cfg, s = self.cfg, self.state
        thermal = cfg.sys / "class" / "thermal"
        for i, _name in enumerate(cfg.zones):
            # Zones further from the CPU see a smaller share of its heat.
            share = 1.0 / (1 + i)
            write(
                thermal / f"thermal_zone{i}" / "temp",
                int(round((cfg.idle_c + share * (s.temp_c - cfg.idle_c)) * 1000)),
            )
        cpu_root = cfg.sys / "devices" / "system" / "cpu" / "cpufreq"
        for cpus in policy_cpus(cfg):
            policy = cpu_root / f"policy{cpus[0]}"
            write(policy / "scaling_max_freq", s.cap_khz)
            write(policy / "scaling_cur_freq", s.freq_khz)
            write(policy / "cpuinfo_cur_freq", s.freq_khz)
        if cfg.battery:
            battery = cfg.sys / "class" / "power_supply" / "battery"
            write(battery / "current_now", s.current_ua)
            write(battery / "voltage_now", s.voltage_uv)
            write(battery / "status", s.status)
            write(cfg.sys / "class" / "power_supply" / "usb" / "online", 1 if cfg.charging else 0)
        if cfg.hwmon:
            chip = cfg.sys / "class" / "hwmon" / "hwmon0"
            board_mw = s.draw_ma * cfg.volts
            cpu_mw = max(0.0, s.draw_ma - cfg.idle_ma) * cfg.volts * 0.8
            for ch, mw in ((1, board_mw), (2, cpu_mw)):
                write(chip / f"curr{ch}_input", int(round(mw / cfg.rail_mv * 1000)))
                write(chip / f"power{ch}_input", int(round(mw * 1000)))

    def write_state(self) -> None:
        path = self.cfg.state_path
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self.state)))
        os.replace(tmp, path)
        if self._trace:
            s = self.state
            self._trace.write(
                f"{s.t:.4f},{s.util:.4f},{s.temp_c:.3f},{s.freq_khz},{s.cap_khz},{s.draw_ma:.3f},"
                f"{s.current_ua},{s.voltage_uv},{s.status}\n"
            )

    def stop(self) -> None:
        for proc in self.burners:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self.burners:
            proc.wait()
        self.burners.clear()
        if self._trace:
            self._trace.close()


def simulate(cfg: SimConfig, announce: bool = True) -> None:
    """Build the tree and drive it until SIGTERM/SIGINT or `duration_s`."""
    build_tree(cfg)
    sim = Simulator(cfg)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGUSR1, lambda *_: sim.request_cap())
    try:
        sim.tick(cfg.period_s)
        if announce:
            print(
                json.dumps(
                    {
                        "event": "ready",
                        "pid": os.getpid(),
                        "root": str(cfg.root),
                        "state": str(cfg.state_path),
                        "started": sim.state.started,
                    }
                ),
                flush=True,
            )
        next_tick = time.monotonic() + cfg.period_s
        last = time.monotonic()
        while not stopping:
            if cfg.duration_s is not None and time.monotonic() - sim.state.started >= cfg.duration_s:
                break
            time.sleep(max(0.0, next_tick - time.monotonic()))
            now = time.monotonic()
            sim.tick(now - last)
            last, next_tick = now, max(next_tick + cfg.period_s, now)
    finally:
        sim.stop()


def monitor(state_path: Path, hz: float, duration_s: float | None) -> None:
    """Print the simulated device's supply draw as `t_s,current_ma,voltage_v` lines, like a power monitor.

    A monitor sits in the supply line, so it sees the device's draw whether or not a charger is on.
    """
    print("t_s,current_ma,voltage_v", flush=True)
    start = time.monotonic()
    period = 1.0 / hz
    tick = 0
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stopping and (duration_s is None or time.monotonic() - start < duration_s):
        try:
            state = json.loads(state_path.read_text())
            line = f"{state['draw_ma']:.3f},{state['voltage_uv'] / 1e6:.4f}"
        except (OSError, ValueError, KeyError):
            line = None
        if line:
            print(f"{time.monotonic() - start:.4f},{line}", flush=True)
        tick += 1
        time.sleep(max(0.0, start + tick * period - time.monotonic()))


# ---- command line --------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m edgebench.testing.sysfs_sim", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--root", required=True, type=Path, help="sandbox root; the tree is ROOT/sys")
    p.add_argument("--monitor", action="store_true", help="print power-monitor samples instead of simulating")
    p.add_argument("--hz", type=float, default=20.0, help="monitor sample rate")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    p.add_argument("--policies", type=int, default=1, help="frequency domains the CPUs are split into")
    p.add_argument("--util-cpus", default="", help="measure utilisation of these CPUs only, e.g. 0,1")
    p.add_argument("--zones", default="cpu-thermal,gpu-thermal,battery")
    p.add_argument("--idle-c", type=float, default=35.0)
    p.add_argument("--start-c", type=float, default=None, help="start this hot (then cool with --tau)")
    p.add_argument("--heat-c", type=float, default=40.0, help="temperature rise at full load")
    p.add_argument("--tau", type=float, default=5.0, help="thermal time constant, s")
    p.add_argument("--fmin-khz", type=int, default=600_000)
    p.add_argument("--fmax-khz", type=int, default=2_400_000)
    p.add_argument("--cap-khz", type=int, default=1_000_000, help="scaling_max_freq once capped")
    p.add_argument("--cap-at", type=float, default=None, help="cap the frequency S seconds after start")
    p.add_argument("--trip-c", type=float, default=None, help="cap the frequency when this hot")
    p.add_argument("--burners", type=int, default=0, help="CPU burners started when the cap comes")
    p.add_argument("--burner-cpus", default="", help="pin the burners to these CPUs, e.g. 0")
    p.add_argument(
        "--util-env",
        default=None,
        help="KEY=VALUE: count only processes with this in their environment (and the burners)",
    )
    p.add_argument("--no-battery", action="store_true")
    p.add_argument("--no-hwmon", action="store_true")
    p.add_argument("--idle-ma", type=float, default=150.0)
    p.add_argument("--ma-per-util", type=float, default=1200.0, help="extra draw at 100%% utilisation")
    p.add_argument("--volts", type=float, default=3.85)
    p.add_argument("--r-ohm", type=float, default=0.1, help="battery internal resistance (voltage sag)")
    p.add_argument("--discharge-sign", type=int, choices=(-1, 1), default=-1)
    p.add_argument("--charging", action="store_true")
    p.add_argument("--charge-ma", type=float, default=1500.0)
    p.add_argument(
        "--status", default=None, help="battery status text to report (default follows --charging)"
    )
    p.add_argument("--period", type=float, default=0.1)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--state", type=Path, default=None)
    p.add_argument("--trace", type=Path, default=None)
    return p.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> SimConfig:
    return SimConfig(
        root=a.root,
        cpus=a.cpus,
        policies=a.policies,
        util_cpus=_cpus(a.util_cpus),
        util_env=a.util_env,
        burner_cpus=_cpus(a.burner_cpus),
        zones=tuple(z for z in a.zones.split(",") if z),
        idle_c=a.idle_c,
        start_c=a.start_c,
        heat_c=a.heat_c,
        tau_s=a.tau,
        fmin_khz=a.fmin_khz,
        fmax_khz=a.fmax_khz,
        cap_khz=a.cap_khz,
        cap_at_s=a.cap_at,
        trip_c=a.trip_c,
        burners=a.burners,
        battery=not a.no_battery,
        idle_ma=a.idle_ma,
        ma_per_util=a.ma_per_util,
        volts=a.volts,
        r_ohm=a.r_ohm,
        discharge_sign=a.discharge_sign,
        charging=a.charging,
        charge_ma=a.charge_ma,
        status=a.status,
        hwmon=not a.no_hwmon,
        period_s=a.period,
        duration_s=a.duration,
        state=a.state,
        trace=a.trace,
    )


def _cpus(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(",") if c.strip())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.monitor:
        monitor(args.state or args.root / "sysfs-sim.json", args.hz, args.duration)
    else:
        simulate(config_from_args(args))
    return 0


def toml_value(value: Any) -> str:
    """TOML for descriptor values: strings, numbers, booleans, lists and inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


# ---- the handle tests use ------------------------------------------------------------------------
_OPTION_NAMES = {"cap_at_s": "cap-at", "tau_s": "tau", "period_s": "period", "duration_s": "duration"}


class SysfsSim:
    """A running simulator process for a test: `with SysfsSim(tmp / "board", cap_at_s=8, burners=2) as sim:`.

    Keyword options are SimConfig fields. `sim.root` is the sandbox root (use it as `sysfs_root`),
    `sim.state()` the live values, `sim.trace()` every tick so far.
    """

    def __init__(self, root: Path, **options: Any) -> None:
        self.config = replace(SimConfig(root=Path(root)), **options)
        if self.config.trace is None:
            self.config = replace(self.config, trace=self.config.root / "sysfs-sim-trace.csv")
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}

    @property
    def root(self) -> Path:
        return self.config.root

    def argv(self) -> list[str]:
        cfg, default = self.config, SimConfig(root=self.config.root)
        argv = [sys.executable, "-m", "edgebench.testing.sysfs_sim", "--root", str(cfg.root)]
        for name, value in asdict(cfg).items():
            if name == "root" or value == getattr(default, name) and name not in ("cpus",):
                continue
            flag = "--" + _OPTION_NAMES.get(name, name.replace("_", "-"))
            if name in ("battery", "hwmon"):
                if not value:
                    argv.append(f"--no-{name}")
            elif isinstance(value, bool):
                if value:
                    argv.append(flag)
            elif isinstance(value, tuple):
                argv += [flag, ",".join(map(str, value))]
            elif value is not None:
                argv += [flag, str(value)]
        return argv

    def start(self, timeout: float = 30.0) -> SysfsSim:
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and not line:
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            if not line and self.proc.poll() is not None:
                break
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"sysfs simulator did not start: {err.strip()[-500:]}")
        self.ready = json.loads(line)
        return self

    def state(self) -> dict[str, Any]:
        return json.loads(self.config.state_path.read_text())

    def trace(self) -> list[dict[str, Any]]:
        """Every tick so far: t_monotonic, util, temp_c, freq_khz, cap_khz, draw_ma, current_ua, ..."""
        path = self.config.trace
        if path is None or not path.exists():
            return []
        lines = path.read_text().splitlines()
        head = lines[0].split(",")
        rows = []
        for line in lines[1:]:
            cells = line.split(",")
            if len(cells) == len(head):
                rows.append({k: (v if k == "status" else float(v)) for k, v in zip(head, cells, strict=True)})
        return rows

    def cap_now(self) -> None:
        """Cap the frequency (and start the burners) now."""
        if self.proc:
            self.proc.send_signal(signal.SIGUSR1)

    def monitor_argv(self, hz: float = 20.0) -> list[str]:
        """argv of a power monitor on this simulated device (for `sensors.power.monitor`)."""
        return [
            sys.executable,
            "-m",
            "edgebench.testing.sysfs_sim",
            "--root",
            str(self.root),
            "--monitor",
            "--state",
            str(self.config.state_path),
            "--hz",
            str(hz),
        ]

    def descriptor(self, name: str = "board", **overrides: Any) -> str:
        """A local device descriptor whose sensors live in this sandbox (TOML text).

        `sensors={...}` and `power={...}` add keys to [sensors] and [sensors.power]; other keys go top level.
        """
        data: dict[str, Any] = {"name": name, "transport": "local", "python": sys.executable}
        data.update({k: v for k, v in overrides.items() if k not in ("sensors", "power")})
        lines = [f"{k} = {toml_value(v)}" for k, v in data.items()]
        sensors = {"sysfs_root": str(self.root), **overrides.get("sensors", {})}
        lines.append("[sensors]")
        lines += [f"{k} = {toml_value(v)}" for k, v in sensors.items()]
        if overrides.get("power"):
            lines.append("[sensors.power]")
            lines += [f"{k} = {toml_value(v)}" for k, v in overrides["power"].items()]
        return "\n".join(lines) + "\n"

    def write_descriptor(self, lab_dir: Path, name: str = "board", **overrides: Any) -> Path:
        lab_dir.mkdir(parents=True, exist_ok=True)
        path = lab_dir / f"{name}.toml"
        path.write_text(self.descriptor(name, **overrides))
        return path

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()

    def __enter__(self) -> SysfsSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
