"""Device fingerprint: what ran the measurement (kernel, CPU, cores, runtimes, BLAS, governor)."""

from __future__ import annotations

import glob
import os
import platform
import sys


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
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        versions["onnxruntime"] = None
    try:
        import MNN

        versions["mnn"] = getattr(MNN, "__version__", None) or _dist_version("mnn") or "unknown"
    except ImportError:
        versions["mnn"] = None
    # By its installed metadata: importing LiteRT loads its native libraries, too slow for a fingerprint.
    versions["litert"] = _dist_version("ai-edge-litert")
    return versions


def _blas_name(numpy) -> str | None:  # type: ignore[no-untyped-def]
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


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
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


def cpu_flags() -> list[str]:
    """The ISA extensions a nominal peak is derived from (first CPU's flags / Features line)."""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return sorted(set(value.split()) & ISA_FLAGS)
    return []


def max_mhz() -> tuple[float | None, str]:
    """The highest clock of any core and where it was read: cpufreq's maximum, else /proc/cpuinfo's
    current clock (a VM often has no cpufreq)."""
    best = []
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        text = _read(path)
        if text and text.strip().isdigit():
            best.append(int(text.strip()) / 1e3)
    if best:
        return max(best), "cpufreq cpuinfo_max_freq"
    mhz = []
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                mhz.append(float(value))
            except ValueError:
                pass
    return (max(mhz), "/proc/cpuinfo cpu MHz") if mhz else (None, "")


def fingerprint() -> dict:
    uname = platform.uname()
    return {
        "kernel": f"{uname.system} {uname.release}",
        "arch": uname.machine,
        "hostname": uname.node,
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_mb": memory_total_mb(),
        "caches": cache_sizes(),
        "cpu_flags": cpu_flags(),
        "max_mhz": max_mhz()[0],
        "max_mhz_source": max_mhz()[1],
        "governors": governors(),
        "python": sys.version.split()[0],
        "runtimes": runtime_versions(),
    }


def run(task: dict) -> tuple[dict, list[str]]:
    return fingerprint(), []
