"""Report renderers on records built here (every probe of DESIGN.md), and the report/fit CLI's bad input."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from edgebench.analysis.budgets import parse_budgets
from edgebench.records import Record, RecordContext, Samples, utc_now
from edgebench.render.report import format_for, render, write_report
from edgebench.render.report.data import ReportData
from edgebench.render.report.html import SECTIONS
from edgebench.results.store import RunInfo, Store

R1, R2 = "20260101T000000Z-aaaaaa", "20260102T000000Z-bbbbbb"


def rec(
    run: str,
    device: str,
    probe: str,
    model: str | None,
    metric: str,
    value: float,
    unit: str = "",
    runtime: str | None = "onnxruntime",
    /,
    **params: object,
) -> Record:
    return Record(run, device, probe, model, runtime, metric, value, unit, dict(params))


def bench(run: str, device: str, model: str, p50: float, rss: float, slow: float = 1.0) -> list[Record]:
    out = [
        rec(run, device, "bench", model, "latency_ms", v * slow, "ms", threads=2, stat=s)
        for s, v in {
            "p50": p50,
            "p90": p50 * 1.1,
            "p99": p50 * 1.3,
            "mean": p50 * 1.02,
            "min": p50 * 0.9,
            "max": p50 * 1.6,
        }.items()
    ]
    memory = rec(run, device, "bench", model, "peak_rss_mb", rss, "MB", threads=2)
    out.append(dataclasses.replace(memory, annotations={"rss_before_load_mb": 30.0}))
    # what memory_mb judges: the model's own memory
    out.append(rec(run, device, "bench", model, "model_memory_mb", rss, "MB", threads=2))
    out.append(rec(run, device, "bench", model, "load_ms", 20.0, "ms", threads=2))
    return out


def decode(run: str, device: str, model: str, ms_per_token: float, floor_ms: float) -> list[Record]:
    """A decode run's records: 64 prompt tokens, 32 new, its floor and efficiency."""
    seq = {"prompt_tokens": 64, "new_tokens": 32, "threads": 2}
    floor = dataclasses.replace(
        rec(run, device, "decode", model, "decode_floor_ms", floor_ms, "ms", **seq),
        annotations={"regime": "dram", "uncertain": False},
    )
    return [
        rec(run, device, "decode", model, "ttft_ms", 40.0, "ms", **seq, stat="p50"),
        rec(run, device, "decode", model, "prefill_tokens_per_s", 1600.0, "tokens/s", **seq),
        rec(run, device, "decode", model, "decode_ms_per_token", ms_per_token, "ms", **seq, stat="p50"),
        rec(run, device, "decode", model, "decode_tokens_per_s", 1e3 / ms_per_token, "tokens/s", **seq),
        rec(run, device, "decode", model, "kv_cache_mb", 3.0, "MB", **seq),
        rec(run, device, "decode", model, "peak_rss_mb", 300.0, "MB", **seq),
        floor,
        rec(run, device, "decode", model, "decode_efficiency", floor_ms / ms_per_token, "ratio", **seq),
    ]


def every_probe_records() -> tuple[list[Record], list[Samples]]:
    """Two runs on two devices with records of every probe the report knows."""
    recs: list[Record] = []
    samples: list[Samples] = []
    for run, slow in ((R1, 1.0), (R2, 1.2)):
        for device in ("phone", "board"):
            for model, p50, rss in (("enc", 4.0, 50.0), ("big", 30.0, 120.0)):
                recs += bench(run, device, model, p50 * (2 if device == "board" else 1), rss, slow)
                samples.append(
                    Samples(
                        run,
                        device,
                        "bench",
                        model,
                        "onnxruntime",
                        "latency_ms",
                        "ms",
                        tuple(p50 * slow * (1 + 0.01 * (i % 7)) for i in range(120)),
                        {"threads": 2},
                    )
                )
    for device, tops, bw in (("phone", 0.2, 20.0), ("board", 0.05, 8.0)):
        for dtype, scale in (("fp32", 1), ("int8", 3)):
            recs.append(
                rec(
                    R1,
                    device,
                    "matmul",
                    None,
                    "effective_tops",
                    tops * scale,
                    "TOPS",
                    None,
                    dtype=dtype,
                    backend="numpy",
                    n=1024,
                    threads=2,
                    stat="best",
                )
            )
            recs.append(
                rec(
                    R1,
                    device,
                    "matmul",
                    None,
                    "efficiency",
                    0.25,
                    "ratio",
                    None,
                    dtype=dtype,
                    backend="numpy",
                )
            )
        recs.append(
            rec(
                R1,
                device,
                "bandwidth",
                None,
                "bandwidth_gbps",
                bw,
                "GB/s",
                None,
                kernel="triad",
                threads=2,
                stat="best",
            )
        )
        for model, flops, wb in (("enc", 2e8, 3e6), ("big", 4e9, 8e7)):
            recs.append(rec(R1, device, "roofline", model, "flops", flops, "FLOP", None))
            recs.append(rec(R1, device, "roofline", model, "weight_bytes", wb, "B", None))
            recs.append(rec(R1, device, "roofline", model, "floor_ms", 1.0, "ms", None, bound="compute"))
            recs.append(
                rec(R1, device, "roofline", model, "efficiency", 0.25, "ratio", None, bound="compute")
            )
        for t, lat in ((1, 9.0), (2, 5.5), (4, 6.0)):
            recs.append(rec(R1, device, "threads", "enc", "latency_ms", lat, "ms", threads=t, stat="p50"))
        recs.append(rec(R1, device, "threads", "enc", "best_threads", 2, "threads"))
    for i in range(20):
        t = i * 15.0
        recs.append(
            rec(R1, "phone", "thermal", "enc", "latency_ms", 4.0 + (3.0 if t > 150 else 0), "ms", t_s=t)
        )
        recs.append(rec(R1, "phone", "thermal", "enc", "temp_c", 35 + t / 10, "C", t_s=t, zone="cpu"))
        recs.append(rec(R1, "phone", "thermal", "enc", "freq_mhz", 2400 if t <= 150 else 1600, "MHz", t_s=t))
    recs.append(rec(R1, "phone", "thermal", "enc", "throttle_onset_s", 150.0, "s"))
    recs.append(rec(R1, "phone", "thermal", "enc", "sustained_ratio", 0.57, "ratio"))
    recs.append(rec(R1, "phone", "thermal", "enc", "stability", 0.55, "ratio"))
    for i in range(10):
        recs.append(rec(R1, "phone", "power", "enc", "power_mw", 800 + 10 * i, "mW", t_s=i * 0.25))
    recs.append(rec(R1, "phone", "power", "enc", "power_mw", 850.0, "mW"))
    recs.append(rec(R1, "phone", "power", "enc", "energy_mj_per_inference", 3.4, "mJ"))
    samples.append(
        Samples(
            R1,
            "phone",
            "power",
            "enc",
            "onnxruntime",
            "power_mw",
            "mW",
            tuple(800.0 + i for i in range(50)),
            {},
        )
    )
    recs += decode(R1, "phone", "llm", 50.0, 40.0)
    for node, op, ms in (("conv1", "Conv", 1.5), ("mm1", "MatMul", 1.0), ("relu1", "Relu", 0.2)):
        recs.append(rec(R1, "phone", "profile", "enc", "op_time_ms", ms, "ms", node=node, op_type=op))
    for metric, v in (("cosine", 0.9999), ("max_abs_err", 0.002), ("snr_db", 48.0)):
        recs.append(rec(R1, "phone", "accuracy", "enc-int8", metric, v, "", output="y"))
    # enc on the phone's GPU: two of its ops fell back to the CPU (where it ran)
    placed = {
        "requested": "vulkan", "actual": "vulkan+cpu", "ops_by_unit": {"vulkan": 10, "cpu": 2}, "partitions": 5,
        "fallback_ops": ["mm1 (MatMul)", "mm2 (MatMul)"], "evidence": "support_vulkan", "precision": {"mode": "fp16"},
    }  # fmt: skip
    for metric, v in (("cosine", 0.9998), ("max_abs_err", 0.004)):
        r = rec(R1, "phone", "accuracy", "enc", metric, v, "", "ncnn", output="y", backend="vulkan")
        r.annotations["placement"] = placed
        recs.append(r)
    # The variants of enc (sizes), the int8 one benched, and enc's per-layer sensitivity.
    for name, variant, size, ratio in (
        ("enc", "fp32", 4_000_000, 1.0),
        ("enc-int8", "int8-static", 1_040_000, 0.26),
    ):
        for metric, v, unit in (("size_bytes", size, "B"), ("size_ratio", ratio, "ratio")):
            recs.append(rec(R1, "local", "variants", name, metric, v, unit, variant=variant, source="enc"))
    recs += bench(R1, "phone", "enc-int8", 2.5, 40.0)
    for rank, (node, cos) in enumerate((("conv1", 0.991), ("mm1", 0.9995)), 1):
        for metric, v, unit in (("cosine", cos, "ratio"), ("snr_db", 20.0 + rank, "dB")):
            r = rec(
                R1,
                "phone",
                "sensitivity",
                "enc",
                metric,
                v,
                unit,
                bits=8,
                node=node,
                op_type="Conv",
                weight="w",
            )
            recs.append(dataclasses.replace(r, annotations={"rank": rank}))
    recs.append(
        rec(
            R2,
            "phone",
            "history",
            "enc",
            "change_point",
            0.2,
            "ratio",
            series_probe="bench",
            series_metric="latency_ms",
            stat="p50",
            before=4.0,
            after=4.8,
            previous_run=R1,
            p_value=0.001,
            level_unit="ms",
        )
    )
    return recs, samples


def make_data(
    records: list[Record],
    samples: list[Samples] = (),
    errors: tuple = (),
    budgets: tuple = (),
    runs: tuple[str, ...] = (R1, R2),
    provenance: dict | None = None,
    fingerprint: dict | None = None,
    health: tuple[Record, ...] = (),
) -> ReportData:
    from edgebench.render.report.data import _fit_result

    run_infos = tuple(
        RunInfo(
            r,
            f"2026-01-0{i + 1}T00:00:00Z",
            "suite",
            "nightly",
            provenance
            or {
                "edgebench": "0.1.0",
                "git_commit": "abc123",
                "host": "lab1",
                "argv": ["run", "suites/nightly.toml"],
            },
            "ok",
            None,
        )
        for i, r in enumerate(runs)
    )
    devices = tuple(
        {
            "run_id": runs[0],
            "device": d,
            "fingerprint": fingerprint or {"arch": "aarch64", "cores": 8},
            "descriptor": {
                "name": d,
                "transport": "ssh",
                "soc": "X1",
                "spec": {"peak_tops": {"fp32": 0.8}, "memory_bandwidth_gbps": 25.0},
            },
        }
        for d in ("phone", "board")
    )
    fit, source, warnings = _fit_result(records, samples, devices, budgets, list(runs))
    jobs = tuple(
        {
            "run_id": run,
            "device": device,
            "probe": "bench",
            "model": "enc",
            "status": "ok",
            "warnings": ["3 of 120 samples are outliers (modified z-score > 10): the device was disturbed"]
            if device == "phone"
            else [],
        }
        for run in runs
        for device in sorted({r.device for r in records if r.run_id == run})
    )
    regression = None
    if len(runs) >= 2:  # the latest suite run against the previous one, as the report loads it
        from edgebench.analysis.gate import collect_side, default_rules, evaluate

        sides = [
            collect_side([r for r in records if r.run_id == run], [s for s in samples if s.run_id == run])
            for run in runs[-2:]
        ]
        regression = evaluate(
            *sides, default_rules(), baseline_run=runs[-2], candidate_run=runs[-1]
        ).to_dict()
    return ReportData(
        "test report",
        utc_now(),
        "lab.db",
        run_infos,
        jobs,
        devices,
        tuple(records),
        tuple(samples),
        tuple(errors),
        tuple(budgets),
        fit,
        source,
        tuple(warnings),
        health=tuple(health),
        health_order=tuple(runs),
        regression=regression,
        regression_source="computed for this test" if regression else "",
    )


def doctor_health(device: str, run_id: str) -> tuple[Record, ...]:
    """A device's doctor records as the probe makes them from an agent result (one runtime, noisy)."""
    from edgebench.probes.doctor import doctor_records
    from edgebench.probes.registry import DoctorParams

    result = {
        "timer": {"resolution_ns": 30.0},
        "runtimes": {
            "onnxruntime": {
                "harness_p50_ms": [1.01],
                "bare_p50_ms": [1.0],
                "noise_cv": [0.08],
                "robust_cv": [0.02],
                "runs": 50,
            }
        },  # fmt: skip
        "cpus": [{"cpu": 0, "governor": "schedutil", "cur_mhz": 1800.0}],
    }
    ctx = RecordContext(run_id, device, "doctor")
    return tuple(doctor_records(ctx, result, DoctorParams(), {"onnxruntime": "mlp", "mnn": "mlp"}).records)


class _Doc(HTMLParser):
    """Sections, figures, images and every URL-bearing attribute of an HTML document."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, str] = {}
        self.plots: list[str] = []
        self.images: list[str] = []
        self.urls: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "section":
            self.sections[a["id"] or ""] = a.get("data-state") or ""
        if tag == "figure" and a.get("data-plot"):
            self.plots.append(a["data-plot"] or "")
        if tag == "img":
            self.images.append(a.get("src") or "")
        for name in ("src", "href", "action", "poster", "data", "srcset", "xlink:href"):
            if a.get(name) is not None:
                self.urls.append((tag, name, a[name] or ""))


def parse(text: str) -> _Doc:
    doc = _Doc()
    doc.feed(text)
    return doc


def assert_self_contained(text: str) -> None:
    """No address anywhere, nothing fetched: only data: images and in-page anchors."""
    assert not re.search(r"https?:", text, re.I) and "//" not in re.sub(r"data:[^\"']+", "", text).replace(
        "<!DOCTYPE html>", ""
    )
    doc = parse(text)
    for tag, attr, url in doc.urls:
        assert url.startswith("data:image/png;base64,") or (tag == "a" and url.startswith("#")), (
            tag,
            attr,
            url,
        )
    assert not {"script", "link", "iframe", "object", "embed"} & doc.tags
    assert "@import" not in text and "url(" not in text


def workload_records() -> list[Record]:
    """One record set of each workload section: stream, cold load, soak, contention, per-op divergence."""

    def r(probe: str, metric: str, value: float, notes: dict | None = None, **params: object) -> Record:
        return Record(
            R2, "phone", probe, "enc", "onnxruntime", metric, value, "", dict(params), annotations=notes or {}
        )

    stream = {"stream": True, "frame_s": 0.032}
    out = [r("bench", "rtf", 0.3, stat=s, **stream) for s in ("p50", "p99", "mean")]
    out += [
        r("bench", "frame_latency_ms", 9.6, stat="p50", **stream),
        r("bench", "deadline_miss_ratio", 0.0, **stream),
    ]
    out.append(
        r(
            "bench",
            "load_ms",
            400.0,
            {
                "distinct": True,
                "eviction_verified": True,
                "warm_median_ms": 90.0,
                "cold_to_warm": 4.4,
                "slower_p_value": 0.004,
            },
            cache="cold",
        )
    )
    out += [r("soak", "rss_mb", 50.0 + t / 10, t_s=float(t)) for t in range(5)]
    out.append(
        r("soak", "rss_growth_mb_per_hour", 360.0, {"ci_low": 300.0, "ci_high": 420.0, "verdict": "leak"})
    )
    out += [
        r("contention", "latency_ms", v, stat="p50", threads=1, corunner_threads=n)
        for n, v in ((0, 5.0), (2, 8.0))
    ]
    out += [
        r("contention", "corunner_slowdown", 1.6, threads=1, corunner_threads=2, victim=v)
        for v in ("model", "corunner")
    ]
    op = {"variant": "enc-int8", "reference": "enc", "tolerance": 1e-3}
    out.append(r("accuracy", "first_divergent_op", 0.2, op="fc2", tensor="h2", **op))
    out.append(
        r(
            "accuracy",
            "op_rel_error",
            0.2,
            {"order": 3},
            op="fc2",
            tensor="h2",
            variant="enc-int8",
            reference="enc",
        )
    )
    return out


def test_every_section_and_plot_rendered_self_contained() -> None:
    recs, samples = every_probe_records()
    recs += workload_records()
    errors = (
        {
            "run_id": R2,
            "device": "board",
            "probe": "bench",
            "model": "huge",
            "kind": "lab",
            "error": "board: connection lost",
            "ts": utc_now(),
        },
    )
    budgets = parse_budgets(["latency_p99_ms=20", "memory_mb=100", "energy_mj=5"])
    text = render(make_data(recs, samples, errors, budgets, health=doctor_health("phone", R2)), "html")
    assert_self_contained(text)
    doc = parse(text)
    assert list(doc.sections) == [sid for sid, _, _ in SECTIONS]
    assert all(state == "data" for state in doc.sections.values()), doc.sections
    assert 'data-flagged="phone"' in text and "NOISY: onnxruntime" in text
    for name in (
        "ceilings-phone",
        "roofline-phone",
        "roofline-board",
        "threads-phone",
        "latency-phone",
        "latency-board",
        "thermal-phone-enc",
        "power-phone-enc",
        "ops-phone-enc",
        "fit-cv",
    ):
        assert name in doc.plots, (name, doc.plots)
    for src in doc.images:  # real PNGs, not placeholders
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
        assert b"matplotlib.org" not in png
    for needle in (
        "connection lost",
        "throttle_onset_s",
        "Conv",
        "0.9999",
        "bench:latency_ms[p50]",
        "+20.0%",
    ):
        assert needle in text, needle


def test_matrix_is_coloured_against_budgets() -> None:
    recs, samples = every_probe_records()
    text = render(
        make_data(recs, samples, budgets=parse_budgets(["latency_p99_ms=20", "memory_mb=100"])), "html"
    )
    matrix = text[text.index('id="fit"') : text.index('id="regressions"')]
    # enc on the phone: p99 6.24 ms (latest run) under 20 -> ok; big: 120 MB over 100 -> over
    assert re.search(r'class="q ok"[^>]*><span>p99</span><span>6\.24 ms', matrix)
    assert re.search(r'class="q over"[^>]*><span>mem</span><span>120 MB', matrix)
    assert (
        'data-verdict="does not fit"' in matrix and 'data-verdict="fits"' in matrix and "memory_mb" in matrix
    )
    assert "latency_p99_ms: 2.34x budget" in matrix  # big on the phone: p99 46.8 ms of 20, as a ratio


def test_sections_without_data_say_so() -> None:
    recs = bench(R1, "phone", "enc", 4.0, 50.0)
    text = render(make_data(recs, runs=(R1,)), "html")
    doc = parse(text)
    assert list(doc.sections) == [sid for sid, _, _ in SECTIONS]
    assert doc.sections["fit"] == "data" and doc.sections["summary"] == "data"
    for sid in (
        "regressions",
        "variants",
        "sensitivity",
        "ceilings",
        "threads",
        "latency",
        "thermal",
        "power",
        "ops",
        "accuracy",
        "history",
        "deltas",
        "errors",
    ):
        assert doc.sections[sid] == "empty", sid
    # Each empty section is one line with no heading: what was not measured and the command to run.
    empty = re.findall(
        r'<section id="(\w+)" data-section="\w+" data-state="empty">(.*?)</section>', text, re.S
    )
    assert len(empty) >= 13
    for sid, body in empty:
        assert "<h2>" not in body and body.count("<p") == 1, (sid, body)
        assert 'class="folded"' in body, (sid, body)
        if sid != "errors":  # no failed jobs is not a gap
            assert "Measure it: <code>edgebench " in body, (sid, body)
    thermal = dict(empty)["thermal"]
    assert "No thermal runs" in thermal and "edgebench probe thermal --model enc --device phone" in thermal
    assert_self_contained(text)


def test_no_secrets_and_no_addresses_from_stored_text() -> None:
    recs = bench(R1, "phone", "enc", 4.0, 50.0)
    prov = {"argv": ["run", "s.toml", "--password", "hunter2", "--token=abc123xyz"], "host": "lab1"}
    fp = {"arch": "x86_64", "api_token": "s3cr3t-fp", "build": "see https://example.invalid/build"}
    errors = (
        {
            "run_id": R1,
            "device": "phone",
            "probe": "bench",
            "model": "enc",
            "kind": "lab",
            "error": "fetch http://10.0.0.1/x failed",
            "ts": utc_now(),
        },
    )
    text = render(make_data(recs, errors=errors, runs=(R1,), provenance=prov, fingerprint=fp), "html")
    for secret in ("hunter2", "abc123xyz", "s3cr3t-fp"):
        assert secret not in text
    assert_self_contained(text)
    assert "10.0.0.1" in text  # the error itself is kept, its address defused


def test_markdown_summary() -> None:
    recs, samples = every_probe_records()
    data = make_data(recs, samples, budgets=parse_budgets(["latency_p99_ms=20", "memory_mb=100"]))
    md = render(data, "md")
    assert md.startswith("# test report")
    assert (
        "| verdict | device | model | runtime | p50 | p99 | peak memory | energy | limiting | basis |" in md
    )
    assert "120 MB ❌" in md and "## Which model fits which chip" in md
    # The answer first: fit, regressions, health; then the detail, accuracy among it.
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads[:3] == [
        "## Which model fits which chip",
        "## Regressions against the previous run",
        "## Device health",
    ]
    assert "## Accuracy" in heads and "## Variants" in heads and "0.999900" in md
    assert "## Changes between runs" in md and "+20.0%" in md
    assert "## Measured ceilings" in md and "<img" not in md


def test_decode_section_shows_tokens_per_s_with_the_floor_and_the_budget() -> None:
    recs = bench(R1, "phone", "enc", 4.0, 50.0) + decode(R1, "phone", "llm", 50.0, 40.0)
    recs += decode(R1, "board", "llm", 125.0, 100.0)
    data = make_data(recs, runs=(R1,), budgets=parse_budgets(["decode_tokens_per_s_min=15"]))
    doc = parse(render(data, "html"))
    assert doc.sections["decode"] == "data"
    html_text = render(data, "html")
    start = html_text.index('id="decode"')
    section = html_text[start : html_text.index("<section", start)]
    assert '<span class="q ok" data-status="ok">20</span>' in section  # phone: 20 tok/s, floor 25
    assert '<span class="q over" data-status="over">8</span>' in section  # board: 8 < 15 tok/s
    assert "80.0%" in section and ">25<" in section and ">10<" in section
    md = render(data, "md")
    assert (
        "## LLM decode" in md
        and "| phone | llm | onnxruntime | 64+32 | 0 | 40 | 50 | 20 | 25 | 80.0% |" in md
    )
    assert "| board | llm | onnxruntime | 64+32 | 0 | 40 | 125 | 8 ❌ | 10 | 80.0% |" in md
    fit = [v for v in data.fit.verdicts if v.model == "llm"]
    assert {(v.device, v.fits) for v in fit} == {("phone", True), ("board", False)}
    assert all(
        v.values == {"decode_tokens_per_s_min": 1e3 / (50.0 if v.device == "phone" else 125.0)} for v in fit
    )


def test_live_fit_in_report_uses_stored_counts() -> None:
    recs, samples = every_probe_records()
    data = make_data(recs, samples, budgets=parse_budgets(["latency_p99_ms=20"]))
    assert data.fit_source.startswith("computed")
    metrics = {r.metric for r in data.fit.to_records("report")}
    assert {"fits", "cv_error", "cv_within_10pct"} <= metrics


def test_predicted_pairs_show_in_matrix_and_fit_without_budgets() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_fit import COUNTS, fleet_records

    recs = fleet_records("board", skip=("m3",)) + fleet_records("phone", slow=2.0)
    for c in COUNTS.values():  # totals as the roofline probe stores them
        recs.append(Record("r1", "board", "roofline", c.name, None, "flops", c.flops, "FLOP", {}))
        recs.append(Record("r1", "board", "roofline", c.name, None, "weight_bytes", c.weight_bytes, "B", {}))
    text = render(make_data(recs, runs=("r1",)), "html")
    matrix = text[text.index('id="fit"') : text.index('id="regressions"')]
    assert "badge predicted" in matrix and "≈" in matrix
    assert "predicted p50 ms" in text[text.index('id="prediction"') :]
    assert_self_contained(text)


def test_format_and_atomic_write(tmp_path: Path) -> None:
    assert format_for(Path("r.md"), None) == "md" and format_for(Path("r.html"), None) == "html"
    assert format_for(Path("r.html"), "md") == "md"
    out = tmp_path / "deep" / "r.html"
    write_report("<p>x</p>", out)
    assert out.read_text() == "<p>x</p>" and not list(out.parent.glob(".*tmp"))


# -------------------------------------------------------------------------------------- CLI, bad input


def _store_with_bench(path: Path) -> None:
    with Store(path) as st:
        st.import_records(R1, bench(R1, "local", "enc", 4.0, 50.0), kind="bench")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from edgebench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["report", "--store", "{db}", "--out", "{out}", "--run", "nope"], "unknown run 'nope'"),
        (["report", "--store", "{missing}", "--out", "{out}"], "no such store"),
        (["report", "--store", "{db}", "--out", "{out}", "--budget", "latency_p98_ms=3"], "unknown budget"),
        (["report", "--store", "{db}", "--out", "{out}", "--format", "pdf"], "--format 'pdf'"),
        (["report", "--store", "{db}", "--out", "{out}", "--suite", "{bad_suite}"], "bad.toml"),
        (["report", "--store", "{db}"], "--out"),
        (["fit", "--store", "{db}", "--budget", "memory_mb=abc"], "KEY=NUMBER"),
        (["fit", "--store", "{db}", "--model", "{missing_model}"], "model file not found"),
        (["fit", "--store", "{db}", "--model", "{corrupt_model}"], "not a valid ONNX model"),
        (["fit", "--store", "{db}", "--device", "ghost"], "device 'ghost'"),
        (["fit", "--store", "{missing}"], "no such store"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_loses_nothing(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "lab.db"
    _store_with_bench(db)
    (tmp_path / "bad.toml").write_text("[budget]\nlatency_p99_ms = 'fast'\n")
    (tmp_path / "corrupt.onnx").write_bytes(b"not a model at all")
    names = {
        "db": db,
        "out": tmp_path / "r.html",
        "missing": tmp_path / "none.db",
        "bad_suite": tmp_path / "bad.toml",
        "missing_model": tmp_path / "gone.onnx",
        "corrupt_model": tmp_path / "corrupt.onnx",
    }
    code, out, err = run_cli([a.format(**names) for a in argv], capsys)
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgebench: error:") and words in lines[0], err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "none.db").exists()
    with Store(db) as st:
        assert len(st.runs()) == 1 and len(st.records()) == 9


def test_fit_cli_json_and_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "lab.db"
    _store_with_bench(db)
    code, out, err = run_cli(["fit", "--store", str(db), "--budget", "latency_p99_ms=10", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    fits = [r for r in doc["records"] if r["metric"] == "fits"]
    assert fits[0]["value"] == 1.0 and fits[0]["annotations"]["basis"] == "measured" and doc["run_id"]
    assert fits[0]["annotations"]["verdict"] == "fits" and doc["exit_code"] == 0
    with Store(db) as st:
        assert [r.kind for r in st.runs()] == ["bench", "fit"]
    code, out, err = run_cli(["report", "--store", str(db), "--out", str(tmp_path / "r.md")], capsys)
    assert code == 0 and "wrote md report" in err
    assert "✅ fits" in (tmp_path / "r.md").read_text()


def test_fit_cli_mnn_model_is_measured_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "lab.db"
    _store_with_bench(db)
    mnn = tmp_path / "enc.mnn"
    mnn.write_bytes(b"\0" * 64)
    code, out, err = run_cli(
        ["fit", "--store", str(db), "--model", str(mnn), "--budget", "memory_mb=60", "--no-store"], capsys
    )
    assert code == 0, err
    assert "counted on ONNX models" in err and "enc" in out
    with Store(db) as st:
        assert [r.kind for r in st.runs()] == ["bench"]


def test_png_figures_are_pure() -> None:
    """Plots render on the Agg canvas at the stated size, with no software address in the PNG."""
    from edgebench.render.report import plots

    fig = plots.new_figure()
    fig.add_subplot().plot([1, 2], [3, 4])
    uri = plots.to_data_uri(fig)
    assert uri.startswith("data:image/png;base64,")
    from PIL import Image

    img = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert img.size == (int(plots.WIDTH_IN * plots.DPI), int(plots.HEIGHT_IN * plots.DPI))
    assert b"matplotlib.org" not in base64.b64decode(uri.split(",", 1)[1])
