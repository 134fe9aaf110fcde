"""A nominal peak derived from the ISA when no datasheet is given: per-core operations per cycle from the
vector extensions the CPU reports, times its clock, times its cores; marked "derived". The descriptor's
`[spec] peak_tops` overrides it (edgebench.descriptors).

Operations per cycle per core (2 per multiply-add, as edgebench counts FLOPs):
- x86: AVX-512 with 2 FMA units: fp32 2 x 16 lanes x 2 = 64; AVX2 + FMA: 2 x 8 x 2 = 32; SSE2: 8 (one add
  and one multiply port of 4 lanes). int8: AVX-512 VNNI (vpdpbusd: 64 multiply-adds per 512-bit
  instruction) 2 x 64 x 2 = 256, AVX-VNNI 128, otherwise twice fp32 (vpmaddubsw pairs); AMX tiles (TMUL:
  1024 int8 and 512 bf16 multiply-adds per cycle) 2048 int8 and 1024 bf16; AVX-512 BF16 doubles fp32,
  AVX-512 FP16 doubles it for fp16.
- Arm, per cluster (`cpu_clusters` of the fingerprint: cores, cpufreq maximum, core name from the MIDR):
  fp32 FLOP/cycle per core = FMA pipes x (vector bits / 32) x 2, the vector width the SVE length where
  the kernel exposes it (and the core has SVE), else 128 (NEON); the pipe count is the core's from
  `ARM_FMA_PIPES_128` (as 128-bit pipes: a wider SVE vector means proportionally fewer pipes of that
  width, the datapath is the same), else 2 128-bit pipes, assumed and said so in the basis. Other dtypes
  scale fp32: fp16 (asimdhp/fphp) x2, int8 dot product (asimddp: 4 multiply-adds per 32-bit lane) x4,
  i8mm (smmla: 8 per lane) x8, bf16 x2. Summed over clusters: ops/cycle x MHz x cores.
The FMA-unit counts are the common server/big-core configurations; a core with one unit does half, which
is why a derived figure is an upper bound to compare against, not a measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NominalPeak:
    """Peak TOPS per dtype, derived (or from the datasheet), with how it was reached."""

    tops: dict[str, float]
    source: str  # "datasheet" or "derived"
    basis: str  # the arithmetic, for the report


# 128-bit FMA (ASIMD multiply-accumulate) pipes per core: the little in-order cores issue one 128-bit FMLA
# per cycle, the A7x/Neoverse-N big cores two, the X cores and Neoverse-V four (V1 as 2 x 256-bit SVE, V2
# 4 x 128-bit SVE2), as Arm describes these cores; not re-checked here against each core's Software
# Optimization Guide, which is one more reason a derived peak is an upper bound. Cores not listed are
# assumed at 2, and the basis says so.
ARM_FMA_PIPES_128: dict[str, int] = {
    "Cortex-A53": 1, "Cortex-A55": 1, "Cortex-A510": 1, "Cortex-A520": 1,
    "Cortex-A72": 2, "Cortex-A73": 2, "Cortex-A75": 2, "Cortex-A76": 2, "Cortex-A77": 2,
    "Cortex-A78": 2, "Cortex-A710": 2, "Cortex-A715": 2, "Cortex-A720": 2, "Cortex-A725": 2,
    "Neoverse-N1": 2, "Neoverse-N2": 2,
    "Cortex-X1": 4, "Cortex-X2": 4, "Cortex-X3": 4, "Cortex-X4": 4, "Neoverse-V1": 4, "Neoverse-V2": 4,
}  # fmt: skip
ASSUMED_ARM_PIPES = 2


def arm_dtype_scale(flags: set[str]) -> tuple[dict[str, float], str]:
    """Per-dtype operations per cycle relative to fp32 on an Arm core, and the ISA named."""
    out, isa = {"fp32": 1.0}, []
    if "asimdhp" in flags or "fphp" in flags:
        out["fp16"] = 2.0
        isa.append("FP16")
    if "i8mm" in flags:
        out["int8"] = 8.0
        isa.append("I8MM")
    elif "asimddp" in flags:
        out["int8"] = 4.0
        isa.append("dot product")
    if "bf16" in flags:
        out["bf16"] = 2.0
        isa.append("BF16")
    return out, ", ".join(isa)


def arm_core_fp32_per_cycle(core: str, flags: set[str], sve_bits: int | None) -> tuple[float, str]:
    """fp32 FLOP per cycle of one Arm core (pipes x vector bits / 32 x 2) and that arithmetic in words."""
    width = sve_bits if ("sve" in flags and sve_bits) else 128
    unit = f"{width}-bit SVE" if width != 128 or "sve" in flags else "128-bit NEON"
    known = ARM_FMA_PIPES_128.get(core)
    pipes = (known if known is not None else ASSUMED_ARM_PIPES) * 128 / width
    ops = pipes * (width / 32) * 2
    note = "" if known is not None else " (pipes assumed)"
    return ops, f"{pipes:g}x{unit} FMA{note} x {width // 32} lanes x 2 = {ops:g} FLOP/cycle"


def ops_per_cycle(flags: set[str], arch: str) -> tuple[dict[str, float], str]:
    """Per-core operations per cycle per dtype, and the ISA they came from."""
    if arch.startswith(("aarch64", "arm")):
        scale, extra = arm_dtype_scale(flags)
        fp32, _ = arm_core_fp32_per_cycle("", flags, None)
        named = "NEON 2x128-bit FMA (assumed)" + (f", {extra}" if extra else "")
        return {dtype: fp32 * k for dtype, k in scale.items()}, named
    if "avx512f" in flags:
        fp32, isa = 64.0, ["AVX-512 2 FMA units"]
    elif "avx2" in flags and "fma" in flags:
        fp32, isa = 32.0, ["AVX2 2 FMA units"]
    else:
        fp32, isa = 8.0, ["SSE2"]
    out = {"fp32": fp32, "int8": 2 * fp32}
    if "avx512_vnni" in flags:
        out["int8"] = 256.0
        isa.append("AVX512-VNNI")
    elif "avx_vnni" in flags:
        out["int8"] = 128.0
        isa.append("AVX-VNNI")
    if "avx512_bf16" in flags:
        out["bf16"] = 2 * fp32
        isa.append("AVX512-BF16")
    if "avx512_fp16" in flags:
        out["fp16"] = 2 * fp32
        isa.append("AVX512-FP16")
    if "amx_tile" in flags:
        if "amx_int8" in flags:
            out["int8"] = 2048.0
            isa.append("AMX-INT8")
        if "amx_bf16" in flags:
            out["bf16"] = 1024.0
            isa.append("AMX-BF16")
    return out, ", ".join(isa)


def cpu_isa(fingerprint: Mapping[str, Any]) -> tuple[set[str], str]:
    """The ISA flags and the architecture a device fingerprint reports (edgebench.agent.info)."""
    return set(fingerprint.get("cpu_flags") or ()), str(fingerprint.get("arch") or "")


def derived_peak(fingerprint: Mapping[str, Any]) -> NominalPeak | None:
    """From a device fingerprint (cpu_flags, arch, cores, max_mhz; on Arm its cpu_clusters); None when the
    clock or the cores are not known."""
    flags, arch = cpu_isa(fingerprint)
    if arch.startswith(("aarch64", "arm")):
        per_cluster = _arm_cluster_peak(fingerprint, flags)
        if per_cluster is not None:
            return per_cluster
    mhz, cores = fingerprint.get("max_mhz"), fingerprint.get("cores")
    if not isinstance(mhz, int | float) or mhz <= 0 or not isinstance(cores, int) or cores <= 0:
        return None
    per_cycle, isa = ops_per_cycle(flags, arch)
    tops = {dtype: ops * mhz * 1e6 * cores / 1e12 for dtype, ops in per_cycle.items()}
    clock = f"{mhz:.0f} MHz" + (
        f" ({fingerprint['max_mhz_source']})" if fingerprint.get("max_mhz_source") else ""
    )
    basis = f"{isa}: {per_cycle['fp32']:.0f} fp32 FLOP/cycle x {clock} x {cores} core(s)"
    return NominalPeak(tops, "derived", basis)


def _arm_cluster_peak(fingerprint: Mapping[str, Any], flags: set[str]) -> NominalPeak | None:
    """The Arm peak summed over clusters (each with its cpus, max_mhz and core); None when any cluster
    lacks a clock (then the whole-chip formula with the highest clock applies)."""
    clusters = fingerprint.get("cpu_clusters") or []
    if not clusters or any(not c.get("max_mhz") or not c.get("cpus") for c in clusters):
        return None
    sve_bits = fingerprint.get("sve_vector_bits")
    scale, extra = arm_dtype_scale(flags)
    fp32_tops, terms = 0.0, []
    for c in clusters:
        core = str(c.get("core") or "unknown")
        ops, how = arm_core_fp32_per_cycle(core, flags, sve_bits if isinstance(sve_bits, int) else None)
        n, mhz = len(c["cpus"]), float(c["max_mhz"])
        fp32_tops += ops * mhz * 1e6 * n / 1e12
        terms.append(f"{n} x {core} ({how}) x {mhz:.0f} MHz")
    tops = {dtype: fp32_tops * k for dtype, k in scale.items()}
    dtypes = f"; {extra} scale fp32 by " + ", ".join(f"{d} x{k:g}" for d, k in scale.items() if d != "fp32")
    basis = " + ".join(terms) + f" = {fp32_tops:.4g} fp32 TOPS" + (dtypes if extra else "")
    return NominalPeak(tops, "derived", basis)


def nominal_peak(info: Mapping[str, Any]) -> NominalPeak | None:
    """The datasheet's peak_tops when the descriptor gives one, else the derived peak (a device_info entry:
    its `descriptor` and `fingerprint`)."""
    spec = ((info.get("descriptor") or {}).get("spec") or {}).get("peak_tops") or {}
    derived = derived_peak(info.get("fingerprint") or {})
    if spec:
        tops = {**(derived.tops if derived else {}), **{k: float(v) for k, v in spec.items()}}
        return NominalPeak(tops, "datasheet", "descriptor [spec] peak_tops")
    return derived


def cluster_summary(clusters: Sequence[Mapping[str, Any]]) -> str:
    """CPU clusters in one line, slowest first: "4x Cortex-A55 1800 MHz cap 446 + 4x Cortex-A76 ..."."""
    parts = []
    for c in clusters:
        bits = [f"{len(c.get('cpus') or ())}x {c.get('core') or 'unknown'}"]
        if c.get("max_mhz"):
            bits.append(f"{float(c['max_mhz']):.0f} MHz")
        if c.get("capacity") is not None:
            bits.append(f"cap {c['capacity']}")
        parts.append(" ".join(bits))
    return " + ".join(parts)
