"""What `fit` concludes, as typed results: a verdict per target x model x budget, the cross-validation of each
predictor (held-out points and their summaries), and the records they are stored as."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..records import Record, utc_now
from ..stats import conformal_bounds
from .budgets import Budget
from .model_counts import PROBE, ModelCounts
from .tails import TailCheck
from .variants import VariantRow

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
    # The budgets' limits the verdict was judged against, as a stored fit run recorded them (a live
    # result's are its FitResult's budgets).
    limits: dict[str, float] = field(default_factory=dict)
    # Where a measured backend row's run ran (agent.placement as its records carry it): a row whose run
    # was not wholly on its backend says so (analysis.fit.placement_state)
    placement: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """value / limit of the limiting budget."""
        return self.ratios.get(self.limiting) if self.limiting else None


FITS, NO_FIT, UNCERTAIN = "fits", "does not fit", "uncertain"


INTERVAL_COVERAGE = 0.8  # a prediction interval holds the true value 4 times in 5 (10% on each side)


TOO_FEW = "too few models to judge"
ROOFLINE_PREDICTOR = "roofline"  # the whole-model predictor (its records name no `predictor`)
KERNEL_PREDICTOR = "kernel"  # `predictor` param of the per-kernel predictor's cross-validation records
# Held-out models a predictor's share within +-10% is judged from (see MIN_JUDGED_MODELS).
MIN_JUDGED = {ROOFLINE_PREDICTOR: MIN_JUDGED_MODELS, KERNEL_PREDICTOR: MIN_JUDGED_KERNEL_MODELS}


@dataclass(frozen=True)
class CvPoint:
    """One measured pair held out: what a predictor's calibration that never saw it predicted. The
    whole-model predictor holds out a model on one target (`pair`) or everywhere (`model`) for each
    quantity; the per-kernel one holds out a profiled model at one set of input shapes (its plain p50)."""

    device: str
    runtime: str | None
    model: str
    holdout: str  # pair | model
    quantity: str  # latency_p50_ms | latency_p99_ms | memory_mb
    measured: float
    predicted: float
    predictor: str = ROOFLINE_PREDICTOR
    shapes: str = ""  # canonical JSON of the input shapes (per-kernel predictor)
    threads: int | None = None  # the threads profiled at (per-kernel predictor)
    stored_error: float | None = None  # as a stored fit run recorded it

    @property
    def error(self) -> float:
        if self.stored_error is not None:
            return self.stored_error
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class CvSummary:
    """A predictor's held-out errors on a target (or fleet-wide, device `*`) for one holdout and quantity,
    and, per target where the predictor gives one, the interval on measured / predicted a new model's
    value lies in at `coverage` (None with too few)."""

    device: str
    runtime: str | None
    holdout: str
    quantity: str
    pairs: int
    within: float
    median_abs_err: float
    models: int = 0  # distinct models held out
    predictor: str = ROOFLINE_PREDICTOR
    interval: tuple[float, float] | None = None
    coverage: float | None = None
    threads: int | None = None
    # As a stored fit run recorded it: whether the share was judged, the models it needed, the step that
    # gives enough (None: not recorded; a live result derives them from the predictor).
    stored_judged: bool | None = None
    stored_needed: int | None = None
    stored_next_step: str | None = None

    @property
    def needed(self) -> int | None:
        """Held-out models the share is judged from (MIN_JUDGED of the predictor)."""
        return self.stored_needed if self.stored_judged is not None else MIN_JUDGED.get(self.predictor)

    @property
    def judged(self) -> bool:
        """Whether enough models were held out to judge the share."""
        if self.stored_judged is not None:
            return self.stored_judged
        return self.models >= MIN_JUDGED[self.predictor]

    @property
    def next_step(self) -> str:
        """What gives the predictor enough models where the share is not judged."""
        if self.stored_judged is not None:
            return self.stored_next_step or ""
        if self.predictor == KERNEL_PREDICTOR:
            return kernel_next_step(self.device, self.threads)
        return whole_model_next_step(self.device)

    def to_dict(self) -> dict[str, Any]:
        """The summary as `fit --json` prints it: its figures, whether they are judged, and the interval."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if not k.startswith("stored_")}
        return {**out, "interval": list(self.interval) if self.interval else None, "judged": self.judged}

    def too_few(self) -> str:
        """Why the share is not judged and what gives enough ("" where it is judged)."""
        if self.judged:
            return ""
        needed = "?" if self.needed is None else self.needed
        return (
            f"{TOO_FEW}: {self.models} held out, {needed} needed; {self.next_step or 'measure more models'}"
        )


@dataclass
class FitResult:
    """Everything `fit` found: verdicts, cross-validation, per-target calibrations, notes for the user."""

    budgets: tuple[Budget, ...]
    verdicts: list[Verdict] = field(default_factory=list)
    cv: list[CvPoint] = field(default_factory=list)  # every predictor's held-out points
    calibrations: dict[tuple[str, str | None], dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    kernel_coverage: float = 0.8  # the coverage of the per-kernel predictor's intervals
    variants: list[VariantRow] = field(default_factory=list)  # each variant against its fp32 reference
    # The summaries as a stored fit run recorded them (None: derived from `cv`, as a live result does).
    stored_summaries: list[CvSummary] | None = None

    def held_out(self, predictor: str) -> list[CvPoint]:
        """One predictor's held-out points."""
        return [p for p in self.cv if p.predictor == predictor]

    def cv_summaries(self, predictor: str | None = None) -> list[CvSummary]:
        """Per predictor (the whole-model one first), per target and fleet-wide (device `*`), holdout and
        quantity: the share within +-10%, the median absolute error; for the per-kernel predictor, per
        target, the interval on measured / predicted at `kernel_coverage` and the threads profiled at."""
        wanted = [predictor] if predictor else list(MIN_JUDGED)
        if self.stored_summaries is not None:
            return [s for s in self.stored_summaries if s.predictor in wanted]
        return [s for name in wanted for s in self._summaries_of(name)]

    def _summaries_of(self, predictor: str) -> list[CvSummary]:
        groups: dict[tuple, list[CvPoint]] = defaultdict(list)
        for p in self.held_out(predictor):
            groups[(p.device, p.runtime, p.holdout, p.quantity)].append(p)
            groups[(AGGREGATE_DEVICE, None, p.holdout, p.quantity)].append(p)
        coverage = self.kernel_coverage if predictor == KERNEL_PREDICTOR else None
        out = []
        for (device, runtime, holdout, quantity), pts in sorted(
            groups.items(),
            key=lambda kv: (kv[0][0] != AGGREGATE_DEVICE, kv[0][0], kv[0][1] or "", kv[0][2], kv[0][3]),
        ):
            errs = np.abs([p.error for p in pts])
            per_target = device != AGGREGATE_DEVICE
            # an interval belongs to one target's calibration: none fleet-wide
            bounds = None
            if coverage is not None and per_target:
                bounds = conformal_bounds([p.measured / p.predicted for p in pts], coverage)
            threads = {p.threads for p in pts}
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
                    predictor,
                    bounds,
                    coverage,
                    threads.pop() if per_target and len(threads) == 1 else None,
                )
            )
        return out

    def to_records(self, run_id: str) -> list[Record]:
        """The result as records (probe `fit`), the schema every other part reads: identity in params
        (the budget, stat, holdout, quantity a figure is of), what is known about it in annotations."""
        out: list[Record] = []
        rec = _Recorder(run_id, utc_now(), out)
        limits = {b.key: b.limit for b in self.budgets}
        for v in self.verdicts:
            _verdict_records(rec, v, v.limits or limits)
        for (device, runtime), desc in sorted(
            self.calibrations.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
        ):
            rec(device, runtime, None, "calibration_models", desc.get("models"), "count", None, **desc)
        for predictor in MIN_JUDGED:  # the whole-model predictor's, then the per-kernel one's
            for p in self.held_out(predictor):
                _cv_point_record(rec, p)
            for summary in self.cv_summaries(predictor):
                _cv_summary_records(rec, summary)
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

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> FitResult:
        """A result as a stored fit run recorded it (`to_records`; older runs kept everything in params,
        verdicts without words, summaries without their judgement): its verdicts, held-out points, stored
        summaries and calibrations. Budgets and variants are not read back."""
        out = cls(budgets=(), stored_summaries=[])
        rows = [(r, {**r.params, **r.annotations}) for r in records if r.probe == PROBE]
        predicted: dict[tuple, dict[str, float]] = {}
        for r, p in rows:
            if r.metric.startswith("predicted_"):
                name = r.metric + (f":{p['stat']}" if p.get("stat") else "")
                predicted.setdefault((r.device, r.runtime, r.model), {})[name] = float(r.value or 0.0)
        summaries: dict[tuple, dict[str, Any]] = {}
        for r, p in rows:
            if r.metric == "fits":
                out.verdicts.append(_verdict_from(r, p, predicted.get((r.device, r.runtime, r.model), {})))
            elif r.metric == "cv_error":
                out.cv.append(_cv_point_from(r, p))
            elif r.metric == "calibration_models":
                out.calibrations[(r.device, r.runtime)] = {**p, "models": r.value}
            elif r.metric in ("cv_within_10pct", "cv_median_abs_err"):
                predictor = p.get("predictor") or ROOFLINE_PREDICTOR
                key = (r.device, r.runtime, predictor, p.get("holdout"), p.get("quantity"), p.get("pairs"))
                summaries.setdefault(key, {"p": p})[r.metric] = r.value
        assert out.stored_summaries is not None
        out.stored_summaries += [_summary_from(key, found) for key, found in summaries.items()]
        return out


class _Recorder:
    """Makes the records of one fit run: `rec(device, runtime, model, metric, value, unit, params,
    **annotations)` appends one."""

    def __init__(self, run_id: str, ts: str, out: list[Record]) -> None:
        self.run_id, self.ts, self.out = run_id, ts, out

    def __call__(
        self,
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
        value = None if value is None else float(value)
        self.out.append(
            Record(
                self.run_id,
                device,
                PROBE,
                model,
                runtime,
                metric,
                value,
                unit,
                params or {},
                self.ts,
                annotations,
            )
        )


def _verdict_records(rec: _Recorder, v: Verdict, limits: Mapping[str, float]) -> None:
    """A verdict's records: `fits` with everything known about the answer, a `budget_ratio` per budget
    judged, a `predicted_*` per predicted quantity."""
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
        budgets=dict(limits),
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
        placement=v.placement or None,
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


def _verdict_from(r: Record, p: Mapping[str, Any], predicted: dict[str, float]) -> Verdict:
    """A `fits` record read back (older runs: no words, no ratios by budget, no `basis`)."""
    limiting = p.get("limiting")
    ratios = dict(p.get("ratios") or {})
    if not ratios and limiting and p.get("ratio") is not None:
        ratios = {limiting: p["ratio"]}
    counts = None
    if "flops" in p:
        weights = p.get("weight_bytes")
        counts = ModelCounts(r.model or "", float(p["flops"]), float("nan") if weights is None else weights)
    return Verdict(
        r.device,
        r.runtime,
        r.model or "",
        p.get("basis", ""),
        dict(p.get("values") or {}),
        None if r.value is None else bool(r.value),
        limiting,
        p.get("margin"),
        {},
        tuple(p.get("unchecked") or ()),
        config=dict(p.get("config") or {}),
        predicted=predicted,
        evidence=p.get("evidence") or "",
        estimated=tuple(p.get("estimated") or ()),
        counts=counts,
        verdict=_words_of(p, r.value),
        ratios=ratios,
        intervals={k: (float(iv[0]), float(iv[1])) for k, iv in (p.get("intervals") or {}).items()},
        why=p.get("why") or "",
        memory=dict(p.get("memory") or {}),
        limits=dict(p.get("budgets") or {}),
        placement=dict(p.get("placement") or {}),
    )


def _words_of(p: Mapping[str, Any], fits: float | None) -> str:
    """A verdict record's answer; fit runs stored before verdicts had words: from `fits` and budgets."""
    if "verdict" in p:
        return str(p["verdict"] or "")
    if not p.get("budgets"):
        return ""
    return {1.0: FITS, 0.0: NO_FIT}.get(fits, UNCERTAIN) if fits is not None else UNCERTAIN


def _cv_point_from(r: Record, p: Mapping[str, Any]) -> CvPoint:
    shapes = p.get("shapes")
    return CvPoint(
        r.device,
        r.runtime,
        r.model or "",
        p.get("holdout"),
        p.get("quantity"),
        p.get("measured"),
        p.get("predicted"),
        p.get("predictor") or ROOFLINE_PREDICTOR,
        json.dumps(shapes, sort_keys=True) if shapes is not None else "",
        p.get("threads"),
        stored_error=r.value,
    )


def _summary_from(key: tuple, found: Mapping[str, Any]) -> CvSummary:
    device, runtime, predictor, holdout, quantity, pairs = key
    p = found["p"]
    interval = tuple(p["interval"]) if p.get("interval") else None
    return CvSummary(
        device,
        runtime,
        holdout,
        quantity,
        pairs,
        found.get("cv_within_10pct"),
        found.get("cv_median_abs_err"),
        p.get("models", 0),
        predictor,
        interval,
        p.get("coverage"),
        p.get("threads"),
        # fit runs stored before shares were judged by their held-out models: judged
        stored_judged=p.get("judged", True) is not False,
        stored_needed=p.get("models_needed"),
        stored_next_step=p.get("next_step"),
    )


def _cv_point_record(rec: _Recorder, p: CvPoint) -> None:
    """A held-out point's `cv_error` record; the whole-model predictor's name no predictor (as they
    always have), the others' their predictor, the input shapes and threads."""
    params: dict[str, Any] = {"holdout": p.holdout, "quantity": p.quantity}
    extra: dict[str, Any] = {}
    if p.predictor != ROOFLINE_PREDICTOR:
        params.update(predictor=p.predictor, shapes=json.loads(p.shapes) if p.shapes else {})
        extra["threads"] = p.threads
    rec(
        p.device,
        p.runtime,
        p.model,
        "cv_error",
        p.error,
        "ratio",
        params,
        measured=p.measured,
        predicted=p.predicted,
        **extra,
    )


def _cv_summary_records(rec: _Recorder, s: CvSummary) -> None:
    """A cross-validation summary's two records (share within +-10%, median error) with its count and
    judgement; a predictor that gives intervals adds the target's interval, coverage and threads."""
    ident: dict[str, Any] = {"holdout": s.holdout, "quantity": s.quantity}
    extra: dict[str, Any] = {}
    if s.predictor != ROOFLINE_PREDICTOR:
        ident["predictor"] = s.predictor
        extra = {
            "interval": list(s.interval) if s.interval else None,
            "coverage": s.coverage,
            "threads": s.threads,
        }
    judged = judgement(s.models, s.needed or 0, s.next_step)
    for metric, value in (("cv_within_10pct", s.within), ("cv_median_abs_err", s.median_abs_err)):
        rec(s.device, s.runtime, None, metric, value, "ratio", dict(ident), pairs=s.pairs, **extra, **judged)


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


def verdict_exit_code(verdicts: Sequence[Verdict], strict: bool = False) -> int:
    """`fit` as a release gate: 1 when a pair does not fit (or, with strict, is uncertain), else 0."""
    found = {v.verdict for v in verdicts}
    return 1 if NO_FIT in found or (strict and UNCERTAIN in found) else 0
