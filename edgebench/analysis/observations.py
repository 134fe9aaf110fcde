"""What was measured, per target x model, as fit reads it from the records: the latency statistics of the
configuration judged, memory, load time, energy, workloads, tails and decode speed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..records import Record, Samples
from ..runtimes import target_label
from .disturbance import PREFIX as DISTURBANCE_PREFIX
from .fit_result import STATS
from .model_counts import ModelCounts
from .tails import TailCheck, check_tail


@dataclass(frozen=True)
class Observation:
    """One model measured on one target, at its best measured configuration (lowest p50)."""

    device: str
    runtime: str | None
    model: str
    run_id: str
    config: dict[str, Any]
    latency: dict[str, float]
    memory_mb: float | None = None  # the model's own memory: the high end of memory_range
    load_ms: float | None = None
    energy_mj: float | None = None
    samples_n: int | None = None
    estimated: tuple[str, ...] = ()
    rtf: dict[str, float] = field(default_factory=dict)  # stat -> real-time factor (bench --stream)
    cold_load_ms: float | None = None  # bench --cold-load
    decode_tokens_per_s: float | None = None
    # model memory's low and high over the configuration's invocations, the process peak and the runtime +
    # harness baseline (the process just before the load), and what measured it
    memory_range: tuple[float, float] | None = None
    process_memory_mb: float | None = None
    baseline_mb: float | None = None
    memory_source: str | None = None
    tails: dict[str, TailCheck] = field(default_factory=dict)  # tail stat -> its samples' make-up
    # Where a backend's run ran (agent.placement, as its records carry it); empty for the CPU or when the
    # records say nothing
    placement: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> tuple[str, str | None]:
        return (self.device, self.runtime)


# What the calibration fits: the fastest sample, the model's cost with the least interference. Another
# process on the device can double a p50; it rarely moves the minimum. Percentiles are then the target's
# typical ratio to it (p50 / min, p99 / min over its measured models).
BASE_STAT = "min"


def base_latency(o: Observation) -> float:
    """The latency the calibration fits (the minimum, or the p50 when no minimum was recorded)."""
    return float(o.latency.get(BASE_STAT) or o.latency.get("p50") or 0.0)


MEASURING_PROBES = ("bench", "threads")


def config_key(r: Record | Samples) -> str:
    """A configuration is what `Record.key()` pairs on, minus the statistic."""
    return r.probe + r.key().series().params


def observations(
    records: Sequence[Record],
    samples: Sequence[Samples] = (),
    run_order: Sequence[str] = (),
    counts: Mapping[str, ModelCounts] | None = None,
) -> list[Observation]:
    """Latency measurements per target x model: the latest run of each configuration, then the best one.

    Configurations come from `bench` jobs and from the points of `threads` sweeps (a thread count, an
    affinity), so the best is what the engineer would deploy. With `counts`, a model's configurations are
    only those benched at the shapes its counts were made at: FLOPs and latency pair at the same shapes.
    """
    order = {rid: i for i, rid in enumerate(run_order)}
    groups: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r.probe not in MEASURING_PROBES or r.model is None or r.value is None:
            continue
        key = (r.run_id, r.device, r.runtime, r.model, config_key(r))
        g = groups.setdefault(key, {"latency": {}, "ts": r.ts, "config": r.key().series().param_dict()})
        _add_to_group(g, r)
    raw: dict[tuple, list[float]] = defaultdict(list)  # a run's samples, pooled over its invocations
    for s in samples:
        if s.probe in MEASURING_PROBES and s.metric == "latency_ms":
            raw[(s.run_id, s.device, s.runtime, s.model, config_key(s))] += list(s.values)
    for g in groups.values():  # a repeated configuration's statistic: the median of its invocations'
        g["latency"] = {stat: float(np.median(values)) for stat, values in g["latency"].items()}
    energy = _energy_by_pair(records, order)
    streams = _workloads_by_pair(records, order)
    decode = decode_by_pair(records, order)
    latest: dict[tuple, tuple] = {}
    for key, g in groups.items():
        if "p50" not in g["latency"]:
            continue
        run_id, device, runtime, model, cfg = key
        rank = (order.get(run_id, -1), g["ts"])
        ident = (device, runtime, model, cfg)
        if ident not in latest or rank > latest[ident][0]:
            latest[ident] = (rank, key, g)
    best: dict[tuple, Observation] = {}
    for (device, real_runtime, model, _cfg), (_rank, key, g) in latest.items():
        runtime = target_label(real_runtime, g["config"].get("backend"))  # each backend a target of its own
        if counts and model in counts and not counts[model].counted_at(g["config"].get("shapes")):
            continue  # benched at other shapes than the counts: not this model's measurement
        lat = dict(g["latency"])
        estimated: list[str] = []
        if "p99" not in lat and key in raw and raw[key]:
            lat["p99"] = float(np.percentile(np.asarray(raw[key], dtype=float), 99))
            estimated.append("p99")
        mem = _model_memory(g)  # the chosen run's invocations: an older build's memory is not this one's
        obs = Observation(
            device=device,
            runtime=runtime,
            model=model,
            run_id=key[0],
            config=g["config"],
            latency=lat,
            memory_mb=max(mem) if mem else None,
            memory_range=(min(mem), max(mem)) if mem else None,
            process_memory_mb=g.get("peak_rss_mb"),
            baseline_mb=g.get("baseline_mb"),
            memory_source=g.get("memory_source")
            or ("peak_rss_mb - rss_before_load_mb (process)" if mem else None),
            tails=_tails(raw.get(key), g.get("disturbance")),
            placement=dict(g.get("placement") or {}),
            load_ms=g.get("load_ms"),
            energy_mj=energy.get((device, runtime, model)),
            samples_n=int(g["samples_n"]) if g.get("samples_n") else None,
            estimated=tuple(estimated),
            rtf={
                k[4:]: v for k, v in streams.get((device, runtime, model), {}).items() if k.startswith("rtf:")
            },
            cold_load_ms=streams.get((device, runtime, model), {}).get("cold_load_ms"),
            decode_tokens_per_s=decode[(device, runtime, model)].rate
            if (device, runtime, model) in decode
            else None,
        )
        ident2 = (device, runtime, model)
        if ident2 not in best or obs.latency["p50"] < best[ident2].latency["p50"]:
            best[ident2] = obs
    return sorted(best.values(), key=lambda o: (o.device, o.runtime or "", o.model))


def _add_to_group(g: dict[str, Any], r: Record) -> None:
    """One measuring record into its run x configuration's group: latency statistics (one per
    invocation), what else used the device, memory, load time, sample count."""
    # A streaming bench's frame latency is its latency (a model measured only frame by frame still fits).
    if r.metric in ("latency_ms", "frame_latency_ms") and r.params.get("stat") in STATS:
        g["latency"].setdefault(r.params["stat"], []).append(r.value)  # one per invocation
        placed = r.annotations.get("placement")
        if placed and placed.get("requested") not in (None, "cpu") and not _full(g.get("placement")):
            g["placement"] = placed  # the invocations' worst: one short of the backend is kept
    elif r.metric.startswith(DISTURBANCE_PREFIX):
        # What else used the device, where the job measured it: the worst invocation's figure.
        name = r.metric[len(DISTURBANCE_PREFIX) :]
        seen = g.setdefault("disturbance", {})
        seen[name] = max(r.value, seen.get(name, r.value))
    elif r.metric in ("peak_rss_mb", "load_ms", "samples_n"):
        g[r.metric] = r.value
        if r.metric == "peak_rss_mb" and r.annotations.get("rss_before_load_mb") is not None:
            g.setdefault("baseline_mb", r.annotations["rss_before_load_mb"])
    elif r.metric in ("model_memory_mb", "rss_increase_mb", "memory_growth_mb"):
        g.setdefault(r.metric, []).append(r.value)
        if r.metric != "rss_increase_mb" and (r.metric == "model_memory_mb" or "memory_source" not in g):
            g["memory_source"] = r.annotations.get("measured_by") or r.metric
            if r.annotations.get("baseline_mb") is not None:
                g["baseline_mb"] = r.annotations["baseline_mb"]


def _full(placement: Mapping[str, Any] | None) -> bool:
    """A placement already kept that is short of nothing (None: none kept yet)."""
    return bool(placement) and placement is not None and placement.get("actual") == placement.get("requested")


def _tails(values: Sequence[float] | None, measured: Mapping[str, Any] | None) -> dict[str, TailCheck]:
    """What each tail percentile of a configuration's kept samples is made of (edgebench.analysis.tails)."""
    out = {}
    for stat in ("p90", "p99", "max"):
        check = check_tail(values or (), stat, measured)
        if check is not None:
            out[stat] = check
    return out


def _model_memory(g: Mapping[str, Any]) -> list[float]:
    """A configuration's model memory per invocation: `model_memory_mb`, or in stores written before it
    existed `rss_increase_mb` (the process peak over the process before the load, the same when the
    peak came after the load) or that difference of `peak_rss_mb` and its `rss_before_load_mb`, or for a
    native runner the growth its tool reports (`memory_growth_mb`)."""
    values = g.get("model_memory_mb") or g.get("rss_increase_mb") or g.get("memory_growth_mb") or []
    if not values and g.get("peak_rss_mb") is not None and g.get("baseline_mb") is not None:
        values = [max(0.0, g["peak_rss_mb"] - g["baseline_mb"])]  # v1 stores: the same figure, by hand
    return [float(v) for v in values if v is not None]


def _workloads_by_pair(records: Sequence[Record], order: Mapping[str, int]) -> dict[tuple, dict[str, float]]:
    """Per (device, runtime, model), the latest streaming RTF by stat (`rtf:p99`) and cold load time."""
    out: dict[tuple, dict[str, tuple]] = {}
    for r in records:
        if r.probe != "bench" or not r.model or r.value is None:
            continue
        if r.metric == "rtf" and r.params.get("stat"):
            name = f"rtf:{r.params['stat']}"
        elif r.metric == "load_ms" and r.params.get("cache") == "cold":
            name = "cold_load_ms"
        else:
            continue
        slot = out.setdefault((r.device, r.runtime, r.model), {})
        rank = (order.get(r.run_id, -1), r.ts)
        if name not in slot or rank > slot[name][0]:
            slot[name] = (rank, r.value)
    return {k: {n: v for n, (_, v) in d.items()} for k, d in out.items()}


def _energy_by_pair(records: Sequence[Record], order: Mapping[str, int]) -> dict[tuple, float]:
    out: dict[tuple, tuple] = {}
    for r in records:
        if r.probe == "power" and r.metric == "energy_mj_per_inference" and r.model and r.value is not None:
            ident = (r.device, r.runtime, r.model)
            rank = (order.get(r.run_id, -1), r.ts)
            if ident not in out or rank > out[ident][0]:
                out[ident] = (rank, r.value)
    return {k: v for k, (_, v) in out.items()}


@dataclass(frozen=True)
class DecodeSpeed:
    """A model's decode on a target: the fastest decode_tokens_per_s of its latest decode run."""

    rate: float
    run_id: str
    config: dict[str, Any]
    memory_mb: float | None = None  # the model's: the process peak over the process before the load
    load_ms: float | None = None
    process_memory_mb: float | None = None


def decode_by_pair(
    records: Sequence[Record], order: Mapping[str, int] | None = None
) -> dict[tuple, DecodeSpeed]:
    """(device, runtime, model) -> its decode speed, from `decode` records: the latest run that decoded
    the model there, its fastest configuration (with that configuration's peak memory and load time)."""
    order = order or {}
    decode = [r for r in records if r.probe == "decode" and r.model and r.value is not None]
    latest: dict[tuple, tuple] = {}
    for r in decode:
        if r.metric == "decode_tokens_per_s":
            ident, rank = (r.device, r.runtime, r.model), (order.get(r.run_id, -1), r.ts)
            if ident not in latest or rank > latest[ident][0]:
                latest[ident] = (rank, r.run_id)
    by_config = {(r.run_id, config_key(r), r.metric): r.value for r in decode}
    before = {
        (r.run_id, config_key(r)): r.annotations.get("rss_before_load_mb")
        for r in decode
        if r.metric == "peak_rss_mb"
    }
    out: dict[tuple, DecodeSpeed] = {}
    for r in decode:
        ident = (r.device, r.runtime, r.model)
        if r.metric != "decode_tokens_per_s" or r.run_id != latest[ident][1]:
            continue
        if ident not in out or float(r.value or 0.0) > out[ident].rate:
            cfg = config_key(r)
            peak, base = by_config.get((r.run_id, cfg, "peak_rss_mb")), before.get((r.run_id, cfg))
            out[ident] = DecodeSpeed(
                float(r.value or 0.0),
                r.run_id,
                r.key().series().param_dict(),
                None if peak is None or base is None else max(0.0, peak - base),
                by_config.get((r.run_id, cfg, "load_ms")),
                peak,
            )
    return out
