"""The few lines a person reads after `edgebench bench`, as hyperfine and `benchmark_model` print them.

Pure: one bench's records and raw samples in, text out.

    Benchmark 1: mlp on local (onnxruntime, threads=2)
      Time (mean ± σ):      0.682 ms ±  0.031 ms    [p50 0.676 ms, p99 0.801 ms]
      Range (min … max):    0.640 ms …  0.912 ms    312 runs    [peak memory 113.4 MB, load 12.3 ms]

and, with several models benched in one call, how each compares with the fastest:

    Summary
      mlp-int8 on local (onnxruntime) ran
        1.62 ± 0.08 times faster than mlp on local (onnxruntime)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    """How many times faster the fastest bench ran than another, with hyperfine's error propagation
    (the ratio of means, σ from both relative standard deviations)."""

    ratio: float
    std: float
    slower: str


def speedups(summaries: Sequence[BenchSummary]) -> tuple[BenchSummary, list[Speedup]]:
    """The fastest bench (by mean) and each other one's ratio to it."""
    fastest = min(summaries, key=lambda s: s.mean_ms)
    out = []
    for s in summaries:
        if s is fastest:
            continue
        ratio = s.mean_ms / fastest.mean_ms
        rel = math.hypot(s.std_ms / s.mean_ms, fastest.std_ms / fastest.mean_ms)
        out.append(Speedup(ratio, ratio * rel, s.label))
    return fastest, sorted(out, key=lambda x: x.ratio)


def comparison_lines(summaries: Sequence[BenchSummary]) -> list[str]:
    """hyperfine's closing summary: "B ran 1.62 ± 0.08 times faster than A" (empty for one bench)."""
    if len(summaries) < 2:
        return []
    fastest, others = speedups(summaries)
    lines = ["Summary", f"  {fastest.label} ran"]
    lines += [f"    {x.ratio:.2f} ± {x.std:.2f} times faster than {x.slower}" for x in others]
    return lines
