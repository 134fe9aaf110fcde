"""Probe `decode`: an LLM decode loop on the device (edgebench/agent/decode.py) and its floor per token.

Records: `ttft_ms` (the prefill of P tokens up to the first token), `prefill_tokens_per_s`,
`decode_ms_per_token` (percentiles of every decode step of every round; the raw steps are kept as samples),
`decode_tokens_per_s` (steps / their total time), `kv_cache_mb` after the last step, `peak_rss_mb`,
`load_ms`, and with a DRAM bandwidth figure the floor:

  decode_floor_ms = (weight bytes one step reads + KV bytes it reads) / DRAM bandwidth

at the median step (a step with past length p reads p positions of key and value cache), and
`decode_efficiency` = floor / measured p50. Weight bytes are counted from the ONNX graph
(`weight_read_bytes`): every initializer once, except tables only read by Gather (embeddings), of which a
step reads one row per lookup. The bandwidth is the device's DRAM figure (`dram_bandwidth`): found in the
store by the command, else measured here with the bandwidth probe before and after the decode (read, copy
and triad at the decode's thread count and CPUs, all CPUs where the runtime picks; arrays 4x the last-level
cache unless `bandwidth_mb` says otherwise), the run named in the annotations. The best figure of any
kernel (and, from the store, any thread count) and of both runs is used: a floor must hold
however the weights are streamed, and on a busy CPU the read kernel (a numpy reduction) falls below what a
runtime's GEMV streams (seen here on 1.2 GB arrays: read 4-13 GB/s, copy 11-37 GB/s; onnxruntime's fp32
decode streamed 1.3 GB of weights per token at 8-14 GB/s).
The floor is flagged `uncertain` where it cannot be backed: weights under twice the last-level cache (the
cache, not DRAM, may feed them) or bandwidth arrays too small to be DRAM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent.protocol import DecodeTask
from ..analysis.bandwidth import DRAM_LLC_MULTIPLE, DramBandwidth, dram_bandwidth
from ..errors import ModelError, UserError
from ..jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from ..results.store import Store
from ..runtimes import names as runtime_names
from ..runtimes import runtime as runtime_named
from ..stats import OUTLIER_Z, summarize
from .common import job_timeout, push_model_and_inputs, require_model, runtime_of
from .registry import DecodeParams

MIB = 2**20
DECODE_RUNTIMES = tuple(name for name in runtime_names() if runtime_named(name).decodes)
WEIGHTS_LLC_MULTIPLE = 2  # weights this many times the last-level cache stream from DRAM every token
BEATS_FLOOR_MARGIN = 0.05  # a p50 more than 5% under the floor means the floor's bandwidth is wrong
DEFAULT_DOMAINS = ("", "ai.onnx")
GENERATED_KEPT = 32  # the first generated tokens, kept so two runtimes' decodes can be compared


# ---- the bandwidth the floor divides by -----------------------------------------------------------------
def stored_dram_bandwidth(
    store_path: Path, device: str, kernel: str | None = None, threads: int | None = None
) -> DramBandwidth | None:
    """The DRAM figure of the latest bandwidth run of `device` in the store that measured DRAM (of `kernel`
    at `threads`, where given)."""
    if not store_path.exists():
        return None
    with Store(store_path) as store:
        records = store.records(device=device, metric="bandwidth_gbps")
        created = {run.run_id: run.created for run in store.runs()}
    for run_id in sorted({r.run_id for r in records}, key=lambda x: (created.get(x, ""), x), reverse=True):
        found = dram_bandwidth([r for r in records if r.run_id == run_id], "store", kernel, threads)
        if found is not None and found.dram_sized:
            return found
    return None


def measure_dram_bandwidth(
    device: Device,
    job: Job,
    params: DecodeParams,
    ctx: RecordContext,
    out: ProbeResult,
    phase: str,
    kernel: str | None = None,
) -> DramBandwidth | None:
    """Run the bandwidth probe now, every kernel at the decode's thread count and CPUs (all of them where the
    runtime picks: the most bandwidth, so the lowest floor); the floor takes the best kernel. Its records
    join the result under probe `bandwidth`, with `phase` (before / after the decode) in params."""
    from .bandwidth import run_bandwidth

    given: dict[str, Any] = {"threads": [params.threads] if params.threads else "max"}
    if params.affinity:
        given["affinity"] = list(params.affinity)
    if params.bandwidth_mb:
        given["array_mb"] = params.bandwidth_mb
    sub = Job(device=job.device, probe="bandwidth", params=given, timeout_s=job.timeout_s)
    sctx = dataclasses.replace(ctx, probe="bandwidth", model=None, runtime=None, base_params={"phase": phase})
    result = run_bandwidth(device, sub, sctx)
    out.extend(result)
    return dram_bandwidth(result.records, "measured", kernel)


def best_of(*figures: DramBandwidth | None) -> DramBandwidth | None:
    """The highest DRAM-sized figure (else the highest): the most the chip was seen to deliver."""
    found = [f for f in figures if f is not None]
    return max(found, key=lambda f: (f.dram_sized, f.gbps)) if found else None


# ---- the bytes one step reads ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadBytes:
    """What one decode step of a model must read from its weights."""

    per_token: int
    stored: int
    gathered: dict[str, int]  # tables a step reads one row of: name -> stored bytes
    custom_ops: tuple[str, ...]  # ops outside the ONNX domain, as domain:op


def weight_read_bytes(model: Any) -> ReadBytes:
    """Weight bytes one decode step of an ONNX model (a ModelProto) reads: each initializer once, but of a
    table that only Gather reads (an embedding) one row per Gather. Constant nodes are not counted (they
    are shape constants in decoder exports): the count errs low, so the floor stays a floor."""
    import numpy as np
    from onnx import helper

    graph = model.graph
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))
    per_token = stored = 0
    gathered: dict[str, int] = {}
    for init in graph.initializer:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        size = int(np.prod(init.dims, dtype=np.int64)) * itemsize
        stored += size
        uses = consumers.get(init.name, [])
        if uses and init.dims and all(n.op_type == "Gather" and slot == 0 for n, slot in uses):
            gathered[init.name] = size
            per_token += len(uses) * (size // init.dims[0])
        else:
            per_token += size
    custom = sorted({f"{n.domain}:{n.op_type}" for n in graph.node if n.domain not in DEFAULT_DOMAINS})
    return ReadBytes(per_token, stored, gathered, tuple(custom))


def check_convention(model: Any, path: Path) -> None:
    """The decoder convention, checked on the host before anything is pushed: the agent's own rule
    (`agent.decode.find_io`) over the graph's declared inputs and outputs; a ModelError naming the tensor."""
    from onnx import helper

    from ..agent.decode import find_io
    from ..agent.main import TaskError
    from ..agent.session import InputInfo

    graph = model.graph
    weights = {init.name for init in graph.initializer}
    infos = []
    for value in graph.input:
        if value.name in weights:
            continue
        t = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        infos.append(InputInfo(value.name, shape, helper.tensor_dtype_to_np_dtype(t.elem_type).name))
    try:
        find_io(infos, [o.name for o in graph.output])
    except TaskError as exc:
        raise ModelError(f"{path.name}: {exc}") from None


def inspect_decoder(path: Path) -> ReadBytes:
    """Load the ONNX decoder once: check its convention and count the bytes a step reads."""
    import onnx

    model = onnx.load(str(path))
    check_convention(model, path)
    return weight_read_bytes(model)


# ---- the probe ---------------------------------------------------------------------------------------------
def decode_task(params: DecodeParams, runtime: str, remote_model: str) -> DecodeTask:
    return DecodeTask(
        model=remote_model,
        runtime=runtime,
        threads=params.threads,
        seed=params.seed,
        affinity=list(params.affinity) if params.affinity else None,
        prompt_tokens=params.prompt_tokens,
        new_tokens=params.new_tokens,
        rounds=params.rounds,
        warmup=params.warmup,
        warmup_seconds=params.warmup_seconds,
        min_seconds=params.min_seconds,
        max_seconds=params.max_seconds,
        verify=params.verify,
    )


def run_decode(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    """The agent's decode of an ONNX (or MNN) decoder; a runtime whose own tool decodes is sent there by
    `decode_llama.run_decode`, the probe's entry."""
    params = DecodeParams.of(job)
    model = require_model(job)
    runtime = runtime_of(model, job.runtime)
    if runtime not in DECODE_RUNTIMES:
        raise UserError(f"decode runs on {' or '.join(DECODE_RUNTIMES)}, not {runtime}")
    ctx.runtime = runtime
    # The sequence lengths are what a decode measured: every record names them, defaults included.
    ctx.base_params = {
        **params.identity(),
        "prompt_tokens": params.prompt_tokens,
        "new_tokens": params.new_tokens,
    }
    rt = runtime_named(runtime)
    if device.spec.agent == "native":
        raise UserError(
            f"{device.name} runs no Python agent: decode there runs on llama.cpp (a GGUF model) alone, "
            f"not {rt.display}"
        )
    if params.depths != (0,) or params.repack is not None or params.kv_type is not None:
        raise UserError(
            "--depths, --repack and --kv-type are llama.cpp's (llama-bench): the agent decodes at depth 0 "
            "with the model's own cache"
        )
    weights = inspect_decoder(model.path) if model.format == "onnx" else None
    if rt.converter(model.format) is not None and weights and weights.custom_ops:
        raise ModelError(
            f"{model.path}: {rt.display}'s converter does not take {', '.join(weights.custom_ops)} "
            f"(quantized onnxruntime ops): run the fp32 decoder on {rt.display}, or this one with "
            "--runtime onnxruntime"
        )
    out = ProbeResult()
    stored = DramBandwidth.from_params(params.bandwidth) if params.bandwidth else None
    measure = params.floor and stored is None
    # Measured here, the bandwidth is taken before and after the decode and the best kept: on a shared
    # device a co-runner can halve one run's figure, and a floor must not rest on a disturbed one.
    before = measure_dram_bandwidth(device, job, params, ctx, out, "before") if measure else None
    remote_model, _ = push_model_and_inputs(device, job, runtime, None)
    reply = device.run_agent(decode_task(params, runtime, remote_model), job_timeout(device, job))
    after = measure_dram_bandwidth(device, job, params, ctx, out, "after") if measure else None
    bandwidth = stored or best_of(before, after)
    out.extend(decode_records(ctx, reply, weights if params.floor else None, bandwidth))
    if params.floor and weights is None:
        out.warnings.append(
            f"no decode_floor_ms: weight bytes are counted from the ONNX graph, and {model.path.name} is "
            f"{model.format}"
        )
    return out


def decode_records(
    ctx: RecordContext, reply: AgentReply, weights: ReadBytes | None, bandwidth: DramBandwidth | None
) -> ProbeResult:
    """Records from the agent's raw decode result: statistics from the kept per-step samples."""
    r = reply.result
    ctx.base_annotations = {**ctx.base_annotations, **run_notes(r)}
    out = ProbeResult(warnings=list(reply.warnings) + check_warnings(r))
    prompt, steps = int(r["prompt_tokens"]), [float(t) for rnd in r["step_ms"] for t in rnd]
    ttft = summarize(r["ttft_ms"])
    for stat, value in (("p50", ttft.percentiles["p50"]), ("mean", ttft.mean), ("min", ttft.min)):
        out.records.append(ctx.record("ttft_ms", value, "ms", {"n": ttft.n}, stat=stat))
    out.records.append(
        ctx.record(
            "prefill_tokens_per_s", prompt / (ttft.percentiles["p50"] / 1e3), "tokens/s", {"n": ttft.n}
        )
    )
    s = summarize(steps)
    stats = {**s.percentiles, "mean": s.mean, "min": s.min, "max": s.max}
    for stat, value in stats.items():
        out.records.append(ctx.record("decode_ms_per_token", value, "ms", {"n": s.n}, stat=stat))
    out.warnings += [
        f"decode_ms_per_token {why}; decode more (--new-tokens, --rounds)" for why in s.refused.values()
    ]
    if s.outliers:
        out.warnings.append(
            f"{s.outliers} of {s.n} decode steps are outliers (modified z-score > {OUTLIER_Z:g}): "
            "the device was disturbed"
        )
    total_s = sum(steps) / 1e3
    out.records.append(
        ctx.record("decode_tokens_per_s", s.n / total_s, "tokens/s", {"n": s.n, "decode_s": total_s})
    )
    kv_notes = {"kv_cache_bytes": r["kv_cache_bytes"], "positions": prompt + int(r["new_tokens"])}
    out.records.append(ctx.record("kv_cache_mb", r["kv_cache_bytes"] / MIB, "MB", kv_notes))
    rss = {"rss_before_load_mb": r.get("rss_before_load_mb"), "rss_after_load_mb": r.get("rss_after_load_mb")}
    out.records.append(ctx.record("peak_rss_mb", r["peak_rss_mb"], "MB", rss))
    out.records.append(ctx.record("load_ms", r["load_ms"], "ms"))
    out.records.append(ctx.record("first_prefill_ms", r["first_prefill_ms"], "ms"))
    out.samples.append(ctx.samples("decode_ms_per_token", "ms", steps, {"rounds": len(r["step_ms"])}))
    out.samples.append(ctx.samples("ttft_ms", "ms", r["ttft_ms"]))
    if weights is not None and bandwidth is not None:
        out.extend(floor_records(ctx, r, weights, bandwidth, s.percentiles["p50"]))
    return out


def run_notes(r: dict[str, Any]) -> dict[str, Any]:
    """What every record of the decode carries about how it ran."""
    return {
        "runtime_version": r.get("runtime_version"),
        "rounds": len(r["step_ms"]),
        "warmup": r.get("warmup"),
        "warmup_seconds": r.get("warmup_seconds"),
        "vocab": r.get("vocab"),
        "layers": r.get("layers"),
        "cache_inputs": r.get("cache_inputs"),
        "position_ids": r.get("position_ids"),
        "kv_check": r.get("check"),
        "rounds_agree": r.get("rounds_agree"),
        "generated_tokens": (r.get("tokens") or [])[:GENERATED_KEPT],
        "affinity": r.get("affinity"),
    }


def check_warnings(r: dict[str, Any]) -> list[str]:
    """The cached decode against a full recompute of the same tokens: a disagreement says the cache was
    not fed back as the model expects (or, for dynamically quantized models, that activation scales differ
    between a prefill and a step)."""
    check = r.get("check")
    if not check or check["tokens_agree"] == check["tokens"]:
        return []
    return [
        f"the cached decode picks {check['tokens'] - check['tokens_agree']} of {check['tokens']} tokens "
        f"differently from a full recompute without the cache (last logits differ by "
        f"{check['last_logits_rel_diff']:.2g} relative)"
    ]


def floor_records(
    ctx: RecordContext, r: dict[str, Any], weights: ReadBytes, bw: DramBandwidth, p50_ms: float
) -> ProbeResult:
    """decode_floor_ms at the median step and decode_efficiency = floor / p50, flagged where unbacked."""
    out = ProbeResult()
    prompt, steps, kv_pp = int(r["prompt_tokens"]), int(r["new_tokens"]), int(r["kv_bytes_per_position"])
    bytes_per_s = bw.gbps * 1e9

    def floor_ms(past: float) -> float:
        return (weights.per_token + kv_pp * past) / bytes_per_s * 1e3

    median_past = prompt + (steps - 1) / 2
    regime = weight_regime(weights.per_token, bw.llc_bytes)
    uncertain = regime != "dram" or not bw.dram_sized
    notes = {
        "weight_bytes_per_token": weights.per_token,
        "stored_weight_bytes": weights.stored,
        "gathered_tables": weights.gathered,
        "kv_bytes_per_token": kv_pp * median_past,
        "kv_bytes_per_position": kv_pp,
        "floor_first_ms": floor_ms(prompt),
        "floor_last_ms": floor_ms(prompt + steps - 1),
        "bandwidth_gbps": bw.gbps,
        "bandwidth_run": bw.run_id,
        "bandwidth_source": bw.source,
        "bandwidth_kernel": bw.kernel,
        "bandwidth_threads": bw.threads,
        "bandwidth_array_bytes": bw.array_bytes,
        "bandwidth_phase": bw.phase,
        "llc_bytes": bw.llc_bytes,
        "regime": regime,
        "uncertain": uncertain,
    }
    floor = floor_ms(median_past)
    out.records.append(ctx.record("decode_floor_ms", floor, "ms", notes))
    eff = floor / p50_ms
    beats = p50_ms < floor * (1.0 - BEATS_FLOOR_MARGIN)
    out.records.append(
        ctx.record(
            "decode_efficiency",
            eff,
            "ratio",
            {**notes, "floor_ms": floor, "measured_p50_ms": p50_ms, "beats_floor": beats},
        )
    )
    out.warnings += floor_warnings(weights, bw, regime, beats, floor, p50_ms)
    return out


def weight_regime(weight_bytes: int, llc_bytes: int | None) -> str:
    """'dram' when the weights are at least twice the last-level cache, 'cache' under it, else 'unknown'."""
    if not llc_bytes:
        return "unknown"
    return "dram" if weight_bytes >= WEIGHTS_LLC_MULTIPLE * llc_bytes else "cache"


def floor_warnings(
    weights: ReadBytes, bw: DramBandwidth, regime: str, beats: bool, floor: float, p50: float
) -> list[str]:
    out = []
    if not bw.dram_sized:
        out.append(
            f"the bandwidth run {bw.run_id} used arrays of {(bw.array_bytes or 0) / MIB:.0f} MiB, not "
            f"{DRAM_LLC_MULTIPLE}x the last-level cache: decode_floor_ms is uncertain"
        )
    if regime == "cache":
        out.append(
            f"the weights read per token ({weights.per_token / MIB:.0f} MiB) are under "
            f"{WEIGHTS_LLC_MULTIPLE}x the last-level cache ({(bw.llc_bytes or 0) / MIB:.0f} MiB): caches may "
            "feed them faster than DRAM, so decode_floor_ms is uncertain"
        )
    elif beats:
        out.append(
            f"decode p50 {p50:.4g} ms beats the bandwidth floor {floor:.4g} ms: the DRAM bandwidth "
            f"({bw.gbps:.3g} GB/s, run {bw.run_id}) was measured too low; re-measure with "
            "`edgebench probe bandwidth`"
        )
    return out
