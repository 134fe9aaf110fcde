"""The whole-model predictor: a target's latency for a model never measured there, from the model's floor
times at the target's ceilings, calibrated on the models measured there; `fit` judges with it.

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
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..records import Record
from .fit_result import ROOFLINE_PREDICTOR, CvPoint
from .model_counts import ModelCounts
from .observations import Observation, base_latency
from .predictor import ENERGY, LATENCY, MEMORY, Prediction


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


def roofline_targets(
    obs_all: Sequence[Observation],
    profiled: Sequence[tuple[str, str | None]],
    measured_ceilings: Mapping[str, MachineModel],
    counts: Mapping[str, ModelCounts],
) -> dict[tuple[str, str | None], _Target]:
    """Calibrate: every target (device, runtime) with what the predictor needs of it: its measured models,
    its ceilings (the store's, else fitted from its models) and every counted model's floor times there. A
    target only profiled, never benched, is one too (the per-kernel predictor answers there)."""
    targets: dict[tuple[str, str | None], _Target] = {}
    for o in obs_all:
        t = targets.setdefault(o.target, _Target(o.device, o.runtime, MachineModel(), {}))
        t.obs[o.model] = o
    for device, runtime in profiled:
        targets.setdefault((device, runtime), _Target(device, runtime, MachineModel(), {}))
    for t in targets.values():
        t.measured = measured_ceilings.get(t.device)
        t.ceil = _effective_ceilings(t.measured, t.obs, counts)
        for name, c in counts.items():
            t.features[name] = floor_times(c, t.ceil)
            t.z[name] = _descriptor(c, t.features[name])
    return targets


def calibration_description(engine: _Engine, key: tuple[str, str | None]) -> dict[str, Any] | None:
    """What a target's calibration is (its method, efficiencies, overheads) and the ceilings it rests on;
    None without one."""
    cal = engine.calibration(key, exclude=None)
    if cal is None:
        return None
    t = engine.targets[key]
    desc = cal.describe()
    desc["ceilings"] = {
        "peak_gflops": (t.ceil.peak_flops or 0) / 1e9,
        "bandwidth_gbps": (t.ceil.bandwidth or 0) / 1e9,
        "source": t.ceil.source,
    }
    if t.ceil.llc_bytes:
        desc["ceilings"]["llc_mb"] = t.ceil.llc_bytes / 1e6
    return desc


class RooflinePredictor:
    """The whole-model predictor behind fit's `Predictor` interface: the calibrated roofline of each target
    (`_Engine`), its latency at any percentile, the model's memory and energy per inference."""

    name = ROOFLINE_PREDICTOR

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    def predict(
        self, target: tuple[str, str | None], model: str, counts: ModelCounts, stats: Sequence[str]
    ) -> dict[str, Prediction] | None:
        engine = self.engine
        p50, evidence = engine.predict_stat(target, model, None, "p50")
        if p50 is None:
            return None
        out = {f"{LATENCY}:p50": Prediction(p50, None, evidence)}
        best, _ = engine.predict(target, model, None)
        if best is not None:
            out[f"{LATENCY}:min"] = Prediction(best, None, evidence)  # the calibrated base: the fastest
        for stat in stats:
            value, _ = engine.predict_stat(target, model, None, stat)
            if value is not None and stat != "p50":
                out[f"{LATENCY}:{stat}"] = Prediction(value, None, evidence)
        mem = engine.memory(target, model, None)
        if mem is not None:
            out[MEMORY] = Prediction(mem, None, evidence)
        rate = engine.energy_rate(target, None)
        if rate is not None:
            out[ENERGY] = Prediction(rate * p50, None, evidence)
        return out

    def held_out(self) -> list[CvPoint]:
        return self.engine.cross_validate()
