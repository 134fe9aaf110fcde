"""Which model fits which chip: budget verdicts from measurements, predictions for pairs never measured.

A *target* is a device and a runtime. For every target x model, `assess` gives a verdict against the
budgets (latency at a percentile, memory, energy per inference, load time), with `basis` =
`measured` when the model was benched on that target and `predicted` when it was not.

Memory: `memory_mb` is the model's own memory (`model_memory_mb` of the bench records: the peak resident set
over load and inference minus the process just before the load), the high end of its range over the
invocations of the configuration judged, so the runtime's and the harness's baseline (the interpreter and
its libraries, ~50 MB for a Python agent with onnxruntime) is not charged to the model; that baseline is
shown beside it. `process_memory_mb` budgets the whole process's peak (`peak_rss_mb`).

A pair never measured is predicted by the first of fit's predictors (`analysis.predictor`: calibrate,
predict, held out) that answers: the per-kernel one (`kernel_predict`) where the store holds per-op
profiles and its held-out profiles give an interval, else the whole-model one (`roofline_predict`, the
calibrated roofline from whole-model counts).

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
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..records import Record, Samples
from .budgets import Budget
from .fit_result import (
    FITS,
    INTERVAL_COVERAGE,
    NO_FIT,
    ROOFLINE_PREDICTOR,
    UNCERTAIN,
    WITHIN,
    CvPoint,
    FitResult,
    Verdict,
)
from .kernel_predict import KernelPredictor, TargetPredictor
from .model_counts import ModelCounts, counts_from_records
from .observations import (
    DecodeSpeed,
    Observation,
    decode_by_pair,
    observations,
)
from .predictor import ENERGY, LATENCY, MEMORY, Predictor
from .roofline_predict import (
    RooflinePredictor,
    _Engine,
    _Target,
    calibration_description,
    device_ceilings,
    roofline_targets,
)
from .variants import variant_rows


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
        _check_devices(devices, obs_all, decoded, profiled, asked)
        obs_all = [o for o in obs_all if o.device in devices]
        profiled = [(d, r) for d, r in profiled if d in devices]
    targets = roofline_targets(obs_all, profiled, device_ceilings(records, device_info, run_order), counts)
    # Models: those measured, those named by the caller, and those the counts describe (roofline records).
    all_models = sorted({o.model for o in obs_all} | set(models or []) | set(counts))
    result.warnings += _count_warnings(all_models, obs_all, targets, counts, concern)
    engine = _Engine(targets, counts)
    roofline = RooflinePredictor(engine)
    # the per-kernel predictor first: where it gives an interval it answers; elsewhere the whole-model one
    predictors: list[Predictor] = (
        [roofline] if kernel is None else [KernelPredictor(kernel, devices), roofline]
    )
    for key, t in sorted(targets.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        desc = calibration_description(engine, key)
        if desc is not None:
            result.calibrations[key] = desc
        for model in all_models:
            if model in t.obs:
                result.verdicts.append(_measured_verdict(t, t.obs[model], budgets, counts.get(model), engine))
            elif model in counts:
                v = _predicted_verdict(key, model, budgets, counts[model], predictors)
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
    result.cv = [p for predictor in reversed(predictors) for p in predictor.held_out()]
    if kernel is not None:
        result.kernel_coverage = kernel.coverage
        result.warnings += unsteady_speed_warnings(kernel.speed_spans(), devices)
    measured_on = defaultdict(set)
    for t in targets.values():
        for m in t.obs:
            measured_on[m].add((t.device, t.runtime))
    whole_model_cv = result.held_out(ROOFLINE_PREDICTOR)
    result.verdicts = [
        decide(v, budgets, whole_model_cv, bool(measured_on[v.model] - {(v.device, v.runtime)}))
        for v in result.verdicts
    ]
    verdict_of = {(v.device, v.model): v.verdict for v in result.verdicts if v.basis == "measured"}
    result.variants = variant_rows(records, samples, obs_all, verdict_of)
    result.warnings += _few_models_warnings(targets, counts, result.verdicts, concern)
    return result


def _check_devices(
    devices: Sequence[str],
    obs_all: Sequence[Observation],
    decoded: Mapping[tuple, DecodeSpeed],
    profiled: Sequence[tuple[str, str | None]],
    asked: Sequence[str] | None,
) -> None:
    """A one-line UserError for a device asked about that the store has no measurement of."""
    known = {o.device for o in obs_all} | {ident[0] for ident in decoded} | {d for d, _ in profiled}
    for d in devices:
        if d not in known:
            model = next(iter(asked or ()), "MODEL")
            raise UserError(
                f"device '{d}' has no bench measurements in the store (known: "
                f"{', '.join(sorted(known)) or 'none'}): run `edgebench bench {model} --device {d}` first"
            )


def _count_warnings(
    all_models: Sequence[str],
    obs_all: Sequence[Observation],
    targets: Mapping[tuple, _Target],
    counts: Mapping[str, ModelCounts],
    concern: Any,
) -> list[str]:
    """What the missing FLOP/byte counts cost: models that cannot be predicted, measured models that cannot
    calibrate."""
    out = []
    missing = sorted(m for m in all_models if m not in counts)
    unmeasured_missing = concern([m for m in missing if not any(m in t.obs for t in targets.values())])
    if unmeasured_missing:
        out.append(
            f"no FLOP/byte counts for {', '.join(unmeasured_missing)}: cannot predict "
            "them (pass the ONNX file with --model, or run `edgebench roofline` on it)"
        )
    uncounted_measured = concern(sorted({o.model for o in obs_all} - set(counts)))
    if uncounted_measured:
        out.append(
            f"measured models without counts are not used to calibrate predictions: "
            f"{', '.join(uncounted_measured)} (pass them with --model PATH)"
        )
    return out


def _few_models_warnings(
    targets: Mapping[tuple, _Target],
    counts: Mapping[str, ModelCounts],
    verdicts: Sequence[Verdict],
    concern: Any,
) -> list[str]:
    """A warning per target whose predictions rest on fewer than three measured models."""
    out = []
    for key, t in targets.items():
        n = sum(1 for m in t.obs if m in counts)
        if 0 < n < 3 and any(
            v.basis == "predicted" and (v.device, v.runtime) == key and concern([v.model]) for v in verdicts
        ):
            out.append(
                f"{t.device}: predictions rest on only {n} measured model(s); bench a few "
                "more models of different sizes on it to trust them"
            )
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
    not_there, placed = placement_state(v.placement)
    if not budgets:
        why = "; ".join(filter(None, ["no budgets given", placed]))
        return replace(v, verdict="", ratios=ratios, why=why)
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
    if not_there and verdict != UNCERTAIN:
        reasons.append(placed)  # the figures are another unit's: no answer for this backend from them
        verdict = UNCERTAIN
    elif placed:
        notes.append(placed)
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


def placement_state(placement: Mapping[str, Any]) -> tuple[bool, str]:
    """(the run was not on its backend at all, what to say of where it ran) for a measured backend row.

    A run wholly on another unit (a silent fallback: `ncnn@vulkan` that ran on the CPU) or whose placement
    is unknown measured something else than the row names, so its figures answer nothing for the backend;
    a partial run is what the backend does with this model (the ops it lacks run elsewhere on any device
    of that driver), so its answer stands with the ops named beside it."""
    asked, actual = placement.get("requested"), placement.get("actual")
    if not placement or asked in (None, "cpu") or actual == asked:
        return False, ""
    counts = placement.get("ops_by_unit") or {}
    if actual == "unknown" or asked not in counts:
        return True, f"placement: {asked} asked for, ran on {actual} ({placement.get('evidence', '')})"
    fallen = list(placement.get("fallback_ops") or [])
    named = ", ".join(fallen[:5]) + (f" and {len(fallen) - 5} more" if len(fallen) > 5 else "")
    return False, (
        f"placement: partly on {asked}, {len(fallen)} of {sum(counts.values())} ops elsewhere"
        + (f" ({named})" if named else "")
    )


def _times(ratio: float) -> str:
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:.0f}x"


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
        placement=o.placement,
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
) -> TargetPredictor | None:
    """The per-op-kind predictor (edgebench.analysis.kernel_predict) where the store holds per-op profiles
    (each device's fingerprint in `device_info` sets the NCHWc layout its graphs are predicted in)."""
    if not any(r.probe == "profile" and r.metric == "op_time_ms" for r in records):
        return None
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
    key: tuple[str, str | None],
    model: str,
    budgets: Sequence[Budget],
    counts: ModelCounts,
    predictors: Sequence[Predictor],
) -> Verdict | None:
    """A prediction by the first predictor that gives one (the per-kernel one only with an interval): each
    budget gets the predicted value of its quantity and, where the predictor gives one, its interval; a
    budget the predictor does not predict stays unchecked (so the answer is "uncertain", not a guess)."""
    stats = [b.stat or "p50" for b in budgets if b.quantity == "latency"]
    for predictor in predictors:
        found = predictor.predict(key, model, counts, stats)
        if found is not None:
            break
    else:
        return None
    wanted = {"latency": None, "memory": MEMORY, "energy": ENERGY}
    values: dict[str, float | None] = {}
    intervals: dict[str, tuple[float, float]] = {}
    for b in budgets:
        quantity = f"{LATENCY}:{b.stat or 'p50'}" if b.quantity == "latency" else wanted.get(b.quantity)
        p = found.get(quantity) if quantity else None  # load and RTF are never predicted
        values[b.key] = None if p is None else p.point
        if p is not None and p.interval is not None:
            intervals[b.key] = p.interval
    return _judged(
        (key[0], key[1], model),
        "predicted",
        values,
        budgets,
        predicted={f"predicted_{q}": p.point for q, p in found.items()},
        evidence=found[f"{LATENCY}:p50"].evidence,
        counts=counts,
        intervals=intervals,
    )


__all__ = [
    "assess",
    "decide",
    "prediction_interval",
    "min_pairs_for_interval",
    "memory_context",
    "unsteady_speed_warnings",
]
