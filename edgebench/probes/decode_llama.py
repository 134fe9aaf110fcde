"""Probe `decode` on llama.cpp: `llama-bench` pushed to the device and run with `-o json`, a prefill test and
a decode test at each context depth, and the floor per token read from the GGUF's own tensor table.

Records, under the names of the agent's decode (edgebench/probes/decode.py), with the depth in params:
`ttft_ms` (llama-bench's prefill of the prompt, one sample per repetition: the first token's sampling is not
in it), `prefill_tokens_per_s`, `decode_ms_per_token` (one sample per repetition: that repetition's
generation over its tokens; llama-bench times no single token, so the tail percentiles it cannot bound are
refused, never read off per-token times it does not have), `decode_tokens_per_s`, `kv_cache_mb` (the cache
at the end of the decode, from the file's sizes and the cache type llama-bench reports), and the floor:

  decode_floor_ms = (every tensor's stored bytes but the token embedding, one row of it, + the KV cache at
                     the median step) / the device's DRAM read bandwidth at the decode's own thread count

(one core of a 2-vCPU host reads about half of what two do: a floor at another thread count is wrong), and
`decode_efficiency` = floor / measured p50. Every field llama-bench printed is kept in the annotations of
the records of its test (`llama_bench`), its build and the flags it ran with among them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..descriptors import RunnerSpec
from ..errors import MeasurementError, ModelError, UserError
from ..jobs import Job, ModelRef
from ..lab.device import Device
from ..models.gguf_models import GgufInfo, check_architecture, read_gguf
from ..models.kv_cache import DEFAULT_KV_CACHE_TYPE, KV_CACHE_TYPES
from ..native.base import NativeToolError
from ..native.llama_bench import (
    TOOL,
    LlamaBenchCrash,
    LlamaBenchLoadError,
    LlamaBenchTest,
    llama_bench_argv,
    parse_llama_bench,
)
from ..records import ProbeResult, RecordContext
from ..runtimes import Runtime
from ..runtimes import runtime as runtime_named
from ..stats import summarize
from .common import job_timeout, require_model, runtime_of
from .decode import (
    MIB,
    DramBandwidth,
    ReadBytes,
    best_of,
    floor_records,
    measure_dram_bandwidth,
)
from .decode import run_decode as agent_decode
from .native import install_runner
from .registry import DecodeParams

# The bandwidth a decode's floor divides by: reading, as a decode step streams its weights, at its threads.
KERNEL = "read"


def run_decode(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    """Probe decode's entry: on a runtime whose own tool decodes (llama.cpp's llama-bench) that tool, else
    the agent's decode (`decode.run_decode`)."""
    params = DecodeParams.of(job)
    model = require_model(job)
    rt = runtime_named(runtime_of(model, job.runtime))
    if rt.decode_tool is None:
        return agent_decode(device, job, ctx)
    ctx.runtime = rt.name
    # The sequence lengths are what a decode measured: every record names them, defaults included.
    ctx.base_params = {
        **params.identity(),
        "prompt_tokens": params.prompt_tokens,
        "new_tokens": params.new_tokens,
    }
    return run_llama_decode(device, job, ctx, params, model, rt)


def run_llama_decode(
    device: Device, job: Job, ctx: RecordContext, params: DecodeParams, model: ModelRef, rt: Runtime
) -> ProbeResult:
    """Run llama-bench for the job on the device and turn each (depth) pair of tests into records."""
    info = read_gguf(model.path)  # not a GGUF, truncated: one line naming the file, before anything is pushed
    check_architecture(info, model.path)
    timeout = job_timeout(device, job)
    tool = rt.decode_tool or ""
    runner = device.spec.runners.get(tool) or _on_host_path(device, tool)
    if runner is None:
        raise UserError(
            f"{device.name}: no '{tool}' in [runners] of {device.spec.source} ({rt.display} decodes "
            "through llama-bench: give its path, or push = the host's copy to push it)"
        )
    out = ProbeResult()
    stored = DramBandwidth.from_params(params.bandwidth) if params.bandwidth else None
    if stored is not None and (
        stored.kernel != KERNEL or (params.threads and stored.threads != params.threads)
    ):
        stored = None  # another kernel or thread count: not this decode's bandwidth
    # the agent measures the bandwidth; a device without it has the store's figure or no floor
    measure = params.floor and stored is None and device.spec.agent != "native"
    before = (
        measure_dram_bandwidth(device, job, params, ctx, out, "before", KERNEL)
        if measure and params.threads
        else None
    )
    binary, env = install_runner(device, runner, timeout)
    [remote] = device.ensure_files([model.path], timeout)
    tests = _run(device, binary, remote, model, params, env, timeout)
    threads = tests[0].n_threads
    if stored is not None and stored.threads not in (None, threads):
        stored = None  # the tool's own thread count was another
        measure = params.floor and device.spec.agent != "native"
    after = None
    if measure:
        at = params if params.threads else dataclasses.replace(params, threads=threads)
        after = measure_dram_bandwidth(device, job, at, ctx, out, "after", KERNEL)
    bandwidth = stored or best_of(before, after)
    ctx.base_params = {**ctx.base_params, "threads": threads}
    for depth in sorted({t.n_depth for t in tests}):
        at_depth = [t for t in tests if t.n_depth == depth]
        out.extend(depth_records(ctx, info, at_depth, bandwidth if params.floor else None))
    if params.floor and bandwidth is None:
        out.warnings.append(
            f"no decode_floor_ms: no DRAM bandwidth of {device.name} at {threads} threads (measure it with "
            f"`edgebench probe bandwidth --threads {threads}` on a device with the Python agent)"
        )
    if len({t.n_depth for t in tests}) > 1:
        out.extend(depth_slope(ctx, info, tests, bandwidth if params.floor else None))
    if tests[0].repack is False:
        out.warnings.append("llama-bench ran with --repack 0: its CPU repacked kernels were off")
    return out


def depth_slope(
    ctx: RecordContext, info: GgufInfo, tests: list[LlamaBenchTest], bandwidth: DramBandwidth | None
) -> ProbeResult:
    """How much each 1000 positions of context add to a decode step: the least-squares slope of the p50
    per token over the depths measured, beside the floor's own slope (the KV cache those positions add,
    read at the floor's bandwidth); their ratio says how much of the added time is reading the cache."""
    import numpy as np

    decodes = sorted((t for t in tests if t.n_gen > 0), key=lambda t: t.n_depth)
    depths = [t.n_depth for t in decodes]
    p50s = [float(np.median(t.per_token_ms)) for t in decodes]
    slope = float(np.polyfit(depths, p50s, 1)[0]) * 1000
    notes: dict[str, Any] = {"depths": depths, "p50_ms": p50s}
    cache = kv_bytes(decodes[0])
    if bandwidth is not None and cache is not None:
        floor_slope = info.kv_cache_bytes(1000, cache) / (bandwidth.gbps * 1e9) * 1e3
        notes |= {"floor_slope_ms": floor_slope, "kv_share": floor_slope / slope if slope > 0 else None}
    out = ProbeResult()
    params = {k: v for k, v in ctx.base_params.items() if k != "depth"}
    c = dataclasses.replace(ctx, base_params=params)
    out.records.append(c.record("decode_depth_slope_ms", slope, "ms per 1000 positions", notes))
    return out


def _on_host_path(device: Device, tool: str) -> RunnerSpec | None:
    """On a device that is this host, the tool on PATH (llama-bench as installed) where the lab file
    names none."""
    import shutil

    found = shutil.which(TOOL) if device.spec.transport == "local" else None
    return RunnerSpec(tool, found) if found else None


def _run(
    device: Device,
    binary: str,
    remote: str,
    model: ModelRef,
    params: DecodeParams,
    env: dict[str, str],
    timeout: float,
) -> list[LlamaBenchTest]:
    """llama-bench's tests for the job; its failures as the harness's errors (a crash names the signal, the
    model and the flags; a model it will not load is the model's error; a usage error the user's)."""
    try:
        argv = llama_bench_argv(
            binary,
            remote,
            prompt=params.prompt_tokens,
            gen=params.new_tokens,
            depths=params.depths,
            threads=[params.threads] if params.threads else [],
            repetitions=params.rounds,
            repack=params.repack,
            warmup=params.warmup > 0,
            cache_type_k=params.kv_type,
            cache_type_v=params.kv_type,
        )
        res = device.transport.run(argv, timeout=timeout, env=env or device.spec.env or None)
        if res.returncode == 127:
            raise UserError(f"{device.name}: llama-bench {binary} not found on the device")
        shown = [str(model.path) if a == remote else a for a in argv]  # messages name the user's file
        tests = parse_llama_bench(res.stdout, res.stderr, res.returncode, str(model.path), shown)
    except LlamaBenchLoadError as exc:
        raise ModelError(f"{device.name}: {exc}") from None
    except LlamaBenchCrash as exc:
        raise MeasurementError(str(exc), device=device.name, kind="crash") from None
    except NativeToolError as exc:
        if exc.kind == "usage":
            raise UserError(str(exc)) from None
        raise MeasurementError(str(exc), device=device.name, kind=exc.kind) from None
    if not any(t.n_gen > 0 for t in tests) or not any(t.n_prompt > 0 for t in tests):
        raise MeasurementError(f"llama-bench printed no prefill or no decode test for {model.path.name}")
    return tests


def kv_bytes(test: LlamaBenchTest) -> float | None:
    """Bytes per cached value of the test's KV cache (K and V of one type; f16 where the tool names none),
    or None for a type edgebench does not size (then no figure rests on a guess)."""
    k, v = test.type_k or DEFAULT_KV_CACHE_TYPE, test.type_v or test.type_k or DEFAULT_KV_CACHE_TYPE
    if k != v or k not in KV_CACHE_TYPES:
        return None
    return KV_CACHE_TYPES[k]


def depth_records(
    ctx: RecordContext, info: GgufInfo, tests: list[LlamaBenchTest], bandwidth: DramBandwidth | None
) -> ProbeResult:
    """The records of one context depth: its prefill test and its decode test."""
    prefill = next(t for t in tests if t.n_prompt > 0)
    decode = next(t for t in tests if t.n_gen > 0)
    depth = decode.n_depth
    c = dataclasses.replace(
        ctx,
        base_params={**ctx.base_params, "depth": depth},
        base_annotations={**ctx.base_annotations, **run_notes(decode)},
    )
    out = ProbeResult()
    ttft = summarize(list(prefill.ms))
    notes = {"n": ttft.n, "per": "repetition", "llama_bench": _fields(prefill)}
    for stat, value in (("p50", ttft.percentiles["p50"]), ("mean", ttft.mean), ("min", ttft.min)):
        out.records.append(c.record("ttft_ms", value, "ms", notes, stat=stat))
    rate = prefill.n_prompt / (ttft.percentiles["p50"] / 1e3)
    out.records.append(c.record("prefill_tokens_per_s", rate, "tokens/s", notes))
    per_token = list(decode.per_token_ms)
    s = summarize(per_token)
    stats = {**s.percentiles, "mean": s.mean, "min": s.min, "max": s.max}
    dnotes = {"n": s.n, "per": "repetition", "tokens_each": decode.n_gen, "llama_bench": _fields(decode)}
    for stat, value in stats.items():
        out.records.append(c.record("decode_ms_per_token", value, "ms", dnotes, stat=stat))
    out.warnings += [
        f"decode_ms_per_token {why} (llama-bench times whole repetitions; raise --rounds)"
        for why in s.refused.values()
    ]
    total_s = sum(decode.ms) / 1e3
    tokens = decode.n_gen * len(decode.ms)
    out.records.append(c.record("decode_tokens_per_s", tokens / total_s, "tokens/s", dnotes))
    cache = kv_bytes(decode)
    if cache is None:
        out.warnings.append(
            f"llama-bench's KV cache type {decode.type_k}/{decode.type_v} is not one edgebench sizes: no "
            "kv_cache_mb, no decode_floor_ms"
        )
    else:
        kv = info.kv_cache_bytes(depth + decode.n_gen, cache)
        kv_notes = {"kv_cache_bytes": kv, "positions": depth + decode.n_gen, "kv_type": decode.type_k}
        out.records.append(c.record("kv_cache_mb", kv / MIB, "MB", kv_notes))
    out.samples.append(c.samples("decode_ms_per_token", "ms", per_token, {"per": "repetition"}))
    out.samples.append(c.samples("ttft_ms", "ms", list(prefill.ms), {"per": "repetition"}))
    if bandwidth is not None and cache is not None:
        weights = ReadBytes(info.weight_bytes_per_token(), info.tensor_bytes, _embedding(info), ())
        steps = {
            "prompt_tokens": depth,
            "new_tokens": decode.n_gen,
            "kv_bytes_per_position": info.kv_cache_bytes(1, cache),
        }
        out.extend(floor_records(c, steps, weights, bandwidth, s.percentiles["p50"]))
    return out


def _embedding(info: GgufInfo) -> dict[str, int]:
    embd = info.tensor("token_embd.weight")
    return {embd.name: embd.n_bytes} if embd is not None and info.tensor("output.weight") else {}


def run_notes(test: LlamaBenchTest) -> dict[str, Any]:
    """What every record of the decode carries about how llama-bench ran."""
    return {
        "runtime_version": test.build_commit,
        "tool": "llama-bench",
        "backends": test.backends,
        "model_type": test.model_type,
        "type_k": test.type_k,
        "type_v": test.type_v,
        "rounds": len(test.samples_ns),
    }


def _fields(test: LlamaBenchTest) -> dict[str, Any]:
    """Every field llama-bench printed for the test, as printed."""
    found = {f.name: getattr(test, f.name) for f in dataclasses.fields(test) if f.name != "raw"}
    found.update(test.raw)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in found.items()}
