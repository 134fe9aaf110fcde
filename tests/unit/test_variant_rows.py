"""Variants as the answer: each variant against its fp32 reference (speed-up with an interval, size,
accuracy, verdict), in fit and in the report's Variants section, from stored records and samples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from edgebench.analysis import budgets as budget_defs
from edgebench.analysis import fit, fit_result
from edgebench.analysis.variants import p50_ratio, references, speedup_text
from edgebench.records import Record, Samples
from edgebench.render.report import frames


def benched(model: str, median: float, n: int, seed: int, size: int) -> tuple[list[Record], Samples]:
    rng = np.random.default_rng(seed)
    x = median * (1 + 0.04 * rng.standard_normal(n))
    x[rng.choice(n, n // 25, replace=False)] += 4.0  # ticks: the mean is off, the median is not
    p = {"threads": 1}
    recs = [
        Record("r1", "phone", "bench", model, "onnxruntime", "latency_ms", float(np.percentile(x, q)), "ms",
               {**p, "stat": s})
        for s, q in (("p50", 50), ("p90", 90), ("p99", 99), ("min", 0), ("max", 100))
    ]  # fmt: skip
    recs.append(
        Record("r1", "phone", "bench", model, "onnxruntime", "load_ms", 5.0, "ms", p, annotations={"model_bytes": size})
    )  # fmt: skip
    recs.append(
        Record("r1", "phone", "bench", model, "onnxruntime", "model_memory_mb", size / 1e6 + 20, "MB", p)
    )
    return recs, Samples("r1", "phone", "bench", model, "onnxruntime", "latency_ms", "ms", tuple(x), p)


def accuracy(variant: str, reference: str, cosine: float, snr: float, **extra: float) -> list[Record]:
    p = {"variant": variant, "reference": reference, "output": "y"}
    out = [
        Record("r2", "phone", "accuracy", variant, "onnxruntime", "cosine", cosine, "ratio", p),
        Record("r2", "phone", "accuracy", variant, "onnxruntime", "snr_db", snr, "dB", p),
    ]
    out += [
        Record("r2", "phone", "accuracy", variant, "onnxruntime", k, v, "ratio", p) for k, v in extra.items()
    ]
    return out


@pytest.fixture
def store() -> tuple[list[Record], list[Samples]]:
    fp32, s1 = benched("enc", 2.1, 400, 1, 8_000_000)
    int8, s2 = benched("enc.int8-dynamic", 0.7, 800, 2, 2_000_000)
    other, s3 = benched("enc-fp16", 1.4, 400, 3, 4_000_000)
    records = (
        fp32 + int8 + other + accuracy("enc.int8-dynamic", "enc", 0.9998, 34.0, task_top1_agreement=0.99)
    )
    return records, [s1, s2, s3]


def test_variants_pair_with_their_reference_by_name_and_by_accuracy() -> None:
    recs = accuracy("q.onnx-model", "base", 0.99, 20.0)
    pairs = references(recs, ["mlp", "mlp.int8-dynamic", "enc", "enc-int8", "base", "enc.r1"])
    assert pairs["mlp.int8-dynamic"] == ("mlp", "int8-dynamic") and pairs["enc-int8"] == ("enc", "int8")
    assert pairs["q.onnx-model"] == ("base", "")
    assert "mlp" not in pairs and "enc.r1" not in pairs


def test_rows_give_speedup_interval_size_accuracy_and_verdict(store: tuple) -> None:
    records, samples = store
    result = fit.assess(
        records, budget_defs.parse_budgets(["latency_p50_ms=1", "memory_mb=40"]), samples=samples
    )
    rows = {r.variant: r for r in result.variants}
    int8 = rows["enc.int8-dynamic"]
    by_name = {s.model: s.values for s in samples}
    ratio, lo, hi = p50_ratio(by_name["enc"], by_name["enc.int8-dynamic"])
    assert int8.reference == "enc" and int8.speedup == ratio == pytest.approx(
        np.median(by_name["enc"]) / np.median(by_name["enc.int8-dynamic"])  # the reference: numpy's medians
    )
    assert lo < 3.0 < hi and hi - lo < 0.2  # true ratio 2.1 / 0.7
    assert int8.size_ratio == 0.25 and int8.cosine == 0.9998 and int8.snr_db == 34.0
    assert int8.task == {"task_top1_agreement": 0.99} and int8.verdict == fit_result.FITS
    assert "x faster (95% CI" in int8.describe() and "0.25x size" in int8.describe()
    assert rows["enc-fp16"].verdict == fit_result.NO_FIT and rows["enc-fp16"].cosine is None
    assert "enc" not in rows
    [rec] = [
        r for r in result.to_records("f") if r.metric == "variant_speedup" and r.model == "enc.int8-dynamic"
    ]
    assert rec.value == ratio and rec.params == {"reference": "enc"} and rec.annotations["size_ratio"] == 0.25


def test_the_reports_variants_section_is_not_empty(store: tuple) -> None:
    records, samples = store
    matrix = frames.bench_matrix(records, samples)
    table = frames.variants(records, matrix, pd.DataFrame(), samples)
    row = table[table["model"] == "enc.int8-dynamic"].iloc[0]
    assert row["source"] == "enc" and row["variant"] == "int8-dynamic" and row["size_ratio"] == 0.25
    assert row["speedup_low"] < 3.0 < row["speedup_high"] and row["cosine"] == 0.9998
    assert speedup_text(row["speedup"], row["speedup_low"], row["speedup_high"]).startswith("3")
    assert set(table["model"]) == {"enc.int8-dynamic", "enc-fp16"}
