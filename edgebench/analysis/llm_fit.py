"""Which LLM fits which chip: a GGUF's memory at a context and its decode tokens/s on a device, answered
before anything is pushed to it (`edgebench fit --model X.gguf --device D --context N`).

Memory (MiB, written MB as everywhere in edgebench):

  memory_mb = weights   every tensor's stored bytes, from the file's own tensor table
            + KV cache  K and V (f16) for the n_ctx cells llama.cpp allocates for the context (it pads the
                        context up to a multiple of 256: 1000 asks 1024 cells)
            + buffers   what llama.cpp itself reports for that model at that context: its compute buffers
                        (one n_ubatch batch of attention over n_ctx) and its output buffer

The buffers come from llama.cpp's own log: the host's `llama-bench -v` run once with `-p 0 -n 1 -d N-1
-r 0 --no-warmup` (llama-bench sizes a test's context as n_prompt + n_gen + n_depth; no repetition and no
warm-up allocate it and compute nothing, so a 32k context costs no prefill) and `--repack 0` (a repacked
copy of the weights is a model buffer, not a compute buffer: the compute buffers were the same with and
without it, and a model larger than the host is then not copied), read from its `... buffer size = X MiB`
lines and cached per (tensor table, context, cache type, tool binary): the weights' values never change
them. They are the host's build's figures for its CPU backend: a device whose build offloads to a GPU, or
resolves flash attention otherwise, allocates other buffers. The model's own buffers (CPU_Mapped, and
CPU_REPACK where llama.cpp repacks a copy for its kernels) are shown beside, not added.

Decode: the step with `depth` positions cached (half the context unless asked) reads

  bytes_per_token = weight bytes per token (all tensors but the embedding table, one row of it) + KV so far

and runs at tokens/s = efficiency x read bandwidth / bytes_per_token, where the read bandwidth is the
device's measured figure at the thread count and the efficiency (floor / measured p50, the decode probe's
`decode_efficiency`) is the median over OTHER GGUFs of the same quantization decoded on that device (at
that thread count where any were), each at its latest run and the depth nearest the one asked. Its
interval is the efficiencies' spread: split-conformal bounds where there are enough models
(`stats.conformal_bounds`), else their min-max. With no such model, or no bandwidth at the thread count,
the answer is "unknown" and says why: an efficiency is never guessed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..descriptors import Lab
from ..errors import MeasurementError, ModelError, UserError
from ..models.gguf_models import GgufInfo, read_gguf
from ..models.kv_cache import DEFAULT_KV_CACHE_TYPE, KV_CACHE_TYPES
from ..native.base import NativeToolError
from ..native.llama_bench import TOOL, parse_llama_bench
from ..records import Record
from ..stats import conformal_bounds
from .bandwidth import DramBandwidth
from .budgets import Budget
from .fit_result import FITS, INTERVAL_COVERAGE, NO_FIT, UNCERTAIN, Verdict

MIB = 2**20
BUFFERS_TIMEOUT_S = 600.0  # loading a multi-GB GGUF (mmap) and reserving its graph
CACHE_ENTRIES = 256  # buffer answers kept in the cache file, newest last
NEAR_FULL = 0.8  # a model over this share of the device's memory leaves little to the OS and other apps
MEMORY_KEY, DECODE_KEY = "memory_mb", "decode_tokens_per_s_min"  # the budgets judged here
# `... <backend> <kind> buffer size = X MiB` (load_tensors, llama_context, llama_kv_cache, sched_reserve)
_BUFFER = re.compile(r"^\s*~?(\w+):\s+(\S+)\s+(model|KV|output|compute) buffer size\s+=\s+([\d.]+) MiB")
# on teardown, the compute buffers to 4 decimals: `~llama_context: CPU compute buffer size is 10.5137 MiB`
_COMPUTE_EXACT = re.compile(r"^\s*~llama_context:\s+(\S+) compute buffer size is\s+([\d.]+) MiB")
_N_CTX = re.compile(r"^\s*llama_context: n_ctx\s+=\s+(\d+)")
_FLASH = re.compile(r"Flash Attention (enabled|disabled)")
_SIZE_WORDS = {" - Small": "_S", " - Medium": "_M", " - Large": "_L"}


# ---- llama.cpp's buffers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaBuffers:
    """What llama.cpp allocates for a model at a context, in MiB per backend, as its -v log says."""

    n_ctx: int
    compute_mb: dict[str, float]
    output_mb: dict[str, float]
    kv_mb: dict[str, float]
    model_mb: dict[str, float]  # CPU_Mapped, CPU_REPACK ...: shown, not added (the weights are)
    flash_attn: str | None
    argv: tuple[str, ...]

    @property
    def buffers_mb(self) -> float:
        """The compute and output buffers: what memory_mb adds to the weights and the KV cache."""
        return sum(self.compute_mb.values()) + sum(self.output_mb.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "argv": list(self.argv)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LlamaBuffers:
        return cls(**{**data, "argv": tuple(data["argv"])})


def buffers_argv(binary: str, model: str, context: int, cache_type: str = DEFAULT_KV_CACHE_TYPE) -> list[str]:
    """llama-bench's argv that makes llama.cpp allocate `context` cells for `model` and compute nothing.

    Built here, not by `native.llama_bench.llama_bench_argv`: that one refuses -r 0 (a measurement needs a
    repetition), and -r 0 with --no-warmup is what allocates the context without a prefill of it."""
    if context < 2:
        raise UserError(f"--context {context}: a context holds at least 2 positions")
    return [
        binary, "-m", model, "-p", "0", "-n", "1", "-d", str(context - 1), "-t", "1", "-r", "0",
        "--no-warmup", "--repack", "0", "-ctk", cache_type, "-ctv", cache_type, "-v", "-o", "json",
    ]  # fmt: skip


def parse_buffers(stderr: str, argv: Sequence[str]) -> LlamaBuffers:
    """The buffers of one `buffers_argv` run from llama.cpp's log; a log without the context's size or a
    compute buffer (another build's wording) is a ValueError naming what is missing."""
    found: dict[str, dict[str, float]] = {"compute": {}, "output": {}, "KV": {}, "model": {}}
    exact: dict[str, float] = {}
    n_ctx = None
    for line in stderr.splitlines():
        if m := _COMPUTE_EXACT.match(line):
            exact[m.group(1)] = float(m.group(2))
        elif m := _BUFFER.match(line):
            kind = found[m.group(3)]
            kind[m.group(2)] = kind.get(m.group(2), 0.0) + float(m.group(4))
        elif m := _N_CTX.match(line):
            n_ctx = int(m.group(1))
    if n_ctx is None or not found["compute"]:
        what = "'llama_context: n_ctx = N'" if n_ctx is None else "a 'compute buffer size = X MiB' line"
        raise ValueError(f"llama-bench -v printed no {what}")
    compute = {k: exact.get(k, v) for k, v in found["compute"].items()}  # the 4-decimal figure where given
    flash = _FLASH.search(stderr)
    return LlamaBuffers(
        n_ctx,
        compute,
        found["output"],
        found["KV"],
        found["model"],
        flash.group(1) if flash else None,
        tuple(argv),
    )


def run_buffers(
    binary: str,
    model: Path,
    context: int,
    env: Mapping[str, str] | None = None,
    cache_type: str = DEFAULT_KV_CACHE_TYPE,
) -> LlamaBuffers:
    """Run llama-bench on this host for the buffers of `model` at `context` with a `cache_type` KV cache; its
    failures as the harness's one-line errors (a model it will not load is the model's error)."""
    argv = buffers_argv(binary, str(model), context, cache_type)
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=BUFFERS_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    except OSError as exc:
        raise UserError(f"{binary}: cannot run {TOOL}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise MeasurementError(
            f"{TOOL} did not allocate {model.name} at context {context} in {BUFFERS_TIMEOUT_S:g} s",
            kind="timeout",
        ) from None
    if res.returncode != 0:
        try:  # the adapter's typed reading of a failed run: a signal, a model it cannot load, a bad flag
            parse_llama_bench(res.stdout, res.stderr, res.returncode, str(model), argv)
        except NativeToolError as exc:
            raise (ModelError if exc.kind == "model" else MeasurementError)(str(exc)) from None
    try:
        return parse_buffers(res.stderr, argv)
    except ValueError as exc:
        raise MeasurementError(f"{model}: {exc} (flags {' '.join(argv[3:])})") from None


def buffers_key(info: GgufInfo, context: int, tool: Path, cache_type: str = DEFAULT_KV_CACHE_TYPE) -> str:
    """What the buffers depend on, hashed: the model's sizes and tensor table (names, types, shapes; not
    the weights' values), the context, the cache type, and the tool binary (path, size, mtime)."""
    stat = tool.stat()
    shape = {
        "arch": [info.architecture, info.layers, info.hidden, info.heads, info.kv_heads, info.head_dim],
        "vocab": info.vocab,
        "file_type": info.file_type,
        "tensors": [[t.name, t.type_name, list(t.shape)] for t in info.tensors],
        "context": context,
        "cache_type": cache_type,
        "tool": [str(tool.resolve()), stat.st_size, stat.st_mtime_ns],
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def cached_buffers(cache: Path, key: str, measure: Callable[[], LlamaBuffers]) -> tuple[LlamaBuffers, bool]:
    """(buffers, True) from the cache file where `key` is in it, else `measure()` kept there (written to a
    temporary name and renamed: a concurrent reader never sees half a file); an unreadable cache is
    measured over, never an error."""
    try:
        known = json.loads(cache.read_text())
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    if key in known:
        try:
            return LlamaBuffers.from_dict(known[key]), True
        except (KeyError, TypeError):
            pass
    buffers = measure()
    known.pop(key, None)
    known[key] = buffers.to_dict()
    kept = dict(list(known.items())[-CACHE_ENTRIES:])
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, cache)
    except OSError:
        pass  # a cache that cannot be written costs the next fit one run of the tool, nothing else
    return buffers, False


def host_llama_bench(lab: Lab, prefer: Sequence[str], runner: str) -> tuple[Path, dict[str, str], str]:
    """(binary, env, where it was found) of the host's llama-bench: the `runner` of a local-transport device
    of the lab (those in `prefer` first; its pushed copy, `push`, where it names one, with its libraries on
    LD_LIBRARY_PATH), else llama-bench on PATH, else a one-line UserError saying how to give it."""
    names = [n for n in prefer if n in lab.devices] + [n for n in lab.names() if n not in prefer]
    for name in names:
        spec = lab.devices[name]
        found = spec.runners.get(runner)
        if spec.transport != "local" or found is None:
            continue
        path = Path(found.host_path or found.path).expanduser()
        if path.is_file():
            env = dict(spec.env)
            dirs = sorted({str(Path(lib).expanduser().parent) for lib in found.libs})
            if dirs:
                env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs)
            return path, env, f"{spec.source}: runners.{runner}"
    on_path = shutil.which(TOOL)
    if on_path:
        return Path(on_path), {}, "PATH"
    raise UserError(
        f"fit on a GGUF needs llama.cpp's {TOOL} on this host for the buffers it allocates: give a "
        f"local-transport device of --lab {lab.folder or 'devices'} "
        f'`[runners] {runner} = "/path/to/{TOOL}"`, or put {TOOL} on PATH'
    )


# ---- memory ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryNeed:
    """What the model takes at a context: weights + KV cache + llama.cpp's buffers (MiB)."""

    context: int
    weights_mb: float
    kv_cache_mb: float
    buffers: LlamaBuffers
    cached: bool = False  # the buffers came from the cache file, not a run of the tool
    kv_type: str = DEFAULT_KV_CACHE_TYPE  # the KV cache type the cache and the buffers are sized at

    @property
    def buffers_mb(self) -> float:
        return self.buffers.buffers_mb

    @property
    def memory_mb(self) -> float:
        return self.weights_mb + self.kv_cache_mb + self.buffers_mb

    def to_dict(self) -> dict[str, Any]:
        b = self.buffers
        return {
            "memory_mb": self.memory_mb,
            "parts": {
                "weights_mb": self.weights_mb,
                "kv_cache_mb": self.kv_cache_mb,
                "buffers_mb": self.buffers_mb,
            },
            "context": self.context,
            "n_ctx": b.n_ctx,
            "kv_type": self.kv_type,
            "llama_cpp": {
                "compute_mb": b.compute_mb,
                "output_mb": b.output_mb,
                "kv_mb": b.kv_mb,
                "model_mb": b.model_mb,
                "flash_attn": b.flash_attn,
                "argv": list(b.argv),
                "cached": self.cached,
            },
        }


def memory_need(
    info: GgufInfo,
    context: int,
    buffers: LlamaBuffers,
    cached: bool = False,
    cache_type: str = DEFAULT_KV_CACHE_TYPE,
) -> MemoryNeed:
    """The model's memory at `context`: its tensors, the `cache_type` KV cache of the cells llama.cpp
    allocates (`buffers.n_ctx`, the context padded as llama.cpp pads it) and llama.cpp's buffers."""
    kv = info.kv_cache_bytes(buffers.n_ctx, KV_CACHE_TYPES[cache_type])
    return MemoryNeed(context, info.tensor_bytes / MIB, kv / MIB, buffers, cached, cache_type)


def kv_disagreement(need: MemoryNeed) -> str | None:
    """A warning where llama.cpp's own KV buffer differs from the file's count by over 2% (a cache type or
    an architecture the count does not know), else None."""
    theirs = sum(need.buffers.kv_mb.values())
    if theirs and abs(theirs - need.kv_cache_mb) > 0.02 * theirs + 0.01:
        return (
            f"llama.cpp allocates {theirs:.2f} MB of KV cache at {need.buffers.n_ctx} cells, the file's "
            f"sizes give {need.kv_cache_mb:.2f} MB: memory_mb counts the latter"
        )
    return None


@dataclass(frozen=True)
class DeviceMemory:
    """A device's memory as its latest fingerprint in the store says (MemTotal), and which run's."""

    mb: float | None
    run_id: str | None = None


def device_memory(
    device_info: Iterable[Mapping[str, Any]], device: str, run_order: Sequence[str]
) -> DeviceMemory:
    """The `memory_mb` of the device's latest fingerprint that has one (runs ordered by `run_order`)."""
    rank = {run_id: i for i, run_id in enumerate(run_order)}
    best: tuple[int, float, str] | None = None
    for info in device_info:
        mb = (info.get("fingerprint") or {}).get("memory_mb")
        if info.get("device") != device or not isinstance(mb, int | float) or isinstance(mb, bool):
            continue
        at = rank.get(info.get("run_id", ""), -1)
        if best is None or at >= best[0]:
            best = (at, float(mb), str(info.get("run_id")))
    return DeviceMemory(best[1], best[2]) if best else DeviceMemory(None)


# ---- quantization ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quantization:
    """How a GGUF's weights are stored: llama.cpp's file type (MOSTLY_Q8_0; "unset" where the file says
    none) and the ggml type holding most tensor bytes (Q8_0; "" where unknown)."""

    file_type: str
    dominant: str = ""

    def same_as(self, other: Quantization) -> bool:
        """The file types where both are known (Q4_K_M is a mix of types), else the dominant types."""
        known = ("unset", "")
        if self.file_type not in known and other.file_type not in known:
            return self.file_type == other.file_type
        return bool(self.dominant) and self.dominant == other.dominant

    @property
    def label(self) -> str:
        if self.file_type not in ("unset", ""):
            return self.file_type.removeprefix("MOSTLY_")
        return self.dominant or "unknown"


def quantization_of(info: GgufInfo) -> Quantization:
    """The file's quantization from its own metadata and tensor table."""
    by_type: dict[str, int] = {}
    for t in info.tensors:
        by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_bytes
    dominant = max(by_type, key=lambda k: by_type[k]) if by_type else ""
    return Quantization(info.file_type, dominant)


def quantization_from_model_type(text: str | None) -> Quantization | None:
    """The file type from llama-bench's `model_type` ("llama ?B Q4_K - Medium" -> MOSTLY_Q4_K_M): for a
    decoded model whose file the store did not keep."""
    parts = (text or "").split(" ", 2)
    if len(parts) < 3 or not parts[2].strip():
        return None
    name = parts[2].strip()
    if name.lower() == "all f32":
        return Quantization("ALL_F32")
    for words, suffix in _SIZE_WORDS.items():
        name = name.replace(words, suffix)
    return Quantization("MOSTLY_" + name.upper().replace(" ", "_"))


def measured_quantizations(
    kept: Mapping[str, Path | None], records: Iterable[Record]
) -> dict[str, Quantization]:
    """model name -> its quantization: from the store's kept copy of the file where it reads, else from the
    `model_type` llama-bench printed for it."""
    out: dict[str, Quantization] = {}
    for name, path in kept.items():
        if path is None or not path.is_file():
            continue
        try:
            out[name] = quantization_of(read_gguf(path))
        except ModelError:
            continue
    for r in records:
        if r.model and r.model not in out and r.probe == "decode":
            found = quantization_from_model_type(r.annotations.get("model_type"))
            if found is not None:
                out[r.model] = found
    return out


# ---- decode ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EfficiencyPoint:
    """One other model's measured decode efficiency (floor / p50) on the device."""

    model: str
    run_id: str
    threads: int | None
    depth: int
    past: float  # positions cached at the decode's median step: depth + (new_tokens - 1) / 2
    efficiency: float
    quantization: str
    regime: str | None = None  # "dram" or "cache" (the floor's weights against the last-level cache)


@dataclass(frozen=True)
class Evidence:
    """The efficiencies a prediction stands on, the thread count they were taken at, and notes on them."""

    points: tuple[EfficiencyPoint, ...]
    threads: int | None
    why_none: str = ""
    notes: tuple[str, ...] = ()


def _candidates(
    records: Iterable[Record],
    quantizations: Mapping[str, Quantization],
    device: str,
    runtime: str,
    want: Quantization,
    exclude: str,
) -> tuple[list[Record], set[str]]:
    """decode_efficiency records of other models on the device and runtime with `want`'s quantization, and
    the other models decoded there with another quantization."""
    same, other = [], set()
    for r in records:
        if r.probe != "decode" or r.metric != "decode_efficiency" or r.value is None:
            continue
        if (r.device, r.runtime) != (device, runtime) or not r.model or r.model == exclude:
            continue
        q = quantizations.get(r.model)
        if q is not None and q.same_as(want):
            same.append(r)
        else:
            other.add(f"{r.model} ({q.label if q else 'quantization unknown'})")
    return same, other


def efficiency_evidence(
    records: Iterable[Record],
    quantizations: Mapping[str, Quantization],
    target: tuple[str, str, str],
    want: Quantization,
    past: float,
    threads: int | None = None,
    run_order: Sequence[str] = (),
) -> Evidence:
    """The efficiencies of the other models (`target` = device, runtime, the model asked, left out) of the
    same quantization decoded on the device: at `threads` where any were measured there (without
    `threads`, the thread count most models were measured at), else at any; per model its latest run, at
    the depth whose median step is nearest `past`."""
    device, runtime, exclude = target
    same, other = _candidates(records, quantizations, device, runtime, want, exclude)
    if not same:
        seen = f" (decoded there: {', '.join(sorted(other))})" if other else ""
        why = f"no other {want.label} GGUF decoded on {device} with {runtime}{seen}"
        return Evidence((), threads, why + f": run `edgebench probe decode --model M --device {device}`")
    models_at: dict[int | None, set[str]] = {}
    for r in same:
        models_at.setdefault(r.params.get("threads"), set()).add(r.model or "")
    notes: list[str] = []
    if threads is None:
        threads = max(models_at, key=lambda t: (len(models_at[t]), t or 0))
    elif threads not in models_at:
        at = ", ".join(str(t) for t in sorted(models_at, key=lambda t: t or 0))
        notes.append(f"no {want.label} decode on {device} at {threads} threads: efficiencies taken at {at}")
    chosen = [r for r in same if r.params.get("threads") == threads] or same
    rank = {run_id: i for i, run_id in enumerate(run_order)}
    points = []
    for model in sorted({r.model or "" for r in chosen}):
        mine = [r for r in chosen if r.model == model]
        latest = max(mine, key=lambda r: (rank.get(r.run_id, -1), r.ts)).run_id
        points.append(_nearest(model, [r for r in mine if r.run_id == latest], past, quantizations))
    return Evidence(tuple(points), threads, "", tuple(notes))


def _nearest(
    model: str, records: list[Record], past: float, quantizations: Mapping[str, Quantization]
) -> EfficiencyPoint:
    """The record of one run whose decode's median step is nearest `past` positions, as a point."""

    def past_of(r: Record) -> float:
        return int(r.params.get("depth") or 0) + (int(r.params.get("new_tokens") or 1) - 1) / 2

    r = min(records, key=lambda r: abs(past_of(r) - past))
    q = quantizations.get(model)
    return EfficiencyPoint(
        model,
        r.run_id,
        r.params.get("threads"),
        int(r.params.get("depth") or 0),
        past_of(r),
        float(r.value or 0.0),
        q.label if q else "unknown",
        r.annotations.get("regime"),
    )


@dataclass(frozen=True)
class DecodePrediction:
    """Decode tokens/s at the step with `depth` positions cached: p50 and its interval, or why unknown."""

    depth: int
    threads: int | None
    bytes_per_token: int
    evidence: Evidence
    bandwidth: DramBandwidth | None = None
    efficiency: float | None = None
    p50: float | None = None
    low: float | None = None
    high: float | None = None
    interval: str = ""
    unknown: str = ""  # why there is no prediction

    def to_dict(self) -> dict[str, Any]:
        points = self.evidence.points
        return {
            "p50": self.p50,
            "low": self.low,
            "high": self.high,
            "interval": self.interval or None,
            "unknown": self.unknown or None,
            "depth": self.depth,
            "threads": self.threads,
            "bytes_per_token": self.bytes_per_token,
            "efficiency": self.efficiency,
            "bandwidth": {**asdict(self.bandwidth), "dram_sized": self.bandwidth.dram_sized}
            if self.bandwidth
            else None,
            "evidence": {
                "count": len(points),
                "models": [p.model for p in points],
                "points": [asdict(p) for p in points],
                "notes": list(self.evidence.notes),
            },
        }


def predict_decode(
    info: GgufInfo,
    depth: int,
    evidence: Evidence,
    bandwidth: DramBandwidth | None,
    cache_type: str = DEFAULT_KV_CACHE_TYPE,
) -> DecodePrediction:
    """tokens/s = efficiency x bandwidth / bytes per token at `depth`; the median efficiency of the evidence
    gives p50, their spread the interval (conformal where enough models, else min-max)."""
    per_token = info.bytes_per_token(depth, KV_CACHE_TYPES[cache_type])
    base = DecodePrediction(depth, evidence.threads, per_token, evidence, bandwidth)
    if not evidence.points:
        return _unknown(base, evidence.why_none)
    if bandwidth is None:
        return _unknown(base, f"no read bandwidth of the device at {evidence.threads} threads in the store")
    effs = sorted(p.efficiency for p in evidence.points)
    med = float(np.median(effs))
    bounds = conformal_bounds([e / med for e in effs], INTERVAL_COVERAGE)
    if bounds is not None:
        lo, hi, how = med * bounds[0], med * bounds[1], f"conformal {INTERVAL_COVERAGE:.0%}"
    else:
        lo, hi, how = effs[0], effs[-1], "min-max"
    how += f" of {len(effs)} model{'s' if len(effs) > 1 else ''}" + (" (no spread)" if len(effs) == 1 else "")

    def rate(eff: float) -> float:
        return eff * bandwidth.gbps * 1e9 / per_token

    return DecodePrediction(
        depth, evidence.threads, per_token, evidence, bandwidth, med, rate(med), rate(lo), rate(hi), how
    )


def _unknown(base: DecodePrediction, why: str) -> DecodePrediction:
    return DecodePrediction(
        base.depth, base.threads, base.bytes_per_token, base.evidence, base.bandwidth, unknown=why
    )


# ---- the answer ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlmFit:
    """One GGUF on one device: its memory against the device's, its decode predicted, the verdict."""

    device: str
    runtime: str
    model: str
    memory: MemoryNeed
    device_memory: DeviceMemory
    decode: DecodePrediction
    verdict: str
    fits: bool | None
    why: str
    limits: dict[str, float] = field(default_factory=dict)
    unchecked: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The answer as `fit --json` prints it beside the records."""
        mem = self.memory.to_dict()
        return {
            "device": self.device,
            "model": self.model,
            "runtime": self.runtime,
            "memory_mb": mem.pop("memory_mb"),
            **mem,
            "device_memory_mb": self.device_memory.mb,
            "device_memory_run": self.device_memory.run_id,
            "fits": self.fits,
            "verdict": self.verdict,
            "why": self.why,
            "limits": self.limits,
            "unchecked": list(self.unchecked),
            "decode_tokens_per_s": self.decode.to_dict(),
            "warnings": list(self.warnings),
        }

    def to_verdict(self) -> Verdict:
        """The answer as fit's Verdict, so it is stored and reported as every other fit run is."""
        d = self.decode
        values = {MEMORY_KEY: self.memory.memory_mb}
        if DECODE_KEY in self.limits and d.p50 is not None:
            values[DECODE_KEY] = d.p50
        ratios = {k: values[k] / self.limits[k] for k in values if k in self.limits}
        margins = {
            k: (self.limits[k] - v if k == MEMORY_KEY else v - self.limits[k]) / self.limits[k]
            for k, v in values.items()
            if k in self.limits
        }
        limiting = min(margins, key=lambda k: margins[k]) if margins else None
        predicted = {"predicted_memory_mb": self.memory.memory_mb}
        if d.p50 is not None:
            predicted["predicted_decode_tokens_per_s"] = d.p50
        intervals = {DECODE_KEY: (d.low, d.high)} if DECODE_KEY in values and d.low and d.high else {}
        models = [p.model for p in d.evidence.points]
        config = {"context": self.memory.context, "n_ctx": self.memory.buffers.n_ctx, "depth": d.depth}
        return Verdict(
            self.device,
            self.runtime,
            self.model,
            "predicted",
            values,
            self.fits,
            limiting,
            margins.get(limiting) if limiting else None,
            margins,
            self.unchecked,
            config={**config, "threads": d.threads},
            predicted=predicted,
            evidence=f"decode efficiency of {len(models)} model(s): {', '.join(models)}" if models else "",
            verdict=self.verdict,
            ratios=ratios,
            intervals=intervals,
            why=self.why,
            memory={"llm": self.memory.to_dict(), "device_memory_mb": self.device_memory.mb},
            limits=self.limits,
        )


def judge_llm(
    ident: tuple[str, str, str],
    memory: MemoryNeed,
    device_mem: DeviceMemory,
    decode: DecodePrediction,
    budgets: Sequence[Budget] = (),
) -> LlmFit:
    """The verdict of (device, runtime, model): memory_mb against the device's memory (and a memory_mb
    budget, the lower limit wins), decode tokens/s against a decode_tokens_per_s_min budget on its
    interval. Over either: does not fit; an unknown the answer needs: uncertain; else fits."""
    device, runtime, model = ident
    given = {b.key: b.limit for b in budgets}
    mem_limits = [x for x in (device_mem.mb, given.get(MEMORY_KEY)) if x]
    limits = {MEMORY_KEY: min(mem_limits)} if mem_limits else {}
    if DECODE_KEY in given:
        limits[DECODE_KEY] = given[DECODE_KEY]
    unchecked = tuple(k for k in given if k not in (MEMORY_KEY, DECODE_KEY))
    need = memory.memory_mb
    parts = (
        f"{need:.1f} MB (weights {memory.weights_mb:.1f} + {memory.kv_type} KV {memory.kv_cache_mb:.1f} at "
        f"{memory.buffers.n_ctx} cells + llama.cpp buffers {memory.buffers_mb:.1f})"
    )
    over: list[str] = []
    unsure: list[str] = []
    if MEMORY_KEY in limits:
        limit = limits[MEMORY_KEY]
        whose = "the device's memory" if limit == device_mem.mb else "the memory_mb budget"
        line = f"needs {parts} {'>' if need > limit else '<='} {whose} {limit:.1f} MB"
        if need > limit:
            over.append(line)
    else:
        line = f"needs {parts}; {device} has no memory size in the store (no fingerprint with memory_mb)"
        unsure.append(line)
    _judge_decode(limits.get(DECODE_KEY), decode, over, unsure)
    verdict = NO_FIT if over else UNCERTAIN if unsure else FITS
    why = "; ".join(over or unsure or [line] + _decode_words(decode))
    warnings = _warnings(memory, device_mem, decode)
    fits = None if verdict == UNCERTAIN else verdict == FITS
    return LlmFit(
        device, runtime, model, memory, device_mem, decode, verdict, fits, why, limits, unchecked, warnings
    )


def _judge_decode(limit: float | None, d: DecodePrediction, over: list[str], unsure: list[str]) -> None:
    """A decode_tokens_per_s_min budget against the prediction's interval."""
    if limit is None:
        return
    if d.p50 is None:
        unsure.append(f"decode tokens/s unknown ({d.unknown})")
    elif (d.high or d.p50) < limit:
        over.append(f"decode {d.p50:.4g} tokens/s [{d.low:.4g}-{d.high:.4g}] < {limit:g}")
    elif (d.low or d.p50) < limit:
        unsure.append(f"decode {d.p50:.4g} tokens/s [{d.low:.4g}-{d.high:.4g}] straddles {limit:g}")


def _decode_words(d: DecodePrediction) -> list[str]:
    if d.p50 is None:
        return [f"decode tokens/s unknown: {d.unknown}"]
    return [f"decode {d.p50:.4g} tokens/s [{d.low:.4g}-{d.high:.4g}, {d.interval}] at depth {d.depth}"]


def _warnings(memory: MemoryNeed, device_mem: DeviceMemory, decode: DecodePrediction) -> tuple[str, ...]:
    """What the numbers rest on that the user should know."""
    out = list(decode.evidence.notes)
    kv = kv_disagreement(memory)
    if kv:
        out.append(kv)
    if device_mem.mb and NEAR_FULL * device_mem.mb < memory.memory_mb <= device_mem.mb:
        out.append(
            f"{memory.memory_mb:.0f} MB is {memory.memory_mb / device_mem.mb:.0%} of the device's "
            f"{device_mem.mb:.0f} MB (MemTotal): the OS and other processes share it"
        )
    if decode.bandwidth is not None and decode.p50 is not None and not decode.bandwidth.dram_sized:
        out.append(
            f"the read bandwidth ({decode.bandwidth.gbps:.3g} GB/s, run {decode.bandwidth.run_id}) was "
            "measured on arrays the last-level cache may hold: not DRAM's figure"
        )
    if any(p.regime == "cache" for p in decode.evidence.points):
        out.append("some evidence models are cache-resident (weights under 2x the last-level cache)")
    return tuple(out)


__all__ = [
    "DecodePrediction",
    "DeviceMemory",
    "EfficiencyPoint",
    "Evidence",
    "LlamaBuffers",
    "LlmFit",
    "MemoryNeed",
    "Quantization",
    "buffers_argv",
    "buffers_key",
    "cached_buffers",
    "device_memory",
    "efficiency_evidence",
    "host_llama_bench",
    "judge_llm",
    "measured_quantizations",
    "memory_need",
    "parse_buffers",
    "predict_decode",
    "quantization_from_model_type",
    "quantization_of",
    "run_buffers",
]
