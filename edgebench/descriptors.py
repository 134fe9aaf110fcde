"""Device descriptors (devices/NAME.toml) loaded strictly into frozen dataclasses.

Descriptors are pure data; behaviour lives in transports and probes.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, UserError
from .tomlread import TableReader, load_toml

TRANSPORTS = ("local", "ssh", "adb")
AGENTS = ("python", "native")
DTYPES = ("fp32", "fp16", "int8")
DEFAULT_TIMEOUT_S = 900.0
# Android's ABI names (ro.product.cpu.abi), the keys of a runner's per-ABI builds; what `uname -m` says on
# a device without getprop maps onto them.
ABIS = ("arm64-v8a", "armeabi-v7a", "x86_64", "x86", "riscv64")
ABI_OF_ARCH = {
    "aarch64": "arm64-v8a",
    "arm64": "arm64-v8a",
    "armv8l": "armeabi-v7a",
    "armv7l": "armeabi-v7a",
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "i686": "x86",
    "i386": "x86",
    "riscv64": "riscv64",
}


@dataclass(frozen=True)
class ChipSpec:
    """Datasheet figures; probes report measured / spec."""

    memory_bandwidth_gbps: float | None = None
    peak_tops: dict[str, float] = field(default_factory=dict)
    cpu_clusters: dict[str, tuple[int, ...]] = field(default_factory=dict)
    llc_bytes: int | None = None


@dataclass(frozen=True)
class PowerSource:
    """Where power comes from: fuel-gauge files, or an external monitor command printing samples."""

    current: str | None = None
    voltage: str | None = None
    monitor: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sensors:
    sysfs_root: str = "/"
    thermal_zones: tuple[str, ...] | str = "auto"
    power: PowerSource = field(default_factory=PowerSource)


@dataclass(frozen=True)
class RunnerBuild:
    """One ABI's build of a runner: the host file pushed and its libraries."""

    abi: str
    host_path: str
    libs: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunnerSpec:
    """A native benchmark binary on the device, or on the host to be pushed with its libraries; with
    `builds`, one per ABI, the device's own is pushed (`for_abi`)."""

    name: str
    path: str
    host_path: str | None = None
    libs: tuple[str, ...] = ()
    builds: tuple[RunnerBuild, ...] = ()

    @property
    def pushed(self) -> bool:
        """Whether edgebench pushes it from the host (one file, or a build per ABI)."""
        return self.host_path is not None or bool(self.builds)

    def for_abi(self, abis: tuple[str, ...]) -> RunnerSpec | None:
        """This runner with the build of the first of `abis` (a device's ABI list, its own first) that
        has one as its push and libs; itself when it has no per-ABI builds; None when none fits."""
        if not self.builds:
            return self
        by_abi = {b.abi: b for b in self.builds}
        for abi in abis:
            if abi in by_abi:
                build = by_abi[abi]
                return RunnerSpec(self.name, self.path, build.host_path, build.libs)
        return None


@dataclass(frozen=True)
class DeviceSpec:
    """One device of the lab, exactly as its descriptor says."""

    name: str
    transport: str
    workdir: str
    python: str
    soc: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    agent: str = "python"
    env: dict[str, str] = field(default_factory=dict)
    # adb
    serial: str | None = None
    adb_server: str | None = None
    # ssh
    host: str | None = None
    port: int = 22
    user: str | None = None
    key: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    trust_on_first_use: bool = False
    connect_timeout_s: float = 10.0
    # ssh and adb: a probe that wants a reply every interval; count_max missed in a row = link lost
    keepalive_interval_s: float = 10.0
    keepalive_count_max: int = 3
    spec: ChipSpec = field(default_factory=ChipSpec)
    sensors: Sensors = field(default_factory=Sensors)
    runners: dict[str, RunnerSpec] = field(default_factory=dict)
    source: str = "<built-in>"


def default_local_workdir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "edgebench", "local")


def builtin_local() -> DeviceSpec:
    """The host itself: always present, so every command works with no lab attached."""
    return DeviceSpec(name="local", transport="local", workdir=default_local_workdir(), python=sys.executable)


def parse_device(data: dict, path: Path) -> DeviceSpec:
    """Build a DeviceSpec from one descriptor's TOML table, refusing unknown or mistyped keys."""
    r = TableReader(data, path)
    name = r.get("name", str, path.stem)
    transport = r.choice("transport", TRANSPORTS)
    is_local = transport == "local"
    workdir = r.get("workdir", str, default_local_workdir() if is_local else "/data/local/tmp/edgebench")
    python = r.get("python", str, sys.executable if is_local else "python3")
    timeout = _seconds(r, "timeout", DEFAULT_TIMEOUT_S)
    env = r.get("env", dict, {})
    if not all(isinstance(v, str) for v in env.values()):
        raise r.error("env", "values must be strings")
    spec = _parse_spec(r.table("spec"))
    sensors = _parse_sensors(r.table("sensors"))
    runners = _parse_runners(r.table("runners"))
    dev = DeviceSpec(
        name=name,
        transport=transport,
        workdir=workdir,
        python=python,
        soc=r.get("soc", str, ""),
        timeout_s=timeout,
        agent=r.choice("agent", AGENTS, "python"),
        env=dict(env),
        serial=r.get("serial", str, None),
        adb_server=r.get("adb_server", str, None),
        host=r.get("host", str, None),
        port=r.get("port", int, 22),
        user=r.get("user", str, None),
        key=r.get("key", str, None),
        known_hosts=r.get("known_hosts", str, "~/.ssh/known_hosts"),
        trust_on_first_use=r.get("trust_on_first_use", bool, False),
        connect_timeout_s=_seconds(r, "connect_timeout", 10.0),
        keepalive_interval_s=_seconds(r, "keepalive_interval", 10.0),
        keepalive_count_max=_positive(r, "keepalive_count_max", int, 3),
        spec=spec,
        sensors=sensors,
        runners=runners,
        source=str(path),
    )
    r.done()
    if transport == "ssh" and not dev.host:
        raise r.error("host", 'required for transport = "ssh"')
    if transport == "adb" and not dev.serial:
        raise r.error("serial", 'required for transport = "adb"')
    return dev


def _seconds(r: TableReader, key: str, default: float) -> float:
    """A time limit: positive and finite (TOML also spells nan and inf; nan would never time out)."""
    value = r.get(key, float, default)
    if not (math.isfinite(value) and value > 0):
        raise r.error(key, f"must be a positive number of seconds, got {value:g}")
    return float(value)


def _positive(r: TableReader, key: str, kind: type, default: float) -> Any:
    value = r.get(key, kind, default)
    if value <= 0:
        raise r.error(key, "must be positive")
    return value


def _parse_spec(r: TableReader) -> ChipSpec:
    tops = r.get("peak_tops", dict, {})
    for dtype, value in tops.items():
        if dtype not in DTYPES:
            raise r.error(f"peak_tops.{dtype}", f"unknown dtype (use {', '.join(DTYPES)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise r.error(f"peak_tops.{dtype}", "must be a positive number")
    clusters = r.get("cpu_clusters", dict, {})
    for cluster, cpus in clusters.items():
        if not isinstance(cpus, list) or not cpus or not all(isinstance(c, int) and c >= 0 for c in cpus):
            raise r.error(f"cpu_clusters.{cluster}", "must be a non-empty list of CPU numbers")
    bandwidth = r.get("memory_bandwidth_gbps", float, None)
    if bandwidth is not None and bandwidth <= 0:
        raise r.error("memory_bandwidth_gbps", "must be positive")
    spec = ChipSpec(
        memory_bandwidth_gbps=bandwidth,
        peak_tops={k: float(v) for k, v in tops.items()},
        cpu_clusters={k: tuple(v) for k, v in clusters.items()},
        llc_bytes=r.get("llc_bytes", int, None),
    )
    r.done()
    return spec


def _parse_sensors(r: TableReader) -> Sensors:
    zones = r.raw("thermal_zones", "auto")
    if isinstance(zones, list) and all(isinstance(z, str) for z in zones):
        zones = tuple(zones)
    elif zones != "auto":
        raise r.error("thermal_zones", 'must be "auto" or a list of zone names')
    p = r.table("power")
    monitor = p.get("monitor", (str, list), ())
    if isinstance(monitor, str):
        monitor = (monitor,)
    power = PowerSource(
        current=p.get("current", str, None), voltage=p.get("voltage", str, None), monitor=tuple(monitor)
    )
    p.done()
    sensors = Sensors(sysfs_root=r.get("sysfs_root", str, "/"), thermal_zones=zones, power=power)
    r.done()
    return sensors


def _parse_runners(r: TableReader) -> dict[str, RunnerSpec]:
    runners: dict[str, RunnerSpec] = {}
    for name in list(r._data):
        value = r.raw(name)
        if isinstance(value, str):
            runners[name] = RunnerSpec(name=name, path=value)
            continue
        if not isinstance(value, dict):
            raise r.error(name, "must be a path or a table {path, push, libs}")
        t = r.table(name)
        runners[name] = RunnerSpec(
            name=name,
            path=t.get("path", str),
            host_path=t.get("push", str, None),
            libs=t.str_list("libs", ()),
            builds=_parse_builds(t.table("builds")),
        )
        if runners[name].builds and (runners[name].host_path or runners[name].libs):
            raise t.error("builds", "give either push and libs (one build) or builds (one per ABI), not both")
        t.done()
    return runners


def _parse_builds(r: TableReader) -> tuple[RunnerBuild, ...]:
    """builds.ABI = {push, libs}: ABI an Android ABI name, or what uname -m says (aarch64 = arm64-v8a)."""
    builds: dict[str, RunnerBuild] = {}
    for key in list(r._data):
        abi = key if key in ABIS else ABI_OF_ARCH.get(key.lower())
        if abi is None:
            raise r.error(key, f"not an ABI (one of {', '.join(ABIS)}, or aarch64, x86_64...)")
        if abi in builds:
            raise r.error(key, f"a second build for {abi}")
        t = r.table(key)
        builds[abi] = RunnerBuild(abi, t.get("push", str), t.str_list("libs", ()))
        t.done()
    return tuple(builds.values())


@dataclass(frozen=True)
class Lab:
    """The devices a controller knows, by name."""

    devices: dict[str, DeviceSpec]
    folder: str | None = None

    def get(self, name: str) -> DeviceSpec:
        try:
            return self.devices[name]
        except KeyError:
            known = ", ".join(sorted(self.devices))
            where = f" in {self.folder}" if self.folder else ""
            raise UserError(f"unknown device '{name}'{where} (known: {known})") from None

    def names(self) -> list[str]:
        return sorted(self.devices)


def load_lab(folder: Path | str | None = None) -> Lab:
    """Load every devices/*.toml; `local` exists even when the folder does not."""
    devices = {"local": builtin_local()}
    if folder is None:
        return Lab(devices)
    folder = Path(folder)
    if not folder.exists():
        return Lab(devices, str(folder))
    if not folder.is_dir():
        raise UserError(f"{folder}: lab folder is not a directory")
    seen_in: dict[str, Path] = {}
    for path in sorted(folder.glob("*.toml")):
        dev = parse_device(load_toml(path), path)
        if dev.name in seen_in:
            raise ConfigError(path, f"name: device '{dev.name}' is already defined in {seen_in[dev.name]}")
        seen_in[dev.name] = path
        devices[dev.name] = dev
    return Lab(devices, str(folder))
