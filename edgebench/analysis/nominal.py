"""A nominal peak derived from the ISA when no datasheet is given: per-core operations per cycle from the
vector extensions the CPU reports, times its clock, times its cores; marked "derived". The descriptor's
`[spec] peak_tops` overrides it (edgebench.lab.descriptors).

Operations per cycle per core (2 per multiply-add, as edgebench counts FLOPs):
- x86: AVX-512 with 2 FMA units: fp32 2 x 16 lanes x 2 = 64; AVX2 + FMA: 2 x 8 x 2 = 32; SSE2: 8 (one add
  and one multiply port of 4 lanes). int8: AVX-512 VNNI (vpdpbusd: 64 multiply-adds per 512-bit
  instruction) 2 x 64 x 2 = 256, AVX-VNNI 128, otherwise twice fp32 (vpmaddubsw pairs); AMX tiles (TMUL:
  1024 int8 and 512 bf16 multiply-adds per cycle) 2048 int8 and 1024 bf16; AVX-512 BF16 doubles fp32,
  AVX-512 FP16 doubles it for fp16.
- Arm: NEON with 2 FMA pipes: fp32 2 x 4 x 2 = 16; fp16 (asimdhp) 32; int8 dot product (asimddp: 16
  multiply-adds per 128-bit sdot) 64, i8mm (smmla: 32 per instruction) 128; SVE is taken at 128-bit
  vectors (its length is not in /proc/cpuinfo), so it adds nothing here.
The FMA-unit counts are the common server/big-core configurations; a core with one unit does half, which
is why a derived figure is an upper bound to compare against, not a measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NominalPeak:
    """Peak TOPS per dtype, derived (or from the datasheet), with how it was reached."""

    tops: dict[str, float]
    source: str  # "datasheet" or "derived"
    basis: str  # the arithmetic, for the report


def ops_per_cycle(flags: set[str], arch: str) -> tuple[dict[str, float], str]:
    """Per-core operations per cycle per dtype, and the ISA they came from."""
    if arch.startswith(("aarch64", "arm")):
        out = {"fp32": 16.0}
        isa = ["NEON 2x128-bit FMA"]
        if "asimdhp" in flags or "fphp" in flags:
            out["fp16"] = 32.0
            isa.append("FP16")
        if "i8mm" in flags:
            out["int8"] = 128.0
            isa.append("I8MM")
        elif "asimddp" in flags:
            out["int8"] = 64.0
            isa.append("dot product")
        if "bf16" in flags:
            out["bf16"] = 32.0
            isa.append("BF16")
        return out, ", ".join(isa)
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
    """From a device fingerprint (cpu_flags, arch, cores, max_mhz); None when the clock or the cores are
    not known."""
    mhz, cores = fingerprint.get("max_mhz"), fingerprint.get("cores")
    if not isinstance(mhz, int | float) or mhz <= 0 or not isinstance(cores, int) or cores <= 0:
        return None
    per_cycle, isa = ops_per_cycle(*cpu_isa(fingerprint))
    tops = {dtype: ops * mhz * 1e6 * cores / 1e12 for dtype, ops in per_cycle.items()}
    clock = f"{mhz:.0f} MHz" + (
        f" ({fingerprint['max_mhz_source']})" if fingerprint.get("max_mhz_source") else ""
    )
    basis = f"{isa}: {per_cycle['fp32']:.0f} fp32 FLOP/cycle x {clock} x {cores} core(s)"
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
