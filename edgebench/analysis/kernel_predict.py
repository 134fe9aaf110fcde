"""A kernel-level latency predictor, calibrated per device, runtime and thread count from per-op profiles.

In the spirit of nn-Meter: what a model costs on a device is the sum of what its kernels cost there. From
the `profile` probe's records (every op's time per inference with the tensors it saw) each kernel gets a
kind and features (`edgebench.analysis.kernels`); per kind, a kernel's time is fitted as

    ms = a * GFLOPs + b * activation bytes / BW(kernel) + (w + e * f) * weight bytes / BW(model) + d

where BW(size) is the bandwidth the device's memory-hierarchy sweep (`probe bandwidth --sweep`, at the
profiles' thread count) measured at that working-set size: a kernel's activations at the size it reads and
writes (just written by the kernel before it), its weights at the model's working set (weights + peak
activations: what the weights share the caches with from one inference to the next). So a model whose
weights sit in DRAM is charged DRAM speed even when every profiled model fitted in a cache; f (0 at the
fastest level's bandwidth, 1 at memory's) lets a kind reach a smaller share of the sweep's bandwidth from
memory than from its caches (e >= 0; e is 0 where no profiled model's weights left the caches, so the
extrapolation above holds). Without a sweep, BW is 1 GB/s everywhere (plain bytes).

(kinds with too few profiled kernels share one fit over all of them), then multiplied by a correction a
random forest (nn-Meter's regressor) learns on the log ratio of profiled time to that estimate from the
kernel's shape (channels, positions, multiply-adds per output) and its model's working set (weights and
activation traffic: what stays cached). A model is predicted from its graph (`kernels.graph_kernels`: the
same kinds, fused as the runtimes fuse, with onnxruntime's NCHWc layout reorders at the device's channel
block) as

    latency = s * sum(kernel predictions) + c

where the in-model scale s and the per-inference overhead c are fitted over the profiled models' plain p50
latencies, least squares on the relative error: kernels inside a whole model run slower than the
calibration reads them (caches shared with the kernels around them; MNN's sums missed 5-15% of the plain
p50 in-sample here), and what an inference spends outside its kernels is a constant. The profile
probe takes off the profiler's cost per op as timed on a chain of trivial ops; on real models some stays
(0.4-2 us per kernel here: a real kernel's event costs more than a trivial one's). Fitted first over the
profiled models from how far each model's profiled sum exceeds its plain p50 against its kernel count,
that rest is taken off every profiled kernel, so a model of many small kernels is not predicted at its
profiled cost; a profile whose kernels still add up to more than its plain p50 is scaled down to it.
Every prediction carries an interval from leave-one-model-out residuals on the same target (a held-out
model is left out at every shape it was profiled at, and predicted from its graph, as a new model is).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..records import Record
from ..runtimes import KernelRules, kernel_rules
from ..runtimes import runtime as runtime_named
from ..stats import conformal_bounds
from .fit_result import KERNEL_PREDICTOR, CvPoint
from .kernels import KINDS, Kernel, mark_gemm_tile_reads, profile_kernel
from .model_counts import ModelCounts
from .predictor import LATENCY, Prediction

METHOD = "per-op-kind calibration (profile), in-model scale + per-inference overhead"
MIN_KIND_KERNELS = 4  # fewer profiled kernels of a kind: it shares the pooled fit
MIN_MODELS = 3  # profiled models (by name) a target needs before it predicts
MIN_SPAN_RUNS = 10  # profiles with speed references before their spread is told (`speed_span`)
_SCALE = (1e9,)  # GFLOPs: a column comparable to the others (ms) for the solver
SCALE_PRIOR = 1.0  # the in-model scale's pull to 1, in models (`fit_scale_and_overhead`)
FIT_LOSS_SCALE = 0.1  # relative error past which a kernel's residual counts linearly in `_fit`, not squared
# trees of the correction's forest: with 30, three models of another kind added to the training moved the
# others' predictions 0.9-1.7% at the median (synthetic, five seeds), with 100 0.7-0.8%: fewer bootstrap
# draws' noise in every prediction, for 1.8x the fitting time (`_fit_correction`)
FOREST_TREES = 100
# a calibration on fewer kernels than this (the main job's six models and few samples: ~70) grows fewer
# trees: each costs ~4 ms however few its rows, and a leave-one-model-out check fits one forest per model
# held out; the bootstrap noise of 30 trees (1-2% at the median, above) is small against +-10%
FOREST_FULL_ROWS = 200
FOREST_SMALL_TREES = 30
PROFILED_SHARE_KEPT = 0.2  # a kernel keeps at least this share of its profiled time, the profiler's off


@dataclass(frozen=True)
class ProfiledRun:
    """One model profiled on a target at one set of input shapes: its plain p50 and its kernels' times."""

    device: str
    runtime: str | None
    threads: int | None
    model: str
    shapes: str  # canonical JSON of the input shapes
    latency_ms: float
    kernels: tuple[tuple[Kernel, float], ...]
    # (reference identity, p50 ms) of the fixed kernels timed around the plain runs (`speed_reference_ms`)
    speeds: tuple[tuple[str, float], ...] = ()

    @property
    def target(self) -> tuple[str, str | None, int | None]:
        return self.device, self.runtime, self.threads


def profiled_runs(
    records: Iterable[Record], fingerprints: Mapping[str, Mapping[str, Any]] | None = None
) -> list[ProfiledRun]:
    """The newest profile of every (device, runtime, threads, model, shapes) in the records; on a runtime
    whose unary ops reading whole GEMM tiles run apart (MNN), those marked at the tile of the device's ISA
    (`fingerprints`, by device; a device not in it: the runtime's `unknown_device_gemm_tile`)."""
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for r in records:
        if r.probe != "profile" or r.model is None or r.value is None:
            continue
        if r.metric not in ("op_time_ms", "latency_ms", "speed_reference_ms"):
            continue
        shapes = json.dumps(r.params.get("shapes") or r.annotations.get("input_shapes") or {}, sort_keys=True)
        groups[(r.device, r.runtime, r.params.get("threads"), r.model, shapes, r.run_id)].append(r)
    newest: dict[tuple, tuple[str, list[Record]]] = {}
    for key, recs in groups.items():
        ts = max(r.ts for r in recs)
        ident = key[:5]
        if ident not in newest or ts > newest[ident][0]:
            newest[ident] = (ts, recs)
    out = []
    for (device, runtime, threads, model, shapes), (_, recs) in sorted(
        newest.items(), key=lambda kv: str(kv[0])
    ):
        p50 = [r.value for r in recs if r.metric == "latency_ms" and r.params.get("stat") == "p50"]
        if not p50:  # a vendor tool's per-layer profile (benchncnn): its mean is all it prints, said so
            p50 = [
                r.value
                for r in recs
                if r.metric == "latency_ms"
                and r.params.get("stat") == "mean"
                and r.annotations.get("aggregated_by") == "tool"
            ]
        ops = [r for r in recs if r.metric == "op_time_ms"]
        if all(isinstance(r.annotations.get("order"), int) for r in ops):  # as they ran (older: as stored)
            ops.sort(key=lambda r: r.annotations["order"])
        rules = kernel_rules(runtime or "onnxruntime")
        tile = _gemm_tile(runtime, (fingerprints or {}).get(device))
        kernels = tuple(zip(_record_kernels(ops, rules, tile), (float(r.value) for r in ops), strict=True))
        speeds = tuple(
            sorted(
                (str(r.params.get("reference")), float(r.value))
                for r in recs
                if r.metric == "speed_reference_ms" and r.value > 0
            )
        )
        if p50 and kernels and p50[0] > 0:
            out.append(ProfiledRun(device, runtime, threads, model, shapes, float(p50[0]), kernels, speeds))
    return out


def speed_factors(runs: Sequence[ProfiledRun]) -> list[float]:
    """How slow the device ran during each profile against its usual: per speed reference, the time beside
    that run over the reference's median over all the runs, the geometric mean over the references (1.0
    for a run without any: older profiles, or a reference timed beside too few runs to have a median)."""
    return [1.0 if f is None else f for f in _reference_factors(runs)]


def _reference_factors(runs: Sequence[ProfiledRun]) -> list[float | None]:
    """`speed_factors`, None for a run no reference with a median was timed beside."""
    timed: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        for ref, ms in r.speeds:
            timed[ref].append(ms)
    usual = {ref: float(np.median(v)) for ref, v in timed.items() if len(v) >= MIN_MODELS}
    factors: list[float | None] = []
    for r in runs:
        logs = [math.log(ms / usual[ref]) for ref, ms in r.speeds if ref in usual]
        factors.append(math.exp(float(np.mean(logs))) if logs else None)
    return factors


def speed_span(runs: Sequence[ProfiledRun], share: float = 0.8) -> tuple[float, float] | None:
    """How far the device's speed moved over its profiles: the quantiles bounding the middle `share` of
    the speed factors of the runs timed beside references (None with fewer than MIN_SPAN_RUNS of them).
    A span wider than the accuracy asked of a prediction is the device's, not the predictor's."""
    factors = [f for f in _reference_factors(runs) if f is not None]
    if len(factors) < MIN_SPAN_RUNS:
        return None
    tail = (1 - share) / 2
    low, high = np.quantile(factors, [tail, 1 - tail])
    return float(low), float(high)


def _gemm_tile(runtime: str | None, fingerprint: Mapping[str, Any] | None) -> int | None:
    """The runtime's GEMM tile on a device (from its fingerprint; not known: the rules' default)."""
    found = runtime_named(runtime or "onnxruntime")
    if fingerprint and fingerprint.get("arch"):
        return found.gemm_tile(fingerprint)
    return found.kernels.unknown_device_gemm_tile


def _record_kernels(ops: Sequence[Record], rules: KernelRules, tile: int | None) -> list[Kernel]:
    """A profile's kernels in the order they ran; on a runtime that marks them (MNN), unary ops reading a
    GEMM's whole tiles marked."""
    kernels = [_record_kernel(r) for r in ops]
    if not rules.marks_gemm_tile_reads:
        return kernels
    return mark_gemm_tile_reads(
        [(k, _dims(r, "inputs"), _dims(r, "outputs")) for k, r in zip(kernels, ops, strict=True)], tile
    )


def _dims(r: Record, side: str) -> tuple[int, ...] | None:
    tensors = r.annotations.get(side) or ()
    return tuple(int(d) for d in tensors[0][1]) if tensors and tensors[0][1] is not None else None


def _record_kernel(r: Record) -> Kernel:
    a = r.annotations
    return profile_kernel(
        str(r.params.get("op_type", "")),
        a.get("inputs") or (),
        a.get("outputs") or (),
        parameter_bytes=a.get("parameter_bytes"),
        runtime_flops=a.get("runtime_flops"),
        activation_bytes=a.get("activation_bytes"),
        name=str(r.params.get("node", "")),
    )


@dataclass(frozen=True)
class MemoryCurve:
    """Bandwidth against working-set size as a device's sweep measured it, interpolated on log size
    (flat beyond the ends). Empty: 1 GB/s at every size, so the features are plain bytes."""

    points: tuple[tuple[float, float], ...] = ()  # (working-set bytes, GB/s), sorted by size
    run_id: str | None = None
    threads: int | None = None

    def gbps(self, working_set_bytes: float) -> float:
        if not self.points:
            return 1.0
        sizes = np.log([max(s, 1.0) for s, _ in self.points])
        return float(np.interp(math.log(max(working_set_bytes, 1.0)), sizes, [g for _, g in self.points]))

    def beyond_caches(self, working_set_bytes: float) -> float:
        """How far down the hierarchy a working set streams from: 0 at the fastest level's bandwidth, 1 at
        the slowest's (memory), in between on the curve (0 without a sweep)."""
        if not self.points:
            return 0.0
        fastest, slowest = self.points[0][1], self.points[-1][1]
        if fastest <= slowest:
            return 0.0
        return min(1.0, max(0.0, (fastest - self.gbps(working_set_bytes)) / (fastest - slowest)))


def memory_curve(records: Iterable[Record], device: str, threads: int | None) -> MemoryCurve:
    """The latest sweep of `device` at the most threads up to `threads` (any count when None)."""
    from .ceilings import hierarchy_at

    def usable(r: Record) -> bool:
        t = r.params.get("threads")
        return threads is None or (isinstance(t, int | float) and 0 < t <= threads)

    mine = [r for r in records if r.device == device and r.probe == "bandwidth" and usable(r)]
    levels, curve, run = hierarchy_at(mine)
    if not curve:
        return MemoryCurve()
    sizes = [float(s) for s, _ in curve]
    gbps = non_increasing([float(g) for _, g in curve])
    return MemoryCurve(tuple(zip(sizes, gbps, strict=True)), run, levels[0].threads if levels else None)


def non_increasing(gbps: Sequence[float]) -> list[float]:
    """The closest curve (least squares) that never rises with working-set size: a larger working set
    cannot stream faster from a slower level, so where a sweep's figure rises with size that is a trial
    slowed by other work at the smaller size (or a lucky one at the larger), and the two are pooled."""
    from scipy.optimize import isotonic_regression

    return [float(g) for g in isotonic_regression(np.asarray(gbps, float), increasing=False).x]


Context = tuple[float, float, float]  # the model's weight bytes, activation traffic, working set


# kinds whose constant operands are weights a runtime packs and reuses; any other kind streams its
# constants (a bias added, a scale multiplied) with its activations
WEIGHTED_KINDS = frozenset({"conv", "conv_dw", "deconv", "gemm", "gemv", "matmul", "recurrent", "norm"})


def _row(k: Kernel, context: Context, memory: MemoryCurve) -> list[float]:
    """GFLOPs, then activation and weight bytes as ms at the bandwidth of the level each streams from,
    and the weights' ms again times how far down the hierarchy they sit (`MemoryCurve.beyond_caches`):
    a kernel streams its weights from memory at a smaller share of the sweep's bandwidth than from a
    cache (onnxruntime's GEMVs here: 0.7-0.97 of it in caches, 0.6 from memory)."""
    weights = k.weight_bytes if k.kind in WEIGHTED_KINDS else 0.0
    streamed = k.bytes + k.weight_bytes - weights
    activation_ms = streamed / memory.gbps(k.bytes + k.weight_bytes) / 1e6
    weight_ms = weights / memory.gbps(context[2]) / 1e6
    return [k.flops / _SCALE[0], activation_ms, weight_ms, weight_ms * memory.beyond_caches(context[2]), 1.0]


def _fit(rows: Sequence[list[float]], ms: Sequence[float]) -> np.ndarray:
    """Non-negative costs on relative residuals under a soft-L1 loss (`FIT_LOSS_SCALE`), started from NNLS
    weighted by 1/sqrt(time). Why robust: a kind has a handful of samples, and one of them caught in a slow
    moment of the host took its kind's coefficients with it under least squares (onnxruntime's few-position
    convolutions: 8 GFLOP/s in one pass, 116 in the next, the same kernels run at 20-30 in both). Over ten
    stored passes this moved the leave-one-model-out share within +-10% from 53 to 60% on onnxruntime and
    from 54 to 57% on MNN (docs/report.md)."""
    from scipy.optimize import least_squares, nnls  # lazily: scipy costs a second of every CLI start

    X, y = np.asarray(rows, float), np.asarray(ms, float)
    w = 1.0 / np.sqrt(np.maximum(y, 1e-4))
    start, _ = nnls(X * w[:, None], y * w)
    relative = np.maximum(y, 1e-4)
    fit = least_squares(
        lambda c: (X @ c - y) / relative,
        np.maximum(start, 1e-12),  # inside the bounds, as the solver needs
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=FIT_LOSS_SCALE,
    )
    return fit.x


_KIND_CODE = {kind: i for i, kind in enumerate(KINDS)}
MIN_FLOOR_MS = 1e-4  # a kernel's linear estimate is floored here before the correction multiplies it


def _context(kernels: Sequence[Kernel]) -> Context:
    """The model's weight bytes, activation traffic and working set (weights + the largest kernel's
    activations): whether its weights stay in a cache from one kernel, and one inference, to the next."""
    weights = float(sum(k.weight_bytes for k in kernels))
    peak = max((k.bytes for k in kernels), default=0.0)
    return weights, float(sum(k.bytes for k in kernels)), weights + peak


def _op_family(k: Kernel, runtime: str | None) -> float:
    """The family code of the runtime's op that runs a kernel's work at a cost of its own
    (`KernelRules.op_families`, as both its profiles and kernels.graph_kernels name the ops); 0: none."""
    return kernel_rules(runtime or "onnxruntime").op_families.get(k.op_type, 0.0)


def fit_key(k: Kernel, runtime: str | None) -> str:
    """What a kernel's linear costs are fitted per: its kind, or its kind and op where the runtime runs
    that op at a cost of its own (a kind's fit serves the op where it has too few kernels). onnxruntime's
    convolutions over a few positions run as GEMVs with an unfold and a call's fixed cost that its
    MatMul GEMVs, streaming their weights, do not have: on one fit the convolutions' fixed and activation
    costs went to every small MatMul GEMV (tinymlp's 0.5 MiB layers predicted at 20 us, run in 10 us).
    MNN's unary ops reading a convolution's whole GEMM tiles (`kernels.runs_gemm_tiles`) run on a law of
    their own: 1.5 ns per element here against 0.22 for the same ops elsewhere."""
    if k.reads_gemm_tiles:
        return f"{k.kind}/after-gemm-tiles"
    family = _op_family(k, runtime)
    if family >= 2 or (family == 1 and k.kind == "gemv"):
        return f"{k.kind}/{'Conv' if family == 1 else k.op_type}"
    return k.kind


def repeats_before(kernels: Sequence[Kernel]) -> list[int]:
    """For each kernel, how many kernels of the same work (op, FLOPs, bytes, weights) came before it in
    its model: the same kernel run again runs warm (its code and scratch just used), 5-25% faster on
    onnxruntime here, up to 4x for small convolutions, while a kernel sample runs every kernel once."""
    seen: dict[tuple, int] = defaultdict(int)
    out = []
    for k in kernels:
        key = (k.op_type, k.kind, k.flops, k.bytes, k.weight_bytes)
        out.append(seen[key])
        seen[key] += 1
    return out


def _shape_row(
    k: Kernel, linear_ms: float, context: Context, runtime: str | None, repeat: int = 0
) -> list[float]:
    """What the non-linear correction sees: the kind (one-hot), the work and bytes, the shape (channels,
    positions, multiply-adds per output: kernel size and depthwise-ness), the model's weights (cache
    residency), how many kernels of the same work ran before it in the model (`repeats_before`) and the
    linear estimate itself, all on log scales; for onnxruntime also which of its own op families runs the
    work (`KernelRules.op_families`)."""
    onehot = [0.0] * len(KINDS)
    onehot[_KIND_CODE.get(k.kind, len(KINDS) - 1)] = 1.0
    logs = [math.log1p(v) for v in (k.flops, k.bytes, k.weight_bytes, *k.geometry, *context[:2], repeat)]
    family = _op_family(k, runtime)
    return [*onehot, *logs, family, math.log(max(linear_ms, MIN_FLOOR_MS))]


def profiler_cost_ms(runs: Sequence[ProfiledRun]) -> float:
    """The profiler's cost per kernel left in the profiles, in ms: over the profiled models,
    (profiled sum - plain p50) = kernels * e - c with e, c >= 0 (c: what a plain inference spends outside
    its kernels), each model weighted by 1/sqrt(its p50) so the big ones do not decide alone."""
    from scipy.optimize import nnls

    X = np.asarray([[float(len(r.kernels)), -1.0] for r in runs])
    y = np.asarray([sum(ms for _, ms in r.kernels) - r.latency_ms for r in runs])
    w = 1.0 / np.sqrt(np.maximum([r.latency_ms for r in runs], 1e-4))
    coef, _ = nnls(X * w[:, None], y * w)
    return float(coef[0])


def without_profiler_cost(run: ProfiledRun, per_kernel_ms: float) -> ProfiledRun:
    """The run's kernels less the profiler's cost per kernel, then, where they still add up to more than
    the plain inference took, scaled down to its p50: kernels cannot take longer than the whole inference,
    and what a profiler adds is not one constant (MNN's per-op callbacks leave small cache-resident kernels
    1.5-2.7x their share of the plain p50 here, while its big ones keep theirs: a single-GEMV sample read
    0.034 ms profiled against 0.013 ms plain). A sum below the p50 is kept (the rest is the overhead)."""
    kernels = [(k, max(ms - per_kernel_ms, ms * PROFILED_SHARE_KEPT)) for k, ms in run.kernels]
    total = sum(ms for _, ms in kernels)
    scale = min(1.0, run.latency_ms / total) if total > 0 else 1.0
    return replace(run, kernels=tuple((k, ms * scale) for k, ms in kernels))


@dataclass(frozen=True)
class KernelCalibration:
    """Per-kind kernel costs and the per-inference overhead of one target.

    A kernel's time is its kind's linear estimate times a non-linear correction learned (a random forest,
    as nn-Meter's kernel predictors) on the log ratio of profiled time to that estimate: the linear part
    carries a kernel to sizes the calibration did not see, the forest what efficiency a shape reaches."""

    per_kind: dict[str, tuple[float, ...]]
    pooled: tuple[float, ...]
    overhead_ms: float
    models: tuple[str, ...]
    scale: float = 1.0  # a model's kernels together against their calibrated sum (`fit_scale_and_overhead`)
    correction: Any = None  # a fitted regressor on _shape_row, or None (linear only)
    runtime: str | None = None
    profiler_ms_per_kernel: float = 0.0  # taken off every profiled kernel before the fit
    memory: MemoryCurve = MemoryCurve()

    def linear_ms(self, k: Kernel, context: Context) -> float:
        coef = self.per_kind.get(fit_key(k, self.runtime), self.per_kind.get(k.kind, self.pooled))
        return float(np.dot(coef, _row(k, context, self.memory)))

    def kernel_ms(self, k: Kernel, context: Context | None = None) -> float:
        return self.kernels_each_ms([k], context)[0]

    def kernels_each_ms(self, kernels: Sequence[Kernel], context: Context | None = None) -> list[float]:
        """Each kernel's time inside the model made of `kernels` (or of the given context)."""
        context = _context(kernels) if context is None else context
        linear = [self.linear_ms(k, context) for k in kernels]
        if self.correction is None or not kernels:
            return linear
        repeats = repeats_before(kernels)
        rows = np.asarray(
            [
                _shape_row(k, ms, context, self.runtime, n)
                for k, ms, n in zip(kernels, linear, repeats, strict=True)
            ]
        )
        factor = np.exp(self.correction.predict(rows))
        return [
            float(max(ms, MIN_FLOOR_MS) * (1.0 if _uncorrected(k) else f))
            for k, ms, f in zip(kernels, linear, factor, strict=True)
        ]

    def kernels_ms(self, kernels: Iterable[Kernel]) -> float:
        return sum(self.kernels_each_ms(list(kernels)))

    def latency_ms(self, kernels: Iterable[Kernel]) -> float:
        return self.scale * self.kernels_ms(kernels) + self.overhead_ms


def _uncorrected(k: Kernel) -> bool:
    """Kernels the correction leaves at their linear estimate: MNN's unary ops after whole GEMM tiles run
    on one law of their own (1.5 ns per element here, sample to sample), and the forest, trained on the
    other element-wise ops, lent them their efficiency (PP-OCR cls's ten: +15% over their profiled time)."""
    return k.reads_gemm_tiles


def _fit_correction(runs: Sequence[ProfiledRun], partial: KernelCalibration) -> Any:
    """A random forest on log(profiled / linear estimate) over every profiled kernel (None without
    scikit-learn's forest or with too few kernels)."""
    rows, target = [], []
    for run in runs:
        kernels = [k for k, _ in run.kernels]
        context = _context(kernels)
        for (k, ms), repeat in zip(run.kernels, repeats_before(kernels), strict=True):
            if ms <= 0 or _uncorrected(k):
                continue
            linear = partial.linear_ms(k, context)
            rows.append(_shape_row(k, linear, context, partial.runtime, repeat))
            target.append(math.log(ms / max(linear, MIN_FLOOR_MS)))
    if len(rows) < 20:
        return None
    from sklearn.ensemble import RandomForestRegressor  # lazily: costs a second of every CLI start

    trees = FOREST_TREES if len(rows) >= FOREST_FULL_ROWS else FOREST_SMALL_TREES
    forest = RandomForestRegressor(n_estimators=trees, min_samples_leaf=3, max_features=0.5, random_state=0)
    return forest.fit(np.asarray(rows), np.asarray(target))


def calibrate(
    runs: Sequence[ProfiledRun],
    graphs: Mapping[tuple[str, str], Sequence[Kernel]] | None = None,
    memory: MemoryCurve = MemoryCurve(),
) -> KernelCalibration | None:
    """Fit kernel costs on every profiled kernel, then the in-model scale and overhead on the models' p50s.

    `graphs` maps (model, shapes) to the model's graph kernels: where given, scale and overhead are fitted
    on their sums (as a prediction will use them), else on the profiled kernels'. `memory`: the target's
    sweep."""
    if len({r.model for r in runs}) < 2:
        return None
    estimates = kernel_rules(runs[0].runtime or "onnxruntime").estimates_profiler_cost
    profiler_ms = profiler_cost_ms(runs) if estimates else 0.0
    runs = [without_profiler_cost(r, profiler_ms) for r in runs]
    by_kind: dict[str, tuple[list[list[float]], list[float]]] = defaultdict(lambda: ([], []))
    for run in runs:
        context = _context([k for k, _ in run.kernels])
        for k, ms in run.kernels:
            rows, ys = by_kind[fit_key(k, run.runtime)]
            rows.append(_row(k, context, memory))
            ys.append(ms)
    all_rows = [row for rows, _ in by_kind.values() for row in rows]
    all_ms = [y for _, ys in by_kind.values() for y in ys]
    pooled = tuple(_fit(all_rows, all_ms))
    per_kind = {
        kind: tuple(_fit(rows, ys)) for kind, (rows, ys) in by_kind.items() if len(ys) >= MIN_KIND_KERNELS
    }
    linear = KernelCalibration(
        per_kind, pooled, 0.0, (), runtime=runs[0].runtime, profiler_ms_per_kernel=profiler_ms, memory=memory
    )
    partial = replace(linear, correction=_fit_correction(runs, linear))
    sums, lat = [], []
    for run in runs:
        kernels = (graphs or {}).get((run.model, run.shapes))
        sums.append(partial.kernels_ms(kernels if kernels is not None else [k for k, _ in run.kernels]))
        lat.append(run.latency_ms)
    scale, overhead = fit_scale_and_overhead(sums, lat)
    models = tuple(sorted({r.model for r in runs}))
    return replace(partial, overhead_ms=overhead, scale=scale, models=models)


def fit_scale_and_overhead(sums: Sequence[float], latencies: Sequence[float]) -> tuple[float, float]:
    """(s, c) of latency = s * kernel sum + c over the profiled models, both >= 0, by least squares on the
    *relative* error (each model's residual over its latency): in milliseconds, what a 100 ms model's
    kernels miss would set the overhead of a 0.1 ms one. c is what a plain inference spends outside its
    kernels (session, input copies); s how much slower kernels run inside a model than the calibration
    reads them. One more row holds s at 1 with the weight of one model: where the models are all of a
    size, s and c trade off and the data alone cannot tell them apart."""
    from scipy.optimize import nnls

    S, L = np.asarray(sums, float), np.asarray(latencies, float)
    rows = np.vstack([np.c_[S / L, 1.0 / L], [SCALE_PRIOR, 0.0]])
    coef, _ = nnls(rows, np.r_[np.ones_like(L), SCALE_PRIOR])
    return float(coef[0]), float(coef[1])


@dataclass(frozen=True)
class HeldOut:
    """One profiled model predicted from its graph by a calibration that never saw it (as a new model is
    predicted); `speed`: how slow the device ran beside this model's own profile, as its speed references
    saw it (against their median, 1.0 without them), a diagnostic only (see `cross_validate`)."""

    run: ProfiledRun
    predicted_ms: float
    speed: float = 1.0

    @property
    def ratio(self) -> float:
        """measured / predicted: what a new model's interval must cover."""
        return self.run.latency_ms / self.predicted_ms

    @property
    def predicted_at_speed_ms(self) -> float:
        """The prediction scaled by the speed the references saw beside this model's measurement."""
        return self.predicted_ms * self.speed


def cross_validate(
    runs: Sequence[ProfiledRun],
    graphs: Mapping[tuple[str, str], Sequence[Kernel]],
    memory: MemoryCurve = MemoryCurve(),
) -> list[HeldOut]:
    """Leave one model out (at every shape it was profiled at); predict each of its shapes from its graph.
    Kernel samples are calibration data: always trained on, never held out. Calibrations are fitted on
    the profiles as measured, not rescaled by their speed references: the references' sub-second blocks
    catch this host's speed at another moment than the model's rounds, and rescaling by them lowered the
    held-out share within +-10% over nine stored passes here (onnxruntime 52 -> 48%, MNN 56 -> 43%)."""
    from ..models.kernel_samples import is_kernel_sample

    factors = speed_factors(runs)
    out = []
    for model in sorted({r.model for r in runs if not is_kernel_sample(r.model)}):
        train = [r for r in runs if r.model != model]
        if len({r.model for r in train}) < MIN_MODELS - 1:
            continue
        cal = calibrate(train, graphs, memory)
        if cal is None:
            continue
        for run, factor in zip(runs, factors, strict=True):
            kernels = graphs.get((run.model, run.shapes))
            if run.model == model and kernels is not None:
                pred = cal.latency_ms(kernels)
                if pred > 0:
                    out.append(HeldOut(run, pred, factor))
    return out


@dataclass(frozen=True)
class KernelPrediction:
    """A predicted p50 latency with its interval (None: too few held-out models to bound it)."""

    p50_ms: float
    low_ms: float | None
    high_ms: float | None
    pairs: int
    coverage: float
    method: str = METHOD


def interval_ratios(held: Sequence[HeldOut], coverage: float) -> tuple[float, float] | None:
    """Split-conformal bounds on measured / predicted from held-out predictions (None with too few)."""
    return conformal_bounds([h.ratio for h in held], coverage)


def predict(
    runs: Sequence[ProfiledRun],
    graphs: Mapping[tuple[str, str], Sequence[Kernel]],
    kernels: Sequence[Kernel],
    coverage: float = 0.8,
    held: Sequence[HeldOut] | None = None,
    memory: MemoryCurve = MemoryCurve(),
) -> KernelPrediction | None:
    """p50 latency of a model (its graph `kernels`) on the target the `runs` were profiled on, with an
    interval from the target's leave-one-model-out residuals (`held`, computed when not given): a new
    model is measured at whatever speed the device runs then."""
    if len({r.model for r in runs}) < MIN_MODELS:
        return None
    cal = calibrate(runs, graphs, memory)
    if cal is None:
        return None
    p50 = cal.latency_ms(kernels)
    if p50 <= 0:
        return None
    held = cross_validate(runs, graphs, memory) if held is None else held
    bounds = interval_ratios(held, coverage)
    if bounds is None:
        return KernelPrediction(p50, None, None, len(held), coverage)
    return KernelPrediction(p50, p50 * bounds[0], p50 * bounds[1], len(held), coverage)


def _own_graph(read: Any, path: str, shapes: Mapping[str, Sequence[int]]) -> list[Kernel] | None:
    """A runtime's kernels read from its own converted graph; None where it cannot convert or run the
    model (then there is nothing to predict from, as for a model whose file is not here)."""
    from ..errors import ModelError

    try:
        kernels: list[Kernel] = read(Path(path), shapes)
    except ModelError:
        return None
    return kernels


def _sample_path(model: str) -> str | None:
    """A kernel sample's graph, rebuilt from its stored name (samples are generated, never user files)."""
    from ..models.kernel_samples import sample_key, sample_model

    key = sample_key(model)
    return str(sample_model(key)[1]) if key else None


class TargetPredictor:
    """Kernel-level predictions on every target that has profiles of enough models.

    `sources` maps a model name to its ONNX file: the graphs of new models and of profiled ones (for the
    cross-validation) are analysed from there at the shapes asked. A target is (device, runtime); its
    profiles are those at the thread count most models were profiled at (named in the evidence).
    `device_info` (the store's, fingerprint per device) gives each device's NCHWc block and GEMM tile
    (`Runtime.block`, `Runtime.gemm_tile`); a device without a fingerprint gets no NCHWc block and the
    runtime's `unknown_device_gemm_tile`."""

    def __init__(
        self,
        records: Iterable[Record],
        sources: Mapping[str, str],
        coverage: float = 0.8,
        device_info: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        self.sources = dict(sources)
        self.coverage = coverage
        self.fingerprints: dict[str, Mapping[str, Any]] = {
            info["device"]: info["fingerprint"]
            for info in device_info
            if isinstance(info.get("fingerprint"), Mapping) and info["fingerprint"].get("arch")
        }
        records = list(records)
        by_target: dict[tuple, list[ProfiledRun]] = defaultdict(list)
        for run in profiled_runs(records, self.fingerprints):
            by_target[run.target].append(run)
        self.runs: dict[tuple[str, str | None], list[ProfiledRun]] = {}
        for (device, runtime, _threads), runs in sorted(by_target.items(), key=lambda kv: str(kv[0])):
            best = self.runs.get((device, runtime))
            if best is None or len({r.model for r in runs}) > len({r.model for r in best}):
                self.runs[(device, runtime)] = runs
        # each target's kernels are charged at the bandwidths its device's sweep measured at its threads
        self.memory = {
            target: memory_curve(records, target[0], runs[0].threads) for target, runs in self.runs.items()
        }
        self._graphs: dict[tuple[str, str, str | None, int, int | None], list[Kernel] | None] = {}
        self._held: dict[tuple[str, str | None], list[HeldOut]] = {}

    def layout_block(self, device: str, runtime: str | None) -> int:
        """The runtime's NCHWc channel block on the device (1: none, or the device's ISA is not known)."""
        fingerprint = self.fingerprints.get(device)
        return runtime_named(runtime or "onnxruntime").block(fingerprint) if fingerprint else 1

    def gemm_tile(self, device: str, runtime: str | None) -> int | None:
        """The runtime's GEMM tile on the device, by its ISA (`_gemm_tile`)."""
        return _gemm_tile(runtime, self.fingerprints.get(device))

    def graph(self, model: str, shapes: str, runtime: str | None, device: str = "") -> list[Kernel] | None:
        """The model's kernels at `shapes` as `runtime` runs them on `device` (its NCHWc block, GEMM tile)."""
        block, tile = self.layout_block(device, runtime), self.gemm_tile(device, runtime)
        key = (model, shapes, runtime, block, tile)
        if key not in self._graphs:
            path = self.sources.get(model) or _sample_path(model)
            self._graphs[key] = None
            own = runtime_named(runtime or "onnxruntime").own_graph_kernels()
            if path is not None and str(path).lower().endswith(".onnx") and own is not None:
                self._graphs[key] = _own_graph(own, path, json.loads(shapes))
            elif path is not None and str(path).lower().endswith(".onnx"):
                from .cost import analyze, load_model
                from .kernels import graph_kernels

                cost = analyze(load_model(path), {k: list(v) for k, v in json.loads(shapes).items()})
                self._graphs[key] = graph_kernels(
                    cost, runtime or "onnxruntime", nchwc_block=block, gemm_tile=tile
                )
        return self._graphs[key]

    def _graphs_of(self, target: tuple[str, str | None]) -> dict[tuple[str, str], list[Kernel]]:
        out = {}
        for r in self.runs.get(target, []):
            g = self.graph(r.model, r.shapes, r.runtime, r.device)
            if g is not None:
                out[(r.model, r.shapes)] = g
        return out

    def held_out(self, target: tuple[str, str | None]) -> list[HeldOut]:
        if target not in self._held:
            self._held[target] = cross_validate(
                self.runs.get(target, []), self._graphs_of(target), self.memory.get(target, MemoryCurve())
            )
        return self._held[target]

    def speed_spans(self) -> dict[tuple[str, str | None], tuple[float, float]]:
        """Each target's `speed_span` over the profiles it predicts from (targets without one left out)."""
        spans = {target: speed_span(runs) for target, runs in self.runs.items()}
        return {target: span for target, span in spans.items() if span is not None}

    def predict(
        self, device: str, runtime: str | None, model: str, shapes: Mapping[str, Sequence[int]] | None
    ) -> KernelPrediction | None:
        """Point and interval of a model's p50 on a target, or None where the target has too few profiles
        or the model's graph is not at hand."""
        target = (device, runtime)
        runs = [r for r in self.runs.get(target, []) if r.model != model]
        kernels = self.graph(model, json.dumps(dict(shapes or {}), sort_keys=True), runtime, device)
        if not runs or kernels is None:
            return None
        held = [h for h in self.held_out(target) if h.run.model != model]
        memory = self.memory.get(target, MemoryCurve())
        pred = predict(runs, self._graphs_of(target), kernels, self.coverage, held=held, memory=memory)
        if pred is None:
            return None
        from ..models.kernel_samples import is_kernel_sample

        names = {r.model for r in runs}
        samples = sum(1 for m in names if is_kernel_sample(m))
        profiled = f"{len(names) - samples} profiled models" + (
            f" and {samples} kernel samples" if samples else ""
        )
        method = f"{METHOD}, {profiled} at {runs[0].threads or 'default'} threads"
        return replace(pred, method=method)


__all__ = [
    "HeldOut",
    "KernelPredictor",
    "KernelCalibration",
    "KernelPrediction",
    "METHOD",
    "ProfiledRun",
    "TargetPredictor",
    "calibrate",
    "cross_validate",
    "fit_scale_and_overhead",
    "interval_ratios",
    "predict",
    "profiled_runs",
    "profiler_cost_ms",
    "speed_factors",
    "speed_span",
]


class KernelPredictor:
    """The per-kernel predictor behind fit's `Predictor` interface: a model's p50 on a profiled target with
    its conformal interval, where the target's held-out profiles give one (elsewhere: None, and fit asks
    the whole-model predictor); `devices` limits the held-out targets."""

    name = KERNEL_PREDICTOR

    def __init__(self, targets: TargetPredictor, devices: Sequence[str] | None = None) -> None:
        self.targets = targets
        self.devices = devices

    def predict(
        self, target: tuple[str, str | None], model: str, counts: ModelCounts, stats: Sequence[str]
    ) -> dict[str, Prediction] | None:
        kp = self.targets.predict(target[0], target[1], model, counts.shapes)
        if kp is None or kp.low_ms is None or kp.high_ms is None:
            return None
        evidence = (
            f"{kp.method}; p50 {kp.coverage:.0%} interval {kp.low_ms:.4g}-{kp.high_ms:.4g} ms "
            f"from {kp.pairs} held-out profiles"
        )
        return {f"{LATENCY}:p50": Prediction(kp.p50_ms, (kp.low_ms, kp.high_ms), evidence)}

    def held_out(self) -> list[CvPoint]:
        """Every profiled target's leave-one-model-out predictions (`TargetPredictor.held_out`)."""
        out = []
        for target in sorted(self.targets.runs, key=lambda t: (t[0], t[1] or "")):
            if self.devices and target[0] not in self.devices:
                continue
            for h in self.targets.held_out(target):
                r = h.run
                out.append(
                    CvPoint(
                        r.device,
                        r.runtime,
                        r.model,
                        "model",
                        "latency_p50_ms",
                        r.latency_ms,
                        h.predicted_ms,
                        KERNEL_PREDICTOR,
                        r.shapes,
                        r.threads,
                    )
                )
        return out
