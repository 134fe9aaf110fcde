"""Device fingerprint: what ran the measurement (kernel, CPU, cores, runtimes, BLAS, governor)."""

from __future__ import annotations

import glob
import os
import platform
import sys
from typing import Any

from .runtimes import SESSION_MODULES, session_module


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "Processor", "cpu model"):
            return value.strip()
    return platform.processor() or platform.machine()


def memory_total_mb() -> float | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024.0
    return None


def cache_sizes() -> dict[str, int]:
    """Cache sizes in bytes by level, from sysfs (the largest is the last-level cache)."""
    sizes: dict[str, int] = {}
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        level, size, kind = _read(f"{index}/level"), _read(f"{index}/size"), _read(f"{index}/type")
        if not level or not size or kind == "Instruction":
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1].upper(), 1)
        digits = size[:-1] if size[-1].isalpha() else size
        sizes[f"L{level}"] = int(digits) * mult
    return sizes


def governors() -> dict[str, str]:
    found = {}
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpufreq/policy*/scaling_governor")):
        found[path.split("/")[-2]] = _read(path) or ""
    return found


def runtime_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    try:
        import numpy

        versions["numpy"] = numpy.__version__
        versions["blas"] = _blas_name(numpy)
    except ImportError:
        versions["numpy"] = None
    for runtime in SESSION_MODULES:
        versions[runtime] = session_module(runtime).installed_version()
    return versions


def _blas_name(numpy) -> str | None:
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            if pool.get("user_api") == "blas":
                return f"{pool.get('internal_api')} {pool.get('version')} ({pool.get('architecture')})"
    except ImportError:
        pass
    config = getattr(getattr(numpy, "__config__", None), "CONFIG", None)
    if isinstance(config, dict):
        blas = config.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name')} {blas.get('version')}"
    return None


ISA_FLAGS = frozenset(
    {
        # x86
        "sse2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
        "amx_tile", "amx_int8", "amx_bf16",
        # Arm (Features in /proc/cpuinfo)
        "asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "i8mm", "bf16", "sme",
    }
)  # fmt: skip


def _under(root: str, path: str) -> str:
    """An absolute device path resolved under a sysroot ("/" leaves it as is)."""
    return path if not root or root == "/" else os.path.join(root, path.lstrip("/"))


def cpu_flags(root: str = "/") -> list[str]:
    """The ISA extensions a nominal peak is derived from (first CPU's flags / Features line)."""
    for line in (_read(_under(root, "/proc/cpuinfo")) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return sorted(set(value.split()) & ISA_FLAGS)
    return []


# MIDR part numbers of Arm Ltd's cores (implementer 0x41), as Linux names them in
# arch/arm64/include/asm/cputype.h (ARM_CPU_PART_*); a part not listed is reported as unknown with its hex.
ARM_CORE_NAMES: dict[tuple[int, int], str] = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57", (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510", (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4D): "Cortex-A715",
    (0x41, 0xD4E): "Cortex-X3", (0x41, 0xD4F): "Neoverse-V2", (0x41, 0xD80): "Cortex-A520",
    (0x41, 0xD81): "Cortex-A720", (0x41, 0xD82): "Cortex-X4", (0x41, 0xD84): "Neoverse-V3",
    (0x41, 0xD85): "Cortex-X925", (0x41, 0xD87): "Cortex-A725",
}  # fmt: skip


def core_name(implementer: int | None, part: int | None) -> str:
    """A core's name from its MIDR implementer and part number, else "unknown (0xII:0xPPP)"."""
    if implementer is None or part is None:
        return "unknown"
    return ARM_CORE_NAMES.get((implementer, part)) or f"unknown (0x{implementer:02x}:0x{part:03x})"


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text.strip(), base) if text else None
    except ValueError:
        return None


def cpuinfo_cpus(text: str) -> dict[int, dict[str, Any]]:
    """Per processor of an ARM /proc/cpuinfo: its ISA features, MIDR implementer and part."""
    cpus: dict[int, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        key, _, value = (x.strip() for x in line.partition(":"))
        if key == "processor" and value.isdigit():
            current = cpus.setdefault(int(value), {"features": [], "implementer": None, "part": None})
        elif current is None:
            continue
        elif key == "Features":
            current["features"] = sorted(set(value.split()) & ISA_FLAGS)
        elif key == "CPU implementer":
            current["implementer"] = _int(value, 16)
        elif key == "CPU part":
            current["part"] = _int(value, 16)
    return cpus


def cpu_clusters(root: str = "/") -> list[dict[str, Any]]:
    """CPUs grouped into clusters by (cpu_capacity, cpufreq maximum, core): each with its cpus, capacity,
    max_mhz, core name and MIDR part; the fastest cluster last. Empty without per-CPU sysfs facts (an x86
    VM); the MIDR comes from /proc/cpuinfo, else from sysfs regs/identification/midr_el1."""
    info = cpuinfo_cpus(_read(_under(root, "/proc/cpuinfo")) or "")
    base = _under(root, "/sys/devices/system/cpu")
    ids = sorted(
        int(p.rsplit("cpu", 1)[1]) for p in glob.glob(f"{base}/cpu[0-9]*") if p.rsplit("cpu", 1)[1].isdigit()
    )
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for cpu in ids or sorted(info):
        capacity = _int(_read(f"{base}/cpu{cpu}/cpu_capacity"))
        khz = _int(_read(f"{base}/cpu{cpu}/cpufreq/cpuinfo_max_freq"))
        impl, part = (info.get(cpu) or {}).get("implementer"), (info.get(cpu) or {}).get("part")
        midr = _int(_read(f"{base}/cpu{cpu}/regs/identification/midr_el1"), 16)
        if part is None and midr is not None:  # MIDR_EL1: implementer [31:24], part number [15:4]
            impl, part = (midr >> 24) & 0xFF, (midr >> 4) & 0xFFF
        if capacity is None and khz is None and part is None:
            continue
        key = (capacity, khz, impl, part)
        group = groups.setdefault(
            key,
            {
                "cpus": [],
                "capacity": capacity,
                "max_mhz": khz / 1e3 if khz else None,
                "core": core_name(impl, part),
                "midr_part": f"0x{part:03x}" if part is not None else None,
            },
        )
        group["cpus"].append(cpu)
    return sorted(groups.values(), key=lambda g: (g["capacity"] or 0, g["max_mhz"] or 0, g["cpus"][0]))


def sve_vector_bits(root: str = "/") -> int | None:
    """The SVE vector length in bits the kernel gives new processes (/proc/sys/abi/sve_default_vector_length
    holds bytes); None where it is not exposed."""
    nbytes = _int(_read(_under(root, "/proc/sys/abi/sve_default_vector_length")))
    return nbytes * 8 if nbytes and nbytes > 0 else None


def max_mhz(root: str = "/") -> tuple[float | None, str]:
    """The highest clock of any core and where it was read: cpufreq's maximum, else /proc/cpuinfo's
    current clock (a VM often has no cpufreq)."""
    best = []
    for path in glob.glob(_under(root, "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_max_freq")):
        text = _read(path)
        if text and text.strip().isdigit():
            best.append(int(text.strip()) / 1e3)
    if best:
        return max(best), "cpufreq cpuinfo_max_freq"
    mhz = []
    for line in (_read(_under(root, "/proc/cpuinfo")) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                mhz.append(float(value))
            except ValueError:
                pass
    return (max(mhz), "/proc/cpuinfo cpu MHz") if mhz else (None, "")


def fingerprint(root: str = "/") -> dict:
    """What this machine is; /proc and /sys facts read under `root` (a test's sysroot)."""
    uname = platform.uname()
    mhz, mhz_source = max_mhz(root)
    return {
        "kernel": f"{uname.system} {uname.release}",
        "arch": uname.machine,
        "hostname": uname.node,
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_mb": memory_total_mb(),
        "caches": cache_sizes(),
        "cpu_flags": cpu_flags(root),
        "cpu_clusters": cpu_clusters(root),
        "sve_vector_bits": sve_vector_bits(root),
        "max_mhz": mhz,
        "max_mhz_source": mhz_source,
        "governors": governors(),
        "python": sys.version.split()[0],
        "runtimes": runtime_versions(),
    }


def run(task: dict) -> tuple[dict, list[str]]:
    return fingerprint(), []
