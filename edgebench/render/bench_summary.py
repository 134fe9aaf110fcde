"""The few lines a person reads after `edgebench bench`, as hyperfine and `benchmark_model` print them.

Pure: one bench's records and raw samples in, text out.

    Benchmark 1: mlp on local (onnxruntime, threads=2)
      Time (mean ± σ):      0.682 ms ±  0.031 ms    [p50 0.676 ms, p99 0.801 ms]
      Range (min … max):    0.640 ms …  0.912 ms    312 runs    [peak memory 113 MB, model 41 MB, load 12 ms]

and, with several models benched in one call, how each compares with the fastest (by p50):

    Summary
      mlp-int8 on local (onnxruntime) ran
        1.62 times faster than mlp on local (onnxruntime)    [ratio of p50s, 95% CI 1.55-1.70]

The ratio is of the medians, which a busy device's few slow runs barely move (a ratio of means with
hyperfine's σ read "4.39 ± 6.91 times faster" on the shared test host); its confidence interval is a
percentile bootstrap over both sides' samples, seeded, so the same samples print the same interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..analysis.variants import CI_LEVEL, p50_ratio
from ..records import Record, Samples


@dataclass(frozen=True)
class BenchSummary:
    """One bench: who, and its latency statistics from the kept samples."""

    label: str  # model on device (runtime, identity params)
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    n: int
    p50_ms: float | None
    p99_ms: float | None
    peak_rss_mb: float | None
    load_ms: float | None
    samples: tuple[float, ...] = field(default=(), repr=False)  # the latencies, for the p50 ratio's interval
    model_memory_mb: float | None = None  # what the model adds over the process before its load

    def to_dict(self) -> dict[str, Any]:
        """The summary for `--json` (the samples are in the records' store, not repeated here)."""
        return {k: v for k, v in asdict(self).items() if k != "samples"}


def summarize_bench(records: Sequence[Record], samples: Sequence[Samples]) -> BenchSummary | None:
    """The summary of one bench job (None when it left no latency samples)."""
    series = [s for s in samples if s.metric == "latency_ms" and s.values]
    if not series:
        return None
    s = series[0]
    x = np.asarray(s.values, dtype=float)

    def value(metric: str, stat: str | None = None) -> float | None:
        for r in records:
            if r.metric == metric and r.params.get("stat") == stat and r.value is not None:
                return float(r.value)
        return None

    detail = ", ".join(
        [s.runtime or "-", *[_param(k, v) for k, v in sorted(s.params.items()) if k != "stat"]]
    )
    return BenchSummary(
        label=f"{s.model} on {s.device} ({detail})",
        mean_ms=float(x.mean()),
        std_ms=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        min_ms=float(x.min()),
        max_ms=float(x.max()),
        n=int(x.size),
        p50_ms=value("latency_ms", "p50"),
        p99_ms=value("latency_ms", "p99"),
        peak_rss_mb=value("peak_rss_mb"),
        load_ms=value("load_ms"),
        samples=tuple(float(v) for v in x),
        model_memory_mb=value("model_memory_mb"),
    )


def _param(name: str, value: object) -> str:
    if name == "shapes" and isinstance(value, dict):  # {"x": [1, 1024]} -> x=1x1024
        return "shapes " + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in value.items())
    return f"{name}={value}"


def _ms(v: float | None, width: int = 7) -> str:
    if v is None:
        return "n/a".rjust(width)
    return f"{v:{width}.4g} ms" if v >= 0.001 else f"{v * 1e3:{width}.4g} µs"


def summary_lines(index: int, s: BenchSummary) -> list[str]:
    """hyperfine's three lines: the benchmark, mean ± σ with p50/p99, range with runs and memory."""
    p99 = _ms(s.p99_ms, 0) if s.p99_ms is not None else "n/a (under 100 runs)"
    extra = [f"peak memory {s.peak_rss_mb:.4g} MB" if s.peak_rss_mb is not None else None]
    extra.append(f"model {s.model_memory_mb:.4g} MB" if s.model_memory_mb is not None else None)
    extra.append(f"load {_ms(s.load_ms, 0)}" if s.load_ms is not None else None)
    tail = ", ".join(e for e in extra if e)
    return [
        f"Benchmark {index}: {s.label}",
        f"  Time (mean ± σ):     {_ms(s.mean_ms)} ± {_ms(s.std_ms)}    [p50 {_ms(s.p50_ms, 0)}, p99 {p99}]",
        f"  Range (min … max):   {_ms(s.min_ms)} … {_ms(s.max_ms)}    {s.n} runs"
        + (f"    [{tail}]" if tail else ""),
    ]


@dataclass(frozen=True)
class Speedup:
    """How many times faster the fastest bench ran than another: the ratio of their p50s, with a
    percentile-bootstrap confidence interval over both sides' samples (edgebench.analysis.variants)."""

    ratio: float
    low: float | None
    high: float | None
    slower: str


def _p50(s: BenchSummary) -> float:
    return float(np.median(s.samples)) if s.samples else (s.p50_ms or s.mean_ms)


def speedups(summaries: Sequence[BenchSummary]) -> tuple[BenchSummary, list[Speedup]]:
    """The fastest bench (by p50) and each other one's p50 ratio to it."""
    fastest = min(summaries, key=_p50)
    out = []
    for s in summaries:
        if s is fastest:
            continue
        if s.samples and fastest.samples:
            ratio, lo, hi = p50_ratio(s.samples, fastest.samples)
            out.append(Speedup(ratio, lo, hi, s.label))
        else:
            out.append(Speedup(_p50(s) / _p50(fastest), None, None, s.label))
    return fastest, sorted(out, key=lambda x: x.ratio)


def comparison_lines(summaries: Sequence[BenchSummary]) -> list[str]:
    """The closing summary: "B ran 1.62 times faster than A  [ratio of p50s, 95% CI 1.55-1.70]" (empty
    for one bench); an interval reaching 1 says the two are not distinguishable."""
    if len(summaries) < 2:
        return []
    fastest, others = speedups(summaries)
    lines = ["Summary", f"  {fastest.label} ran"]
    for x in others:
        if x.low is None or x.high is None:
            ci = "ratio of p50s, no samples for an interval"
        else:
            ci = f"ratio of p50s, {CI_LEVEL:.0%} CI {x.low:.3g}-{x.high:.3g}"
            if x.low <= 1.0:
                ci += ": not distinguishably faster"
        lines.append(f"    {x.ratio:.3g} times faster than {x.slower}    [{ci}]")
    return lines
