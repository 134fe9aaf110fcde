"""Which model fits which chip: budget verdicts from measurements, predictions for pairs never measured.

A *target* is a device and a runtime. For every target x model, `assess` gives a verdict against the
budgets (latency at a percentile, memory, energy per inference, load time), with `basis` =
`measured` when the model was benched on that target and `predicted` when it was not.

Memory: `memory_mb` is the model's own memory (`model_memory_mb` of the bench records: the peak resident set
over load and inference minus the process just before the load), the high end of its range over the
invocations of the configuration judged, so the runtime's and the harness's baseline (the interpreter and
its libraries, ~50 MB for a Python agent with onnxruntime) is not charged to the model; that baseline is
shown beside it. `process_memory_mb` budgets the whole process's peak (`peak_rss_mb`).

How a latency is predicted (the calibrated roofline):

1. Static counts of the model (per node: FLOPs, weight bytes, activation bytes; `edgebench.analysis.cost`) and
   the target's measured ceilings (fp32 `effective_tops` and bandwidth of the latest ceiling runs,
   edgebench.analysis.ceilings; when the store has none, the best rates the target's own benched models
   reached stand in, without the model held out in cross-validation) turn each model into a few
   *floor times*: the time its compute-bound nodes would take at peak FLOP/s, the time its memory-bound
   nodes would take at full bandwidth (weights split at the last-level cache), its node count (per-op
   dispatch overhead), and so on.
2. The fastest inference of the models already measured on the target (the cost least disturbed by other
   load) is fitted on those floor times by non-negative least squares with relative errors, Huber-
   reweighted against disturbed runs. The coefficients are inverse efficiencies per bound (2.5 on the
   compute floor = 40% of peak), plus overheads. Several feature sets, from a single efficiency to
   per-op-class efficiencies, are fitted and cross-validated on the measured models, and averaged with
   weights from their errors, so the model grows with the data instead of over-fitting three measurements.
3. A local correction: what the calibration got wrong on the most similar measured models (by size and op
   mix) is applied to the new one, when that lowers the cross-validated error. It catches what whole-model
   counts miss: family-specific kernel efficiency, weights that stop fitting in the last-level cache.
4. When the model was measured on other targets, its residual there (how much slower or faster it ran than
   those targets' calibrations expected) carries over, when that lowers the cross-validated error.
5. Percentiles (p50, p99 ...) are the predicted fastest inference times the target's own ratio of that
   percentile to it, a smooth function of latency (long inferences are pre-empted more on a busy device).

Leave-one-model-out cross-validation on the measured pairs says how far to trust it: `holdout=pair`
hides one model on one target (other targets keep it: the "benched elsewhere, not here" case) and
`holdout=model` hides it from every target (a model never benched anywhere). Both are kept as records
(`cv_within_10pct`, `cv_median_abs_err`, one `cv_error` per pair) so reports show them next to the
predictions. Where the store holds per-op profiles, the per-kernel predictor (edgebench.analysis.
kernel_predict) predicts instead; its own leave-one-model-out residuals (each profiled model at each of
its shapes, predicted from its graph by a calibration that never saw it) are kept the same way, with
`predictor=kernel` in their params and the interval they give (measured / predicted at
INTERVAL_COVERAGE) in the summaries' annotations.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, ModelError, UserError
from ..records import Record, Samples, utc_now
from .disturbance import PREFIX as DISTURBANCE_PREFIX
from .tails import TailCheck, check_tail
from .variants import VariantRow, variant_rows

PROBE = "fit"
STATS = ("p50", "p90", "p99", "mean", "min", "max")
WITHIN = 0.10  # the cross-validation figure: share of held-out pairs within +-10%
AGGREGATE_DEVICE = "*"  # device name of fleet-wide records
# Held-out models a share within +-10% is judged from (fewer: "too few models to judge", with the command
# that gives enough). The whole-model predictor fits one point per model on up to 7 coefficients: with
# fewer than 8 models each held-out calibration falls back to its two- or three-coefficient forms, and
# the share judges those, not the predictor a fleet gets. The per-kernel predictor fits its coefficients
# on every profiled kernel and sample, so the held-out models only count how often it lands: one of
# five moves the share by 20%.
MIN_JUDGED_MODELS = 8
MIN_JUDGED_KERNEL_MODELS = 5
MIN_SAMPLES_P99 = 100

# ---------------------------------------------------------------------------------------------- budgets


@dataclass(frozen=True)
class Budget:
    """One budget: `latency_p99_ms=15`, `memory_mb=60` (the model's own memory), `process_memory_mb=120`
    (the whole process's peak), `energy_mj=5`, `load_ms=300`, `decode_tokens_per_s_min=20` (a floor: the
    value must reach the limit, not stay under it)."""

    key: str
    limit: float
    quantity: str  # latency | memory (the model's) | process_memory | energy | load | decode
    stat: str | None = None  # for latency
    unit: str = ""
    at_least: bool = False  # the value must be at least the limit (a rate), not at most

    def margin(self, value: float) -> float:
        """Headroom as a share of the limit: >= 0 fits."""
        return (value - self.limit if self.at_least else self.limit - value) / self.limit


_LATENCY_KEY = re.compile(r"^latency_(p50|p90|p99|mean|min|max)_ms$")
_RTF_KEY = re.compile(r"^rtf_(p50|p90|p99|mean)$")  # real-time factor of a streaming bench
BUDGET_KEYS_HELP = (
    "latency_<p50|p90|p99|mean|max>_ms, memory_mb, process_memory_mb, energy_mj, load_ms, cold_load_ms, "
    "rtf_<p50|p90|p99|mean>, decode_tokens_per_s_min"
)


def make_budget(key: str, limit: Any, where: str = "--budget") -> Budget:
    """A Budget from its key and limit; anything else is a one-line error naming where it came from."""
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not math.isfinite(limit)
        or limit <= 0
    ):
        raise UserError(f"{where} {key}: limit must be a positive number, got {limit!r}")
    limit = float(limit)
    m = _LATENCY_KEY.match(key)
    if m:
        return Budget(key, limit, "latency", m.group(1), "ms")
    m = _RTF_KEY.match(key)
    if m:
        return Budget(key, limit, "rtf", m.group(1), "ratio")
    fixed = {
        "memory_mb": ("memory", "MB"),
        "process_memory_mb": ("process_memory", "MB"),
        "energy_mj": ("energy", "mJ"),
        "load_ms": ("load", "ms"),
        "cold_load_ms": ("cold_load", "ms"),
    }
    if key in fixed:
        quantity, unit = fixed[key]
        return Budget(key, limit, quantity, None, unit)
    if key == "decode_tokens_per_s_min":
        return Budget(key, limit, "decode", None, "tokens/s", at_least=True)
    raise UserError(f"{where} {key}: unknown budget (use {BUDGET_KEYS_HELP})")


def parse_budgets(items: Iterable[str], base: Sequence[Budget] = ()) -> tuple[Budget, ...]:
    """`KEY=VALUE` strings on top of `base` (e.g. a suite's [budget]); a later key replaces an earlier one."""
    out = {b.key: b for b in base}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not key or number is None:
            raise UserError(f"--budget {item!r}: expected KEY=NUMBER like latency_p99_ms=15")
        out[key] = make_budget(key, number)
    return tuple(out.values())


def budgets_from_suite(path: Path) -> tuple[Budget, ...]:
    """The `[budget]` table of a suite file (the rest of the suite belongs to the suite loader)."""
    from ..tomlread import load_toml

    data = load_toml(path)
    table = data.get("budget", {})
    if not isinstance(table, dict):
        raise ConfigError(path, "budget: expected a table")
    out = []
    for key, value in table.items():
        try:
            out.append(make_budget(key, value, where="budget."))
        except UserError as exc:
            raise ConfigError(path, str(exc).replace("budget. ", "budget.")) from None
    return tuple(out)


# ------------------------------------------------------------------------------------------ model counts


@dataclass(frozen=True)
class OpCost:
    """What one node costs at run time: FLOPs, the weight bytes it reads, the activation bytes it moves."""

    op_type: str
    flops: float
    weight_bytes: float
    activation_bytes: float


@dataclass(frozen=True)
class ModelCounts:
    """Static counts of one model. `nodes` is empty when only totals are known (e.g. from stored records)."""

    name: str
    flops: float
    weight_bytes: float
    nodes: tuple[OpCost, ...] = ()
    source: str = ""
    warnings: tuple[str, ...] = ()
    # The shapes the counts were made at, as given (None: not known, e.g. totals from the store), and
    # the dims every input took with nothing given (dynamic dimensions at 1, as the analysis takes them).
    shapes: dict[str, list[int]] | None = None
    declared: dict[str, list[int]] = field(default_factory=dict)

    @property
    def node_count(self) -> int | None:
        return len(self.nodes) or None

    def counted_at(self, bench_shapes: Mapping[str, Sequence[int]] | None) -> bool:
        """Whether a bench with these `shapes` params ran the inputs these counts were made at (an input
        neither side gives takes its declared dims on both). True when the counts' shapes are unknown."""
        if self.shapes is None:
            return True
        given = {k: list(v) for k, v in (bench_shapes or {}).items()}
        names = set(given) | set(self.shapes)
        return all(
            given.get(k, self.declared.get(k)) == self.shapes.get(k, self.declared.get(k)) for k in names
        )


def count_model(path: Path, name: str, shapes: Mapping[str, Sequence[int]] | None = None) -> ModelCounts:
    """Static counts of an ONNX model file, per node, from the roofline analysis (`edgebench.analysis.cost`).

    The analysis gives each node's FLOPs and the bytes it writes; this adds the weight bytes each node reads
    (its constant inputs, shape and index parameters excepted) and the activation bytes it reads, which is
    what tells a memory-bound node from a compute-bound one.
    """
    from .cost import PARAM_INPUTS, analyze, load_model, storage_bytes

    if path.suffix.lower() != ".onnx":
        raise ModelError(f"{path}: fit needs the ONNX model to count FLOPs and bytes (got {path.suffix})")
    model = load_model(path)
    # One --shape list serves several models: each takes the names that are its inputs.
    inputs = {vi.name for vi in model.graph.input}
    cost = analyze(model, {k: [int(d) for d in v] for k, v in (shapes or {}).items() if k in inputs})
    stored: dict[str, int] = {}
    for init in model.graph.initializer:
        stored[init.name] = storage_bytes(init.data_type, int(np.prod(init.dims)) if init.dims else 1)
    constant: dict[str, frozenset[str]] = {n: frozenset([n]) for n in stored}
    reads: dict[str, tuple[float, float]] = {}  # node key -> (weight bytes, tensor names read)
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        key = node.name or f"{node.op_type}:{node.output[0] if node.output else ''}"
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            t = node.attribute[0].t
            stored[node.output[0]] = storage_bytes(t.data_type, int(np.prod(t.dims)) if t.dims else 1)
            constant[node.output[0]] = frozenset([node.output[0]])
            continue
        ins = [x for x in node.input if x]
        if ins and all(x in constant for x in ins):  # folded at load time: a constant, not work
            for out in node.output:
                constant[out] = frozenset().union(*(constant[x] for x in ins))
            continue
        params = PARAM_INPUTS.get(node.op_type, set()) if not node.domain else set()
        sources: set[str] = set()
        for i, x in enumerate(node.input):
            if x in constant and i not in params:
                sources |= constant[x]
        reads[key] = (float(sum(stored.get(src, 0) for src in sources)), 0.0)
        readers[key] = [x for x in ins if x not in constant]
    written: dict[str, float] = {}
    by_key = {n.name or f"{n.op_type}:{n.output[0] if n.output else ''}": n for n in model.graph.node}
    for nc in cost.nodes:
        node = by_key.get(nc.name)
        outs = [o for o in (node.output if node is not None else []) if o]
        for o in outs:
            written[o] = nc.output_bytes / len(outs)
    itemsize = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    for name, dims in cost.inputs.items():
        written[name] = float(storage_bytes(itemsize.get(name, 1), int(np.prod(dims)) if dims else 1))
    nodes = []
    for nc in cost.nodes:
        weights, _ = reads.get(nc.name, (0.0, 0.0))
        read = sum(written.get(x, 0.0) for x in readers.get(nc.name, []))
        nodes.append(OpCost(nc.op_type, float(nc.flops), weights, read + float(nc.output_bytes)))
    return ModelCounts(
        name=name,
        flops=float(cost.flops),
        weight_bytes=float(cost.weight_bytes),
        nodes=tuple(nodes),
        source=str(path),
        warnings=tuple(cost.warnings),
        shapes={k: [int(d) for d in v] for k, v in (shapes or {}).items() if k in inputs},
        declared=_declared_inputs(model),
    )


def _declared_inputs(model: Any) -> dict[str, list[int]]:
    """Each graph input's declared dims, a dynamic one at 1 (the analysis' default)."""
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
    return out


def counts_from_records(records: Iterable[Record]) -> dict[str, ModelCounts]:
    """Totals kept in the store: `roofline` records (`flops`, `weight_bytes`) and earlier fit records."""
    flops: dict[str, float] = {}
    weights: dict[str, float] = {}
    for r in records:
        if r.model is None or r.value is None:
            continue
        if r.probe == "roofline" and r.metric == "flops" and r.params.get("scope", "total") == "total":
            flops[r.model] = r.value  # the model's total (per-op-type breakdowns carry another scope)
        elif r.probe == "roofline" and r.metric == "weight_bytes":
            weights[r.model] = r.value
        elif r.probe == PROBE and r.metric == "fits":
            if "flops" in r.params and "weight_bytes" in r.params:
                flops.setdefault(r.model, float(r.params["flops"]))
                weights.setdefault(r.model, float(r.params["weight_bytes"]))
    return {m: ModelCounts(m, flops[m], weights[m], source="store") for m in flops if m in weights}


# ----------------------------------------------------------------------------------------------- ceilings


@dataclass(frozen=True)
class MachineModel:
    """A device's measured ceilings: FLOP/s (best fp32 effective_tops), bytes/s, last-level cache bytes."""

    peak_flops: float | None = None
    bandwidth: float | None = None
    llc_bytes: float | None = None
    source: str = "measured"


def device_ceilings(
    records: Iterable[Record], device_info: Iterable[Mapping[str, Any]] = (), run_order: Sequence[str] = ()
) -> dict[str, MachineModel]:
    """Per device the fp32 matmul rate and the DRAM bandwidth of its latest ceiling runs (at any thread
    count: the best of the latest run at each, not the maximum of every run ever stored; see
    edgebench.analysis.ceilings), and its LLC size when known. `run_order` is the runs oldest first."""
    from .ceilings import CEILING_PROBES, ceilings_at

    records = [
        r for r in records if r.probe in CEILING_PROBES and r.value is not None and math.isfinite(r.value)
    ]
    tops: dict[str, float] = {}
    bw: dict[str, float] = {}
    for device in sorted({r.device for r in records}):
        found = ceilings_at(records, device, None, None, run_order)
        if found is None:
            continue
        if found.peak_tops.get("fp32"):
            tops[device] = found.peak_tops["fp32"]
        bw[device] = found.bandwidth_gbps
    llc: dict[str, float] = {}
    for info in device_info:
        caches = (info.get("fingerprint") or {}).get("caches") or {}
        sizes = [float(v) for v in caches.values() if isinstance(v, int | float) and v > 0]
        spec_llc = ((info.get("descriptor") or {}).get("spec") or {}).get("llc_bytes")
        if spec_llc:
            llc[info["device"]] = float(spec_llc)
        elif sizes:
            llc[info["device"]] = max(sizes)
    devices = set(tops) | set(bw) | set(llc)
    return {
        d: MachineModel(tops[d] * 1e12 if d in tops else None, bw[d] * 1e9 if d in bw else None, llc.get(d))
        for d in devices
    }


# ------------------------------------------------------------------------------------------- observations


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
        g = groups.setdefault(
            key,
            {
                "latency": {},
                "ts": r.ts,
                "config": r.key().series().param_dict(),
            },
        )
        # A streaming bench's frame latency is its latency (a model measured only frame by frame still fits).
        if r.metric in ("latency_ms", "frame_latency_ms") and r.params.get("stat") in STATS:
            g["latency"].setdefault(r.params["stat"], []).append(r.value)  # one per invocation
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
    for (device, runtime, model, _cfg), (_rank, key, g) in latest.items():
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


def _decode_verdict(
    ident: tuple[str, str | None, str], speed: DecodeSpeed, budgets: Sequence[Budget]
) -> Verdict:
    """A model only decoded on a target (never benched): judged on what the decode measured."""
    measured = {
        "decode": speed.rate,
        "memory": speed.memory_mb,
        "process_memory": speed.process_memory_mb,
        "load": speed.load_ms,
    }
    values = {b.key: measured.get(b.quantity) for b in budgets}
    return _judged(ident, "measured", values, budgets, config=speed.config)


# ------------------------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class FeatureSet:
    """One candidate feature set: names of the floor times it regresses latency on."""

    name: str
    features: tuple[str, ...]
    needs_nodes: bool = False
    needs_llc: bool = False

    @property
    def n_params(self) -> int:
        return len(self.features)


VARIANTS = (
    FeatureSet("efficiency", ("floor",)),
    FeatureSet("overhead+efficiency", ("one", "floor")),
    FeatureSet("per-bound", ("one", "compute", "memory")),
    FeatureSet("per-op-class", ("one", "nodes", "conv", "gemm", "weights", "activations"), needs_nodes=True),
    FeatureSet(
        "per-op-class+cache",
        ("one", "nodes", "conv", "gemm", "weights_cached", "weights_dram", "activations"),
        needs_nodes=True,
        needs_llc=True,
    ),
)
_CONV_OPS = ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose")
KERNEL_WIDTH = 0.35  # similarity kernel width, in decades of size (and shares of op mix)
KERNEL_PRIOR = 0.5  # weight of "no correction" in the local correction (shrinkage)
CAP = math.log(2.0)
RATIO_WIDTH = 0.25  # decades of latency over which a statistic's ratio to the base is averaged
RATIO_PRIOR = 0.3  # weight of the target-wide median ratio
HUBER_K = 1.5  # residuals beyond 1.5 robust standard deviations get proportionally less weight
ROBUST_ITERATIONS = 4
ROBUST_MIN_EXTRA = 3  # robust reweighting needs this many measurements beyond the coefficients
ROBUST_MIN_SCALE = 0.02  # never treat residuals under 2% as outliers (timing noise is at least that)
WEIGHT_POWER = 2.0  # errors beyond 2x count as 2x when choosing between candidates


def floor_times(counts: ModelCounts, ceil: MachineModel) -> dict[str, float]:
    """The model's floor times in ms at the target's ceilings, per bound and per op class."""
    peak = ceil.peak_flops or 1e11
    bw = ceil.bandwidth or 1e10
    ridge = peak / bw  # FLOP per byte where a node turns from memory- to compute-bound
    f: dict[str, float] = defaultdict(float)
    f["one"] = 1.0
    to_ms = 1e3
    if counts.nodes:
        f["nodes"] = float(len(counts.nodes))
        half_llc = 0.5 * ceil.llc_bytes if ceil.llc_bytes else None
        # Weights up to half the LLC stay cached; beyond, a growing share streams from DRAM (all of it
        # once the weights exceed the whole cache: a cyclic pass evicts what the next one needs).
        dram_share = (
            0.0 if half_llc is None else min(1.0, max(0.0, (counts.weight_bytes - half_llc) / half_llc))
        )
        for n in counts.nodes:
            moved = n.weight_bytes + n.activation_bytes
            t_compute = n.flops / peak * to_ms
            t_memory = moved / bw * to_ms
            f["floor"] += max(t_compute, t_memory)
            if n.flops > ridge * moved:
                f["compute"] += t_compute
                f["conv" if n.op_type in _CONV_OPS else "gemm"] += t_compute
            else:
                f["memory"] += t_memory
                w = n.weight_bytes / bw * to_ms
                f["weights"] += w
                f["weights_cached"] += w * (1 - dram_share)
                f["weights_dram"] += w * dram_share
                f["activations"] += n.activation_bytes / bw * to_ms
    else:
        t_compute = counts.flops / peak * to_ms
        t_memory = counts.weight_bytes / bw * to_ms
        f["floor"] = max(t_compute, t_memory)
        f["compute"], f["memory"] = t_compute, t_memory
    return dict(f)


def _descriptor(counts: ModelCounts, ft: Mapping[str, float]) -> np.ndarray:
    """Where a model sits for similarity: its size (decades) and how its floor time splits by class."""
    total = sum(ft.get(k, 0.0) for k in ("compute", "memory")) or 1.0
    conv = ft.get("conv", 0.0) / total
    mem = ft.get("memory", 0.0) / total
    return np.array(
        [
            math.log10(counts.flops + 1.0),
            math.log10(counts.weight_bytes + 1.0),
            math.log10(counts.node_count or 1),
            conv,
            mem,
        ]
    )


@dataclass(frozen=True)
class _Point:
    model: str
    y: float
    x: dict[str, float]
    z: np.ndarray


def _solve(points: Sequence[_Point], variant: FeatureSet) -> np.ndarray:
    """Non-negative least squares on relative errors, made robust by Huber reweighting.

    A measurement disturbed by another process (a p50 twice what it should be) would otherwise drag the
    whole calibration; Huber weights (scale from the median absolute residual) shrink its pull, and with
    only a few more measurements than coefficients the plain fit is kept.
    """
    from scipy.optimize import nnls

    X = np.array([[p.x.get(f, 0.0) for f in variant.features] for p in points], dtype=float)
    y = np.array([p.y for p in points], dtype=float)
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    Xs = X / scale
    w = 1.0 / y
    coef, _ = nnls(Xs * w[:, None], y * w, maxiter=2000)
    if len(points) >= variant.n_params + ROBUST_MIN_EXTRA:
        for _ in range(ROBUST_ITERATIONS):
            rel = np.abs(Xs @ coef - y) / y
            s = max(1.4826 * float(np.median(rel)), ROBUST_MIN_SCALE)
            huber = np.minimum(1.0, HUBER_K * s / np.maximum(rel, 1e-12))
            ww = w * np.sqrt(huber)
            coef, _ = nnls(Xs * ww[:, None], y * ww, maxiter=2000)
    return coef / scale


def _apply(coef: np.ndarray, variant: FeatureSet, x: Mapping[str, float]) -> float:
    return float(sum(c * x.get(f, 0.0) for c, f in zip(coef, variant.features, strict=True)))


def _folds(n: int, k: int = 10) -> list[list[int]]:
    """Leave-one-out up to 10 models; 10 interleaved folds beyond (keeps nested CV affordable)."""
    if n <= k:
        return [[i] for i in range(n)]
    return [list(range(i, n, k)) for i in range(k)]


def _capped(errors: Sequence[float]) -> float:
    return float(np.mean([min(abs(e), CAP) for e in errors])) if errors else math.inf


@dataclass(frozen=True)
class _Member:
    """One fitted feature set of a calibration, with its weight in the average."""

    variant: FeatureSet
    coef: tuple[float, ...]
    weight: float
    cv_error: float


@dataclass(frozen=True)
class LatencyModel:
    """A target's fitted latency model: the feature sets it averages, and the local correction.

    Each candidate feature set is fitted to all measured models; predictions are their weighted geometric
    mean, weights inversely proportional to each one's cross-validated squared error (candidates far worse
    than the best get none). Averaging keeps the variance of a many-parameter fit on few, noisy models down.
    """

    members: tuple[_Member, ...]
    points: tuple[_Point, ...]
    residuals: tuple[float, ...]  # cross-validated log residuals of the points (for the local correction)
    correction: bool
    cv_error: float  # mean capped |log error| of the average on the points
    cv_logs: tuple[float, ...] = ()  # each point's cross-validated log(predicted / measured), as used

    def base(self, x: Mapping[str, float]) -> float:
        logs = 0.0
        for m in self.members:
            logs += m.weight * math.log(max(_apply(np.asarray(m.coef), m.variant, x), 1e-9))
        return math.exp(logs)

    def predict(self, x: Mapping[str, float], z: np.ndarray) -> float:
        pred = self.base(x)
        if self.correction:
            pred *= math.exp(_local_correction(z, self.points, self.residuals))
        return pred

    def describe(self) -> dict[str, Any]:
        top = max(self.members, key=lambda m: m.weight)
        coef = {f: float(c) for f, c in zip(top.variant.features, top.coef, strict=True)}
        out: dict[str, Any] = {
            "method": top.variant.name,
            "models": len(self.points),
            "local_correction": self.correction,
            "coefficients": coef,
            "weights": {m.variant.name: round(m.weight, 3) for m in self.members},
            "cv_log_error": self.cv_error,
        }
        eff = {f: 1.0 / c for f, c in coef.items() if f not in ("one", "nodes") and c > 0}
        if eff:
            out["efficiency"] = eff  # fraction of the ceiling each floor time is run at
        if "one" in coef:
            out["overhead_ms"] = coef["one"]
        if "nodes" in coef:
            out["per_node_us"] = coef["nodes"] * 1e3
        return out


def _local_correction(
    z: np.ndarray, points: Sequence[_Point], residuals: Sequence[float], skip: str | None = None
) -> float:
    num, den = 0.0, KERNEL_PRIOR
    for p, r in zip(points, residuals, strict=True):
        if p.model == skip:
            continue
        d2 = float(np.sum((p.z - z) ** 2))
        w = math.exp(-d2 / (2 * KERNEL_WIDTH**2))
        num += w * r
        den += w
    return num / den


def _cv_predictions(points: Sequence[_Point], variant: FeatureSet) -> list[float] | None:
    """Cross-validated predictions of each point by `variant` fitted on the others."""
    n = len(points)
    preds = [0.0] * n
    for fold in _folds(n):
        train = [p for i, p in enumerate(points) if i not in fold]
        if len(train) < max(1, variant.n_params):
            return None
        coef = _solve(train, variant)
        for i in fold:
            preds[i] = _apply(coef, variant, points[i].x)
    return preds


def calibrate(points: Sequence[_Point], has_nodes: bool, has_llc: bool) -> LatencyModel | None:
    """Fit every candidate feature set the data can support, weight them by cross-validated error, average.

    Then decide on the local correction the same way: kept only when it lowers the cross-validated error.
    """
    n = len(points)
    if n == 0:
        return None
    candidates: list[tuple[FeatureSet, list[float] | None]] = []
    for v in VARIANTS:
        if (v.needs_nodes and not has_nodes) or (v.needs_llc and not has_llc):
            continue
        if v.name != "efficiency" and n < v.n_params + 2:
            continue
        if n == 1:
            candidates.append((v, None))
            continue
        preds = _cv_predictions(points, v)
        if preds is not None:
            candidates.append(
                (v, [math.log(max(pr, 1e-9) / p.y) for pr, p in zip(preds, points, strict=True)])
            )
    if not candidates:
        return None
    if n == 1:
        v = candidates[0][0]
        member = _Member(v, tuple(float(c) for c in _solve(points, v)), 1.0, 0.0)
        return LatencyModel((member,), tuple(points), (0.0,), False, 0.0, (0.0,))
    mse = {
        v.name: float(np.mean([min(abs(e), CAP) ** 2 for e in logs])) + 1e-6 for v, logs in candidates if logs
    }
    best = min(mse.values())
    kept = [(v, logs) for v, logs in candidates if logs and mse[v.name] <= 4 * best]
    total = sum(mse[v.name] ** -WEIGHT_POWER for v, _ in kept)
    members = tuple(
        _Member(
            v, tuple(float(c) for c in _solve(points, v)), mse[v.name] ** -WEIGHT_POWER / total, _capped(logs)
        )
        for v, logs in kept
    )
    logs = [sum(m.weight * lg[i] for m, (_, lg) in zip(members, kept, strict=True)) for i in range(n)]
    err = _capped(logs)
    residuals = tuple(-e for e in logs)
    correction = False
    final = list(logs)
    if n >= 3:
        corrected = [
            logs[i] + _local_correction(p.z, points, residuals, skip=p.model) for i, p in enumerate(points)
        ]
        correction = _capped(corrected) < err
        if correction:
            err, final = _capped(corrected), corrected
    return LatencyModel(members, tuple(points), residuals, correction, err, tuple(final))


# ------------------------------------------------------------------------------------------- assessment


@dataclass(frozen=True)
class Verdict:
    """One target x model against the budgets."""

    device: str
    runtime: str | None
    model: str
    basis: str  # measured | predicted
    values: dict[str, float]  # budget key -> value compared
    fits: bool | None
    limiting: str | None
    margin: float | None
    margins: dict[str, float]
    unchecked: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)
    predicted: dict[str, float] = field(
        default_factory=dict
    )  # predicted_latency_ms (p50/p99), memory, energy
    evidence: str = ""
    estimated: tuple[str, ...] = ()
    counts: ModelCounts | None = None
    # The answer: "fits", "does not fit" or "uncertain" (FITS, NO_FIT, UNCERTAIN; "" without budgets),
    # the value / limit ratio of each budget (0.5 = half the budget, 36 = 36 times over), the interval a
    # prediction's true value lies in (per budget, when one is available) and why the answer is what it is.
    verdict: str = ""
    ratios: dict[str, float] = field(default_factory=dict)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    why: str = ""
    # The memory behind `memory_mb`: the model's range over invocations (`model_mb`: [low, high]), the
    # runtime + harness baseline beside it, the process peak, and what measured them.
    memory: dict[str, Any] = field(default_factory=dict)
    tails: dict[str, TailCheck] = field(default_factory=dict)  # measured tails' make-up (analysis.tails)

    @property
    def ratio(self) -> float | None:
        """value / limit of the limiting budget."""
        return self.ratios.get(self.limiting) if self.limiting else None


FITS, NO_FIT, UNCERTAIN = "fits", "does not fit", "uncertain"
INTERVAL_COVERAGE = 0.8  # a prediction interval holds the true value 4 times in 5 (10% on each side)


@dataclass(frozen=True)
class CvPoint:
    """One held-out measured pair: what the calibration predicted without it."""

    device: str
    runtime: str | None
    model: str
    holdout: str  # pair | model
    quantity: str  # latency_p50_ms | latency_p99_ms | memory_mb
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class CvSummary:
    device: str
    runtime: str | None
    holdout: str
    quantity: str
    pairs: int
    within: float
    median_abs_err: float
    models: int = 0  # distinct models held out

    @property
    def judged(self) -> bool:
        """Whether enough models were held out to judge the share (MIN_JUDGED_MODELS)."""
        return self.models >= MIN_JUDGED_MODELS


KERNEL_PREDICTOR = "kernel"  # `predictor` param of the per-kernel predictor's cross-validation records


@dataclass(frozen=True)
class KernelCvPoint:
    """One profiled model at one set of input shapes, predicted from its graph by the per-kernel
    calibration of its target without it (kernel_predict.cross_validate); measured: its plain p50."""

    device: str
    runtime: str | None
    model: str
    shapes: str  # canonical JSON of the input shapes
    threads: int | None
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class KernelCvSummary:
    """The per-kernel predictor's held-out errors on a target (or fleet-wide, device `*`), and the
    interval on measured / predicted they give a new model's p50 (per target; None with too few)."""

    device: str
    runtime: str | None
    pairs: int
    within: float
    median_abs_err: float
    interval: tuple[float, float] | None
    coverage: float
    threads: int | None = None
    models: int = 0  # distinct models held out

    @property
    def judged(self) -> bool:
        """Whether enough models were held out to judge the share (MIN_JUDGED_KERNEL_MODELS)."""
        return self.models >= MIN_JUDGED_KERNEL_MODELS


@dataclass
class FitResult:
    """Everything `fit` found: verdicts, cross-validation, per-target calibrations, notes for the user."""

    budgets: tuple[Budget, ...]
    verdicts: list[Verdict] = field(default_factory=list)
    cv: list[CvPoint] = field(default_factory=list)
    calibrations: dict[tuple[str, str | None], dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    kernel_cv: list[KernelCvPoint] = field(default_factory=list)
    kernel_coverage: float = 0.8
    variants: list[VariantRow] = field(default_factory=list)  # each variant against its fp32 reference

    def kernel_cv_summaries(self) -> list[KernelCvSummary]:
        """The per-kernel predictor's held-out errors per target and fleet-wide (device `*`, no interval:
        an interval belongs to one target's calibration)."""
        from .kernel_predict import conformal_bounds

        groups: dict[tuple[str, str | None], list[KernelCvPoint]] = defaultdict(list)
        for p in self.kernel_cv:
            groups[(p.device, p.runtime)].append(p)
        if groups:
            groups[(AGGREGATE_DEVICE, None)] = list(self.kernel_cv)
        out = []
        for (device, runtime), pts in sorted(
            groups.items(), key=lambda kv: (kv[0][0] != AGGREGATE_DEVICE, kv[0][0], kv[0][1] or "")
        ):
            errs = np.abs([p.error for p in pts])
            per_target = device != AGGREGATE_DEVICE
            bounds = (
                conformal_bounds([p.measured / p.predicted for p in pts], self.kernel_coverage)
                if per_target
                else None
            )
            threads = {p.threads for p in pts}
            out.append(
                KernelCvSummary(
                    device,
                    runtime,
                    len(pts),
                    float(np.mean(errs <= WITHIN + 1e-12)),
                    float(np.median(errs)),
                    bounds,
                    self.kernel_coverage,
                    threads.pop() if per_target and len(threads) == 1 else None,
                    len({(p.device, p.model) for p in pts}),
                )
            )
        return out

    def cv_summaries(self) -> list[CvSummary]:
        """Per target and fleet-wide (device `*`): share within +-10% and the median absolute error."""
        groups: dict[tuple, list[CvPoint]] = defaultdict(list)
        for p in self.cv:
            groups[(p.device, p.runtime, p.holdout, p.quantity)].append(p)
            groups[(AGGREGATE_DEVICE, None, p.holdout, p.quantity)].append(p)
        out = []
        for (device, runtime, holdout, quantity), pts in sorted(
            groups.items(),
            key=lambda kv: (kv[0][0] != AGGREGATE_DEVICE, kv[0][0], kv[0][1] or "", kv[0][2], kv[0][3]),
        ):
            errs = np.abs([p.error for p in pts])
            out.append(
                CvSummary(
                    device,
                    runtime,
                    holdout,
                    quantity,
                    len(pts),
                    float(np.mean(errs <= WITHIN + 1e-12)),
                    float(np.median(errs)),
                    len({(p.device, p.model) for p in pts}),
                )
            )
        return out

    def records(self, run_id: str) -> list[Record]:
        """The result as records (probe `fit`), the schema every other part reads: identity in params
        (the budget, stat, holdout, quantity a figure is of), what is known about it in annotations."""
        ts = utc_now()
        out: list[Record] = []

        def rec(
            device: str,
            runtime: str | None,
            model: str | None,
            metric: str,
            value: float | None,
            unit: str,
            params: dict[str, Any] | None = None,
            /,
            **annotations: Any,
        ) -> None:
            out.append(
                Record(
                    run_id,
                    device,
                    PROBE,
                    model,
                    runtime,
                    metric,
                    None if value is None else float(value),
                    unit,
                    params or {},
                    ts,
                    annotations,
                )
            )

        limits = {b.key: b.limit for b in self.budgets}
        for v in self.verdicts:
            common: dict[str, Any] = {"basis": v.basis}
            if v.config:
                common["config"] = v.config
            if v.counts is not None:
                common["flops"] = v.counts.flops
                common["weight_bytes"] = v.counts.weight_bytes
            rec(
                v.device,
                v.runtime,
                v.model,
                "fits",
                None if v.fits is None else float(v.fits),
                "bool",
                None,
                **common,
                verdict=v.verdict,
                why=v.why,
                budgets=limits,
                limiting=v.limiting,
                ratio=v.ratio,
                ratios=v.ratios,
                intervals={k: list(iv) for k, iv in v.intervals.items()},
                values=v.values,
                unchecked=list(v.unchecked),
                evidence=v.evidence or None,
                estimated=list(v.estimated),
                memory=v.memory or None,
                tails={k: t.to_dict() for k, t in v.tails.items() if t.disturbed} or None,
            )
            for key, ratio in v.ratios.items():
                iv = v.intervals.get(key)
                rec(
                    v.device,
                    v.runtime,
                    v.model,
                    "budget_ratio",
                    ratio,
                    "ratio",
                    {"budget": key},
                    basis=v.basis,
                    limit=limits[key],
                    value=v.values[key],
                    interval=list(iv) if iv else None,
                )
            for key, value in v.predicted.items():
                metric, _, stat = key.partition(":")
                rec(
                    v.device,
                    v.runtime,
                    v.model,
                    metric,
                    value,
                    _unit_of(metric),
                    {"stat": stat} if stat else None,
                    basis="predicted",
                    evidence=v.evidence or None,
                )
        for (device, runtime), desc in sorted(
            self.calibrations.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
        ):
            rec(device, runtime, None, "calibration_models", desc.get("models"), "count", None, **desc)
        for p in self.cv:
            rec(
                p.device,
                p.runtime,
                p.model,
                "cv_error",
                p.error,
                "ratio",
                {"holdout": p.holdout, "quantity": p.quantity},
                measured=p.measured,
                predicted=p.predicted,
            )
        for s in self.cv_summaries():
            ident = {"holdout": s.holdout, "quantity": s.quantity}
            _summary_records(
                rec,
                s.device,
                s.runtime,
                s.within,
                s.median_abs_err,
                ident,
                pairs=s.pairs,
                **judgement(s.models, MIN_JUDGED_MODELS, whole_model_next_step(s.device)),
            )
        self._kernel_cv_records(rec)
        for row in self.variants:
            rec(
                row.device,
                row.runtime,
                row.variant,
                "variant_speedup",
                row.speedup,
                "ratio",
                {"reference": row.reference},
                **{k: x for k, x in row.to_dict().items() if k not in ("device", "runtime", "variant")},
            )
        return out

    def _kernel_cv_records(self, rec: Any) -> None:
        """The per-kernel predictor's cross-validation, each record made by records()' `rec`."""
        import json

        ident = {"holdout": "model", "quantity": "latency_p50_ms", "predictor": KERNEL_PREDICTOR}
        for p in self.kernel_cv:
            shapes = json.loads(p.shapes) if p.shapes else {}
            rec(
                p.device,
                p.runtime,
                p.model,
                "cv_error",
                p.error,
                "ratio",
                {**ident, "shapes": shapes},
                measured=p.measured,
                predicted=p.predicted,
                threads=p.threads,
            )
        for s in self.kernel_cv_summaries():
            _summary_records(
                rec,
                s.device,
                s.runtime,
                s.within,
                s.median_abs_err,
                ident,
                pairs=s.pairs,
                interval=list(s.interval) if s.interval else None,
                coverage=s.coverage,
                threads=s.threads,
                **judgement(s.models, MIN_JUDGED_KERNEL_MODELS, kernel_next_step(s.device, s.threads)),
            )


def _summary_records(
    rec: Any,
    device: str,
    runtime: str | None,
    within: float,
    median_abs_err: float,
    ident: Mapping[str, Any],
    **annotations: Any,
) -> None:
    """A cross-validation summary's two records (share within +-10%, median error) through `rec`."""
    for metric, value in (("cv_within_10pct", within), ("cv_median_abs_err", median_abs_err)):
        rec(device, runtime, None, metric, value, "ratio", dict(ident), **annotations)


def judgement(models: int, needed: int, next_step: str) -> dict[str, Any]:
    """A share's annotations: how many models were held out, whether that is enough to judge it, and
    where it is not, the step that gives enough (renderers say "too few models to judge" then)."""
    out: dict[str, Any] = {"models": models, "judged": models >= needed, "models_needed": needed}
    if models < needed:
        out["next_step"] = next_step
    return out


def whole_model_next_step(device: str) -> str:
    """What gives the whole-model predictor enough models on `device` (every device: DEVICE)."""
    where = "DEVICE" if device == AGGREGATE_DEVICE else device
    return f"bench more models there (`edgebench bench MODEL.onnx --device {where}`, one per model)"


def kernel_next_step(device: str, threads: int | None) -> str:
    """What gives the per-kernel predictor enough profiled models on `device`."""
    where = "DEVICE" if device == AGGREGATE_DEVICE else device
    at = f" --threads {threads}" if threads else ""
    return (
        f"profile more models there (`edgebench profile MODEL.onnx --device {where}{at}`, one per model, "
        "beside `edgebench run suites/calibrate.toml`)"
    )


def _unit_of(metric: str) -> str:
    return {"predicted_latency_ms": "ms", "predicted_memory_mb": "MB", "predicted_energy_mj": "mJ"}.get(
        metric, ""
    )


@dataclass
class _Target:
    device: str
    runtime: str | None
    ceil: MachineModel
    obs: dict[str, Observation]
    features: dict[str, dict[str, float]] = field(default_factory=dict)
    z: dict[str, np.ndarray] = field(default_factory=dict)
    measured: MachineModel | None = None  # the store's ceilings (None: fitted from the models)


def _effective_ceilings(
    measured: MachineModel | None, obs: Mapping[str, Observation], counts: Mapping[str, ModelCounts]
) -> MachineModel:
    """The measured ceilings, or where the store has none the best rates the target's own models reached."""
    measured = measured or MachineModel(source="none")
    peak, bw = measured.peak_flops, measured.bandwidth
    rates = [
        (counts[m].flops / (base_latency(o) / 1e3), counts[m].weight_bytes / (base_latency(o) / 1e3))
        for m, o in obs.items()
        if m in counts and base_latency(o) > 0
    ]
    source = measured.source if peak and bw else "fitted from the measured models"
    if not peak:
        peak = max((r[0] for r in rates), default=0.0) or None
    if not bw:
        bw = max((r[1] for r in rates), default=0.0) or None
    return MachineModel(peak, bw, measured.llc_bytes, source)


def assess(
    records: Sequence[Record],
    budgets: Sequence[Budget] = (),
    counts: Mapping[str, ModelCounts] | None = None,
    samples: Sequence[Samples] = (),
    device_info: Sequence[Mapping[str, Any]] = (),
    devices: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    run_order: Sequence[str] = (),
    asked: Sequence[str] | None = None,
) -> FitResult:
    """Verdicts for every target x model (measured, or predicted from counts), with cross-validation.

    `counts` are static counts per model name (from `count_model`, or `counts_from_records`); `models` adds
    model names to those measured in `records`; `devices` limits the targets; `asked` (the rows the user
    asked about) limits the warnings that concern models to those rows. Pure: records in, result out.
    """

    def concern(names: Sequence[str]) -> list[str]:
        """The models a warning may name: those asked about (all, when nothing was asked)."""
        return [m for m in names if not asked or m in asked]

    counts = dict(counts or {})
    for name, c in counts_from_records(records).items():
        counts.setdefault(name, c)
    result = FitResult(budgets=tuple(budgets))
    obs_all = observations(records, samples, run_order, counts)
    decoded = decode_by_pair(records, {rid: i for i, rid in enumerate(run_order)})
    kernel = _kernel_predictor(records, counts, device_info)
    profiled = sorted(kernel.runs) if kernel is not None else []
    if devices:
        known = {o.device for o in obs_all} | {ident[0] for ident in decoded} | {d for d, _ in profiled}
        for d in devices:
            if d not in known:
                model = next(iter(asked or ()), "MODEL")
                raise UserError(
                    f"device '{d}' has no bench measurements in the store (known: "
                    f"{', '.join(sorted(known)) or 'none'}): run `edgebench bench {model} --device {d}` first"
                )
        obs_all = [o for o in obs_all if o.device in devices]
    measured_ceilings = device_ceilings(records, device_info, run_order)
    targets: dict[tuple, _Target] = {}
    for o in obs_all:
        t = targets.setdefault(o.target, _Target(o.device, o.runtime, MachineModel(), {}))
        t.obs[o.model] = o
    for device, runtime in profiled:  # a device profiled but never benched: predicted from its kernels
        if not devices or device in devices:
            targets.setdefault((device, runtime), _Target(device, runtime, MachineModel(), {}))
    for t in targets.values():
        t.measured = measured_ceilings.get(t.device)
        t.ceil = _effective_ceilings(t.measured, t.obs, counts)
        for name, c in counts.items():
            t.features[name] = floor_times(c, t.ceil)
            t.z[name] = _descriptor(c, t.features[name])
    # Models: those measured, those named by the caller, and those the counts describe (roofline records).
    all_models = sorted({o.model for o in obs_all} | set(models or []) | set(counts))
    missing = sorted(m for m in all_models if m not in counts)
    unmeasured_missing = concern([m for m in missing if not any(m in t.obs for t in targets.values())])
    if unmeasured_missing:
        result.warnings.append(
            f"no FLOP/byte counts for {', '.join(unmeasured_missing)}: cannot predict "
            "them (pass the ONNX file with --model, or run `edgebench roofline` on it)"
        )
    calibrated = [m for m in all_models if m in counts]
    uncounted_measured = concern(sorted({o.model for o in obs_all} - set(counts)))
    if uncounted_measured:
        result.warnings.append(
            f"measured models without counts are not used to calibrate predictions: "
            f"{', '.join(uncounted_measured)} (pass them with --model PATH)"
        )

    engine = _Engine(targets, counts)
    for key, t in sorted(targets.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        cal = engine.calibration(key, exclude=None)
        if cal is not None:
            desc = cal.describe()
            desc["ceilings"] = {
                "peak_gflops": (t.ceil.peak_flops or 0) / 1e9,
                "bandwidth_gbps": (t.ceil.bandwidth or 0) / 1e9,
                "source": t.ceil.source,
            }
            if t.ceil.llc_bytes:
                desc["ceilings"]["llc_mb"] = t.ceil.llc_bytes / 1e6
            result.calibrations[key] = desc
        for model in all_models:
            if model in t.obs:
                result.verdicts.append(_measured_verdict(t, t.obs[model], budgets, counts.get(model), engine))
            elif model in calibrated:
                v = _predicted_verdict(key, t, model, budgets, counts[model], engine, kernel)
                if v is not None:
                    result.verdicts.append(v)
                elif concern([model]):
                    result.warnings.append(
                        f"{t.device}: no measured model with counts to calibrate a prediction for {model}; "
                        "bench a counted model there first "
                        f"(`edgebench bench MODEL.onnx --device {t.device}`)"
                    )
    benched = {(o.device, o.runtime, o.model) for o in obs_all}
    for ident, speed in sorted(decoded.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])):
        if ident not in benched and (not devices or ident[0] in devices):
            result.verdicts.append(_decode_verdict(ident, speed, budgets))
    result.cv = engine.cross_validate()
    if kernel is not None:
        result.kernel_cv = _kernel_cv(kernel, devices)
        result.kernel_coverage = kernel.coverage
        result.warnings += unsteady_speed_warnings(kernel.speed_spans(), devices)
    measured_on = defaultdict(set)
    for t in targets.values():
        for m in t.obs:
            measured_on[m].add((t.device, t.runtime))
    result.verdicts = [
        decide(v, budgets, result.cv, bool(measured_on[v.model] - {(v.device, v.runtime)}))
        for v in result.verdicts
    ]
    verdict_of = {(v.device, v.model): v.verdict for v in result.verdicts if v.basis == "measured"}
    result.variants = variant_rows(records, samples, obs_all, verdict_of)
    for key, t in targets.items():
        n = sum(1 for m in t.obs if m in counts)
        if 0 < n < 3 and any(
            v.basis == "predicted" and (v.device, v.runtime) == key and concern([v.model])
            for v in result.verdicts
        ):
            result.warnings.append(
                f"{t.device}: predictions rest on only {n} measured model(s); bench a few "
                "more models of different sizes on it to trust them"
            )
    return result


class _Engine:
    """Calibrations, predictions and cross-validation over all targets, memoised per held-out model."""

    def __init__(self, targets: Mapping[tuple, _Target], counts: Mapping[str, ModelCounts]) -> None:
        self.targets = targets
        self.counts = counts
        self._cal: dict[tuple, LatencyModel | None] = {}
        self._transfer_ok: dict[tuple, bool] = {}
        self._held: dict[tuple, tuple[dict[str, dict[str, float]], dict[str, np.ndarray]]] = {}

    def features(
        self, key: tuple, exclude: str | None
    ) -> tuple[dict[str, dict[str, float]], dict[str, np.ndarray]]:
        """Floor times and descriptors of every model on the target. Where its ceilings are fitted from its
        measured models, a held-out model is left out of them too: it must not leak into its prediction."""
        t = self.targets[key]
        fitted = t.ceil.source == "fitted from the measured models"
        if exclude is None or not fitted or exclude not in t.obs:
            return t.features, t.z
        memo = (key, exclude)
        if memo not in self._held:
            obs = {m: o for m, o in t.obs.items() if m != exclude}
            ceil = _effective_ceilings(t.measured, obs, self.counts)
            feats = {name: floor_times(c, ceil) for name, c in self.counts.items()}
            self._held[memo] = feats, {name: _descriptor(c, feats[name]) for name, c in self.counts.items()}
        return self._held[memo]

    def points(self, key: tuple, exclude: str | None) -> list[_Point]:
        t = self.targets[key]
        feats, z = self.features(key, exclude)
        return [
            _Point(m, base_latency(o), feats[m], z[m])
            for m, o in sorted(t.obs.items())
            if m in self.counts and m != exclude and base_latency(o) > 0
        ]

    def calibration(self, key: tuple, exclude: str | None) -> LatencyModel | None:
        memo = (key, exclude)
        if memo not in self._cal:
            has_nodes = all(self.counts[p.model].nodes for p in self.points(key, exclude)) and bool(
                self.points(key, exclude)
            )
            self._cal[memo] = calibrate(
                self.points(key, exclude), has_nodes, self.targets[key].ceil.llc_bytes is not None
            )
        return self._cal[memo]

    def static(self, key: tuple, model: str, exclude: str | None) -> float | None:
        cal = self.calibration(key, exclude)
        if cal is None or model not in self.targets[key].features:
            return None
        feats, z = self.features(key, exclude)
        return cal.predict(feats[model], z[model])

    def residual_elsewhere(self, key: tuple, model: str) -> float | None:
        """How much the model beat or missed the calibrations of the other targets that measured it."""
        logs = []
        for other, t in self.targets.items():
            if other == key or model not in t.obs:
                continue
            pred = self.static(other, model, exclude=model)
            if pred and pred > 0:
                logs.append(math.log(base_latency(t.obs[model]) / pred))
        return float(np.median(logs)) if logs else None

    def transfer_helps(self, key: tuple, exclude: str | None) -> bool:
        """Whether carrying residuals over from other targets lowers the cross-validated error on this target.

        Uses the calibration's own cross-validated errors of its models, so no extra fits are needed.
        """
        memo = (key, exclude)
        if memo in self._transfer_ok:
            return self._transfer_ok[memo]
        cal = self.calibration(key, exclude)
        plain, moved = [], []
        if cal is not None:
            for p, err in zip(cal.points, cal.cv_logs, strict=True):
                r = self.residual_elsewhere(key, p.model)
                if r is not None:
                    plain.append(err)
                    moved.append(err + r)
        ok = len(plain) >= 2 and _capped(moved) < _capped(plain)
        self._transfer_ok[memo] = ok
        return ok

    def predict(
        self, key: tuple, model: str, exclude: str | None, allow_transfer: bool = True
    ) -> tuple[float | None, str]:
        base = self.static(key, model, exclude)
        if base is None or base <= 0:
            return None, ""
        if allow_transfer:
            r = self.residual_elsewhere(key, model)
            if r is not None and self.transfer_helps(key, exclude):
                return base * math.exp(r), "roofline calibration + the model's measurements on other devices"
        return base, "roofline calibration"

    def stat_ratio(self, key: tuple, exclude: str | None, stat: str, at: float) -> float | None:
        """The target's ratio of a latency statistic to the base, for a model whose base latency is `at`.

        A smooth function of the base latency, not one number: on a busy device a 20 ms inference is
        pre-empted far more often than a 0.2 ms one, so its p50 and p99 sit further above its minimum.
        Kernel-weighted mean of log ratios over the target's measured models, by distance in decades of
        latency, shrunk towards the median of all of them.
        """
        t = self.targets[key]
        pts = [
            (math.log10(base_latency(o)), math.log(o.latency[stat] / base_latency(o)))
            for m, o in t.obs.items()
            if m != exclude and stat in o.latency and base_latency(o) > 0 and o.latency[stat] > 0
        ]
        if not pts:
            return None
        overall = float(np.median([r for _, r in pts]))
        x = math.log10(max(at, 1e-9))
        num, den = overall * RATIO_PRIOR, RATIO_PRIOR
        for xi, ri in pts:
            w = math.exp(-((xi - x) ** 2) / (2 * RATIO_WIDTH**2))
            num += w * ri
            den += w
        return math.exp(num / den)

    def predict_stat(
        self, key: tuple, model: str, exclude: str | None, stat: str, allow_transfer: bool = True
    ) -> tuple[float | None, str]:
        """A latency statistic: the predicted base times the target's ratio of that statistic to it."""
        base, evidence = self.predict(key, model, exclude, allow_transfer)
        if base is None:
            return None, evidence
        ratio = self.stat_ratio(key, exclude, stat, base)
        if ratio is None:
            return None, evidence
        return base * ratio, evidence

    def memory(self, key: tuple, model: str, exclude: str | None) -> float | None:
        """Peak memory = fitted overhead + fitted multiple of the weight bytes (NNLS over measured models)."""
        from scipy.optimize import nnls

        t = self.targets[key]
        pts = [
            (self.counts[m].weight_bytes / 1e6, o.memory_mb)
            for m, o in t.obs.items()
            if m != exclude and m in self.counts and o.memory_mb
        ]
        if model not in self.counts or not pts:
            return None
        w_mb = self.counts[model].weight_bytes / 1e6
        if len({round(w, 3) for w, _ in pts}) < 2:
            # One size measured: assume the weights are held once on top of that model's overhead.
            overhead = float(np.median([m - w for w, m in pts]))
            return max(overhead, 0.0) + w_mb
        X = np.array([[1.0, w] for w, _ in pts])
        y = np.array([m for _, m in pts])
        coef, _ = nnls(X / y[:, None], np.ones(len(y)))
        return float(coef[0] + coef[1] * w_mb)

    def energy_rate(self, key: tuple, exclude: str | None) -> float | None:
        """mJ per ms of inference on this target (net power), from its power measurements."""
        t = self.targets[key]
        rates = [
            o.energy_mj / o.latency["p50"]
            for m, o in t.obs.items()
            if m != exclude and o.energy_mj is not None and o.latency.get("p50", 0) > 0
        ]
        return float(np.median(rates)) if rates else None

    def cross_validate(self) -> list[CvPoint]:
        out = []
        for key, t in sorted(self.targets.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            for model, o in sorted(t.obs.items()):
                if model not in self.counts:
                    continue
                for holdout, transfer in (("pair", True), ("model", False)):
                    for stat in ("min", "p50", "p99"):
                        pred, _ = self.predict_stat(key, model, model, stat, allow_transfer=transfer)
                        if pred is not None and stat in o.latency:
                            out.append(
                                CvPoint(
                                    t.device,
                                    t.runtime,
                                    model,
                                    holdout,
                                    f"latency_{stat}_ms",
                                    o.latency[stat],
                                    pred,
                                )
                            )
                mem = self.memory(key, model, exclude=model)
                if mem is not None and o.memory_mb:
                    out.append(CvPoint(t.device, t.runtime, model, "model", "memory_mb", o.memory_mb, mem))
        return out


def _cv_quantity(budget: Budget) -> str | None:
    """The cross-validated quantity whose errors bound a prediction of this budget's value."""
    if budget.quantity == "memory":
        return "memory_mb"
    if budget.quantity == "energy":
        return "latency_p50_ms"  # energy is the device's net energy rate times the predicted p50
    if budget.quantity == "latency":
        stat = budget.stat or "p50"
        if stat in ("min", "p50", "p99"):
            return f"latency_{stat}_ms"
        return "latency_p99_ms" if stat in ("p90", "max") else "latency_p50_ms"
    return None  # load time is not predicted


def prediction_interval(
    cv: Sequence[CvPoint],
    device: str,
    runtime: str | None,
    quantity: str,
    holdouts: Sequence[str],
    coverage: float = INTERVAL_COVERAGE,
) -> tuple[float, float, int] | tuple[None, None, int]:
    """Bounds on measured / predicted for a new prediction on a target, from its held-out pairs.

    The ratios of the target's cross-validated pairs are exchangeable with the new one's, so their order
    statistics bound it (split conformal): the upper bound is the ceil((n + 1)(1 - t))-th smallest ratio,
    t = (1 - coverage) / 2, which needs n >= 1 / t - 1 pairs (9 for an 80% interval); with fewer, None.
    Returns (low ratio, high ratio, pairs used) from the first holdout kind that has points.
    """
    tail = (1 - coverage) / 2
    n = 0
    for holdout in holdouts:
        ratios = sorted(
            p.measured / p.predicted
            for p in cv
            if (p.device, p.runtime, p.quantity, p.holdout) == (device, runtime, quantity, holdout)
            and p.predicted > 0
            and p.measured > 0
        )
        n = len(ratios)
        if not n:
            continue
        k = math.ceil((n + 1) * (1 - tail))
        if k > n:
            return None, None, n
        return ratios[n - k], ratios[k - 1], n
    return None, None, n


def min_pairs_for_interval(coverage: float = INTERVAL_COVERAGE) -> int:
    tail = (1 - coverage) / 2
    return math.ceil(1 / tail - 1 - 1e-9)


def decide(
    v: Verdict, budgets: Sequence[Budget], cv: Sequence[CvPoint], benched_elsewhere: bool = False
) -> Verdict:
    """The answer for one target x model: "fits" only when every budget was checked and is met (for a
    prediction: its whole interval under the limit), "does not fit" when one is exceeded (for a
    prediction: its whole interval over the limit), "uncertain" otherwise. An interval the predictor
    gives (`v.intervals`) is used as is; otherwise it comes from the cross-validation of the target."""
    ratios = {b.key: v.values[b.key] / b.limit for b in budgets if v.values.get(b.key) is not None}
    if not budgets:
        return replace(v, verdict="", ratios=ratios, why="no budgets given")
    intervals = dict(v.intervals)
    states: dict[str, str] = {}
    reasons: list[str] = []
    notes: list[str] = []  # said with any verdict
    for b in budgets:
        value = v.values.get(b.key)
        if value is None:
            states[b.key] = UNCERTAIN
            reasons.append(f"{b.key} not checked (nothing measured or predicted it)")
            continue
        if v.basis == "measured":
            states[b.key] = FITS if b.margin(value) >= 0 else NO_FIT
            tail = v.tails.get(b.stat or "") if b.quantity == "latency" else None
            if tail is not None and tail.disturbed:
                clean = FITS if b.margin(tail.clean_value) >= 0 else NO_FIT
                if clean != states[b.key]:
                    states[b.key] = UNCERTAIN
                    reasons.append(f"{b.key} uncertain (tail disturbed): {tail.evidence()}")
                else:
                    notes.append(f"{b.key}: the {b.stat} tail is disturbed, the same either way")
            continue
        if b.key not in intervals:
            quantity = _cv_quantity(b)
            holdouts = ("pair", "model") if benched_elsewhere and quantity != "memory_mb" else ("model",)
            lo, hi, n = (
                prediction_interval(cv, v.device, v.runtime, quantity, holdouts)
                if quantity
                else (None, None, 0)
            )
            if lo is None or hi is None:
                states[b.key] = UNCERTAIN
                reasons.append(
                    f"{b.key}: no prediction interval ({n} cross-validated model(s) on {v.device}; an "
                    f"{INTERVAL_COVERAGE:.0%} interval needs {min_pairs_for_interval()})"
                )
                continue
            intervals[b.key] = (value * lo, value * hi)
        lo_v, hi_v = intervals[b.key]
        worst, best = (lo_v, hi_v) if b.at_least else (hi_v, lo_v)  # a rate's worst case is its low end
        states[b.key] = FITS if b.margin(worst) >= 0 else NO_FIT if b.margin(best) < 0 else UNCERTAIN
        if states[b.key] == UNCERTAIN:
            reasons.append(
                f"{b.key}: the {INTERVAL_COVERAGE:.0%} prediction interval {lo_v:.4g}-{hi_v:.4g} "
                f"spans the limit {b.limit:g}"
            )
    found = set(states.values())
    verdict = NO_FIT if NO_FIT in found else UNCERTAIN if UNCERTAIN in found else FITS
    if verdict == NO_FIT:
        missed = [b for b in budgets if states.get(b.key) == NO_FIT]
        why = "; ".join(
            f"{'under' if b.at_least else 'over'} {b.key} ({_times(ratios[b.key])} the budget)"
            for b in missed
        )
    elif verdict == FITS:
        why = "every budget met" + (" by the whole prediction interval" if v.basis == "predicted" else "")
    else:
        why = "; ".join(reasons)
    why = "; ".join([why, *notes])
    fits = {FITS: True, NO_FIT: False}.get(verdict)
    return replace(v, verdict=verdict, fits=fits, ratios=ratios, intervals=intervals, why=why)


def _times(ratio: float) -> str:
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:.0f}x"


def verdict_exit_code(verdicts: Sequence[Verdict], strict: bool = False) -> int:
    """`fit` as a release gate: 1 when a pair does not fit (or, with strict, is uncertain), else 0."""
    found = {v.verdict for v in verdicts}
    return 1 if NO_FIT in found or (strict and UNCERTAIN in found) else 0


def _judged(
    ident: tuple[str, str | None, str],
    basis: str,
    values: dict[str, float | None],
    budgets: Sequence[Budget],
    **extra: Any,
) -> Verdict:
    """The Verdict of (device, runtime, model) on `basis`, its values judged against the budgets."""
    fits, limiting, margin, margins, unchecked = _judge(values, budgets)
    device, runtime, model = ident
    kept = {k: v for k, v in values.items() if v is not None}
    return Verdict(device, runtime, model, basis, kept, fits, limiting, margin, margins, unchecked, **extra)


def _judge(
    values: Mapping[str, float | None], budgets: Sequence[Budget]
) -> tuple[bool | None, str | None, float | None, dict[str, float], tuple[str, ...]]:
    margins = {b.key: b.margin(v) for b in budgets if (v := values.get(b.key)) is not None}
    unchecked = tuple(b.key for b in budgets if values.get(b.key) is None)
    if not budgets:
        return None, None, None, margins, unchecked
    if not margins:
        return None, None, None, margins, unchecked
    limiting = min(margins, key=lambda k: margins[k])
    fits = all(m >= 0 for m in margins.values())
    return fits, limiting, margins[limiting], margins, unchecked


def _measured_verdict(
    t: _Target, o: Observation, budgets: Sequence[Budget], counts: ModelCounts | None, engine: _Engine
) -> Verdict:
    values: dict[str, float | None] = {}
    estimated = list(o.estimated)
    for b in budgets:
        if b.quantity == "latency":
            values[b.key] = o.latency.get(b.stat or "p50")
        elif b.quantity == "memory":
            values[b.key] = o.memory_mb
        elif b.quantity == "process_memory":
            values[b.key] = o.process_memory_mb
        elif b.quantity == "load":
            values[b.key] = o.load_ms
        elif b.quantity == "cold_load":
            values[b.key] = o.cold_load_ms
        elif b.quantity == "rtf":
            values[b.key] = o.rtf.get(b.stat or "p99")
        elif b.quantity == "decode":
            values[b.key] = o.decode_tokens_per_s
        elif b.quantity == "energy":
            values[b.key] = o.energy_mj
            if o.energy_mj is None:
                rate = engine.energy_rate(o.target, None)
                if rate is not None:
                    values[b.key] = rate * o.latency["p50"]
                    estimated.append(b.key)
    return _judged(
        (o.device, o.runtime, o.model),
        "measured",
        values,
        budgets,
        config=o.config,
        estimated=tuple(estimated),
        counts=counts,
        memory=memory_context(o),
        tails=o.tails,
    )


def memory_context(o: Observation) -> dict[str, Any]:
    """The memory a verdict shows: the model's range over invocations, the baseline beside it, the process
    peak, and what measured them (only the figures the store holds)."""
    ctx = {
        "model_mb": list(o.memory_range) if o.memory_range else None,
        "baseline_mb": o.baseline_mb,
        "process_peak_mb": o.process_memory_mb,
        "measured_by": o.memory_source,
    }
    return {k: v for k, v in ctx.items() if v is not None}


def _kernel_predictor(
    records: Sequence[Record],
    counts: Mapping[str, ModelCounts],
    device_info: Sequence[Mapping[str, Any]] = (),
) -> Any:
    """The per-op-kind predictor (edgebench.analysis.kernel_predict) where the store holds per-op profiles
    (each device's fingerprint in `device_info` sets the NCHWc layout its graphs are predicted in)."""
    if not any(r.probe == "profile" and r.metric == "op_time_ms" for r in records):
        return None
    from .kernel_predict import TargetPredictor

    return TargetPredictor(records, _graph_sources(records, counts), INTERVAL_COVERAGE, device_info)


def _graph_sources(records: Sequence[Record], counts: Mapping[str, ModelCounts]) -> dict[str, str]:
    """The ONNX file of every model: those counted here, and the profiled ones at the path their profile
    recorded (still there), so the cross-validation can predict each from its graph."""
    recorded = {
        r.model: str(r.annotations["model_path"])
        for r in records
        if r.probe == "profile" and r.model and r.annotations.get("model_path")
    }
    sources = {model: path for model, path in recorded.items() if Path(path).is_file()}
    # totals read back from the store (`counts_from_records`) name no file: the profile's path stays
    counted = {n: c.source for n, c in counts.items() if c.source and Path(c.source).is_file()}
    return {**sources, **counted}


def _kernel_cv(kernel: Any, devices: Sequence[str] | None) -> list[KernelCvPoint]:
    """Every profiled target's leave-one-model-out predictions (kernel_predict.TargetPredictor.held_out)."""
    out = []
    for target in sorted(kernel.runs, key=lambda t: (t[0], t[1] or "")):
        if devices and target[0] not in devices:
            continue
        for h in kernel.held_out(target):
            r = h.run
            out.append(
                KernelCvPoint(r.device, r.runtime, r.model, r.shapes, r.threads, r.latency_ms, h.predicted_ms)
            )
    return out


def unsteady_speed_warnings(
    spans: Mapping[tuple[str, str | None], tuple[float, float]], devices: Sequence[str] | None = None
) -> list[str]:
    """A warning per target whose speed, as its profiles' speed references saw it, moved across more than
    the +-10% asked of a held-out prediction: its share within +-10% measures the device as much as the
    predictor (the intervals, from the same residuals, cover it)."""
    out = []
    for (device, runtime), (low, high) in sorted(spans.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if (devices and device not in devices) or high / low <= (1 + WITHIN) / (1 - WITHIN):
            continue
        out.append(
            f"{device}/{runtime or 'default'}: the device's speed moved while it was profiled (speed "
            f"references at x{low:.2f}-x{high:.2f} of their median over the middle 80% of the profiles), "
            f"more than the +-{WITHIN:.0%} a prediction is judged by: kernel predictions' held-out shares "
            "measure the device as much as the predictor; profile on a quieter device for a sharper "
            "calibration"
        )
    return out


def _predicted_verdict(
    key: tuple,
    t: _Target,
    model: str,
    budgets: Sequence[Budget],
    counts: ModelCounts,
    engine: _Engine,
    kernel: Any = None,
) -> Verdict | None:
    """A prediction: from the per-op-kind calibration where the target has one with an interval (its p50
    and the budgets on p50 latency), else from the whole-model roofline calibration."""
    by_kernels = kernel.predict(t.device, t.runtime, model, counts.shapes) if kernel is not None else None
    if by_kernels is not None and by_kernels.low_ms is not None and by_kernels.high_ms is not None:
        return _kernel_verdict(t, model, budgets, counts, by_kernels)
    p50, evidence = engine.predict_stat(key, model, None, "p50")
    if p50 is None:
        return None
    predicted = {"predicted_latency_ms:p50": p50}
    best, _ = engine.predict(key, model, None)
    if best is not None:
        predicted["predicted_latency_ms:min"] = best  # the calibrated base: the fastest inference
    values: dict[str, float | None] = {}
    for b in budgets:
        if b.quantity == "latency":
            stat = b.stat or "p50"
            value, _ = engine.predict_stat(key, model, None, stat)
            values[b.key] = value
            if value is not None and stat != "p50":
                predicted[f"predicted_latency_ms:{stat}"] = value
        elif b.quantity == "memory":
            values[b.key] = engine.memory(key, model, None)
        elif b.quantity == "energy":
            rate = engine.energy_rate(key, None)
            values[b.key] = None if rate is None else rate * p50
        elif b.quantity in ("load", "cold_load", "rtf"):
            values[b.key] = None  # not predicted: load depends on the storage, RTF on a streaming bench
    mem = engine.memory(key, model, None)
    if mem is not None:
        predicted["predicted_memory_mb"] = mem
    rate = engine.energy_rate(key, None)
    if rate is not None:
        predicted["predicted_energy_mj"] = rate * p50
    return _judged(
        (t.device, t.runtime, model),
        "predicted",
        values,
        budgets,
        predicted=predicted,
        evidence=evidence,
        counts=counts,
    )


def _kernel_verdict(
    t: _Target, model: str, budgets: Sequence[Budget], counts: ModelCounts, kp: Any
) -> Verdict:
    """A verdict from a kernel-level prediction: p50 latency budgets get its value and interval; budgets it
    does not predict stay unchecked (so the answer is "uncertain" rather than a guess)."""
    values: dict[str, float | None] = {}
    intervals: dict[str, tuple[float, float]] = {}
    for b in budgets:
        if b.quantity == "latency" and (b.stat or "p50") == "p50":
            values[b.key] = kp.p50_ms
            intervals[b.key] = (kp.low_ms, kp.high_ms)
        else:
            values[b.key] = None
    return _judged(
        (t.device, t.runtime, model),
        "predicted",
        values,
        budgets,
        predicted={"predicted_latency_ms:p50": kp.p50_ms},
        evidence=f"{kp.method}; p50 {kp.coverage:.0%} interval {kp.low_ms:.4g}-{kp.high_ms:.4g} ms "
        f"from {kp.pairs} held-out profiles",
        counts=counts,
        intervals=intervals,
    )


__all__ = [
    "Budget",
    "LatencyModel",
    "MachineModel",
    "CvPoint",
    "CvSummary",
    "KERNEL_PREDICTOR",
    "KernelCvPoint",
    "KernelCvSummary",
    "FitResult",
    "ModelCounts",
    "OpCost",
    "Observation",
    "Verdict",
    "assess",
    "budgets_from_suite",
    "count_model",
    "counts_from_records",
    "device_ceilings",
    "floor_times",
    "make_budget",
    "observations",
    "parse_budgets",
    "MEASURING_PROBES",
    "base_latency",
]
