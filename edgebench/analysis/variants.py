"""Variants as the answer: each variant (fp16, int8, MNN ...) of a model against its fp32 reference.

A variant's reference is, in this order: the `source` its `edgebench variants` records name, the
`reference` of its `accuracy` records, or its name without a variant suffix when the store holds that model
(`mlp.int8-dynamic` -> `mlp`, `enc-int8` -> `enc`, `mlp.fp32` (MNN) -> `mlp`). One row per variant and
device it was benched on:

- the p50 speed-up (reference p50 / variant p50, each at its best measured configuration on that device)
  with a CI_LEVEL percentile-bootstrap interval over both sides' kept samples (each side resampled on its
  own, seeded);
- the size ratio in file bytes (from the `variants` records, or the `model_bytes` a bench records);
- accuracy against the reference: the worst cosine and SNR over the outputs (`accuracy` records on that
  device), and any task-level metric the accuracy records carry (params `task`, or metrics `task_*`);
- the fit verdict under the budgets, where one is given.

Pure: records and samples in, rows out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..records import Record, Samples

BOOTSTRAP = 2000  # resamples of each side
CI_LEVEL = 0.95
SEED = 0
# How variant files are named: edgebench's own suffixes, and the usual `-int8` / `_fp16` ones.
_SUFFIX = re.compile(
    r"^(?P<ref>.+?)[._-](?P<kind>fp16|fp32|bf16|int8(?:-dynamic|-static|-weight)?|int4|uint8|q8|q4|quant(?:ized)?)$"
)
OUTPUT_METRICS = ("max_abs_err", "mean_abs_err", "cosine", "snr_db")


def p50_ratio(slow: Sequence[float], fast: Sequence[float], seed: int = SEED) -> tuple[float, float, float]:
    """median(slow) / median(fast) and its CI_LEVEL bootstrap interval (each side resampled on its own)."""
    a, b = np.asarray(slow, dtype=float), np.asarray(fast, dtype=float)
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, size=(BOOTSTRAP, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, size=(BOOTSTRAP, b.size))], axis=1)
    tail = (1 - CI_LEVEL) / 2 * 100
    lo, hi = np.percentile(ma / mb, [tail, 100 - tail])
    return float(np.median(a) / np.median(b)), float(lo), float(hi)


@dataclass(frozen=True)
class VariantRow:
    """One variant on one device against its fp32 reference."""

    device: str
    variant: str  # the variant's model name (e.g. mlp.int8-dynamic)
    reference: str  # its fp32 reference's model name
    kind: str  # int8-dynamic, fp16, mnn-int8 ... ("" when unknown)
    runtime: str | None
    reference_runtime: str | None = None
    p50_ms: float | None = None
    reference_p50_ms: float | None = None
    speedup: float | None = None  # reference p50 / variant p50: 3.3 = 3.3x faster
    speedup_low: float | None = None
    speedup_high: float | None = None
    size_bytes: int | None = None
    reference_bytes: int | None = None
    cosine: float | None = None  # worst over the outputs
    snr_db: float | None = None
    task: dict[str, float] = field(default_factory=dict)  # task-level accuracy, where given
    verdict: str = ""

    @property
    def size_ratio(self) -> float | None:
        """Variant bytes / reference bytes (0.25 = a quarter of the size)."""
        if self.size_bytes and self.reference_bytes:
            return self.size_bytes / self.reference_bytes
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "size_ratio": self.size_ratio}

    def describe(self) -> str:
        """One line: "3.3x faster (95% CI 3.2-3.4), 0.25x size, cosine 0.9998, fits"."""
        parts = []
        if self.speedup is not None:
            ci = (
                f" ({CI_LEVEL:.0%} CI {self.speedup_low:.3g}-{self.speedup_high:.3g})"
                if self.speedup_low is not None and self.speedup_high is not None
                else ""
            )
            parts.append(f"{self.speedup:.3g}x faster{ci}")
        if self.size_ratio is not None:
            parts.append(f"{self.size_ratio:.2g}x size")
        if self.cosine is not None:
            parts.append(f"cosine {self.cosine:.6g}")
        if self.snr_db is not None:
            parts.append(f"SNR {self.snr_db:.3g} dB")
        parts += [f"{k} {v:.4g}" for k, v in sorted(self.task.items())]
        if self.verdict:
            parts.append(self.verdict)
        return ", ".join(parts) or "not benched"


def speedup_text(speedup: float | None, low: float | None = None, high: float | None = None) -> str:
    """ "3.14x [3.12-3.16]" (the interval when there is one), "–" without a speed-up."""
    if speedup is None or speedup != speedup:
        return "–"
    ci = f" [{low:.3g}-{high:.3g}]" if low is not None and high is not None and low == low else ""
    return f"{speedup:.3g}x{ci}"


def references(records: Iterable[Record], names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """variant name -> (its reference's name, its kind) for every variant the records or names reveal.

    `names` are the models benched; an accuracy record's reference counts first when it is one of them
    (a built-in reference's file stem, `mlp.r1`, is not the `mlp` the bench stored)."""
    records = list(records)
    benched = set(names)
    known = benched | {r.model for r in records if r.model}
    out: dict[str, tuple[str, str]] = {}
    for r in records:  # `edgebench variants`: the source is named
        if r.probe == "variants" and r.model and r.params.get("source") and r.model != r.params["source"]:
            out.setdefault(r.model, (str(r.params["source"]), str(r.params.get("variant", ""))))
    checked = {  # `edgebench accuracy VARIANT --reference MODEL`
        str(r.params["variant"]): str(r.params["reference"])
        for r in records
        if r.probe == "accuracy" and r.params.get("variant") and r.params.get("reference")
    }
    for variant, ref in checked.items():
        if variant != ref and ref in benched:
            out.setdefault(variant, (ref, ""))
    for name in sorted(known | set(checked)):  # by name: the store holds the model without the suffix
        m = _SUFFIX.match(name)
        if name not in out and m and m.group("ref") in known and m.group("ref") != name:
            out[name] = (m.group("ref"), m.group("kind"))
    for variant, ref in checked.items():
        if variant != ref:
            out.setdefault(variant, (ref, ""))
    return out


def variant_rows(
    records: Sequence[Record],
    samples: Sequence[Samples],
    observations: Sequence[Any],
    verdicts: Mapping[tuple[str, str], str] | None = None,
) -> list[VariantRow]:
    """One row per variant benched on a device where its reference was benched too, or whose accuracy
    against it was checked there. `observations` are fit's (edgebench.analysis.fit.observations); `verdicts`
    maps (device, model) to fit's verdict."""
    verdicts = verdicts or {}
    # per (device, model) the best (lowest p50) observation: sorted slowest first, so the best is kept
    obs: dict[tuple[str, str], Any] = {}
    for o in sorted(observations, key=lambda o: -o.latency.get("p50", math.inf)):
        obs[(o.device, o.model)] = o
    pairs = references(records, {o.model for o in observations})
    sizes = _file_bytes(records)
    accuracy = _accuracy(records)
    kept = {
        (s.run_id, s.device, s.runtime, s.model, _params_key(s.params)): s.values
        for s in samples
        if s.metric == "latency_ms" and s.probe in ("bench", "threads")
    }
    rows = []
    devices = sorted({d for d, _ in obs} | {d for d, _ in accuracy})
    for variant, (reference, kind) in sorted(pairs.items()):
        for device in devices:
            v, ref = obs.get((device, variant)), obs.get((device, reference))
            acc = accuracy.get((device, variant), {})
            if v is None and not acc:
                continue
            row: dict[str, Any] = {
                "device": device,
                "variant": variant,
                "reference": reference,
                "kind": kind,
                "runtime": v.runtime if v else None,
                "reference_runtime": ref.runtime if ref else None,
                "size_bytes": sizes.get(variant),
                "reference_bytes": sizes.get(reference),
                "cosine": acc.get("cosine"),
                "snr_db": acc.get("snr_db"),
                "task": {k: x for k, x in acc.items() if k not in ("cosine", "snr_db")},
                "verdict": verdicts.get((device, variant), ""),
            }
            if v is not None and ref is not None:
                row["p50_ms"], row["reference_p50_ms"] = v.latency["p50"], ref.latency["p50"]
                a, b = kept.get(_obs_key(ref)), kept.get(_obs_key(v))
                if a and b and len(a) >= 5 and len(b) >= 5:
                    row["speedup"], row["speedup_low"], row["speedup_high"] = p50_ratio(a, b)
                else:
                    row["speedup"] = ref.latency["p50"] / v.latency["p50"] if v.latency["p50"] else None
            elif v is not None:
                row["p50_ms"] = v.latency["p50"]
            rows.append(VariantRow(**row))
    return rows


def _params_key(params: Mapping[str, Any]) -> str:
    import json

    return json.dumps({k: v for k, v in params.items() if k != "stat"}, sort_keys=True, default=str)


def _obs_key(o: Any) -> tuple:
    return (o.run_id, o.device, o.runtime, o.model, _params_key(o.config))


def _file_bytes(records: Iterable[Record]) -> dict[str, int]:
    """Model name -> its file's bytes, from `variants` records or the `model_bytes` a bench annotated."""
    out: dict[str, int] = {}
    for r in records:
        if r.model is None:
            continue
        if r.probe == "variants" and r.metric == "size_bytes" and r.value:
            out[r.model] = int(r.value)
        elif r.annotations.get("model_bytes") and r.model not in out:
            out[r.model] = int(r.annotations["model_bytes"])
    return out


def _accuracy(records: Iterable[Record]) -> dict[tuple[str, str], dict[str, float]]:
    """(device, variant) -> the worst cosine and SNR over its outputs, and task-level metrics."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        if r.probe != "accuracy" or r.value is None or r.params.get("op") or r.metric.startswith("op_"):
            continue
        name = str(r.params.get("variant") or r.model or "")
        acc = out.setdefault((r.device, name), {})
        if r.metric in ("cosine", "snr_db"):
            acc[r.metric] = min(acc.get(r.metric, math.inf), float(r.value))
        elif r.metric.startswith("task_") or r.params.get("task"):
            key = f"{r.params['task']}:{r.metric}" if r.params.get("task") else r.metric
            acc[key] = float(r.value)
    return out
