"""The report renders whatever a store holds: every subset of probe kinds, per device, over runs that are
full, empty or failed only, selected in any combination, in HTML and in Markdown, without an internal error.

The records are cheap to build, so the property runs in seconds: the bench, matmul, bandwidth and roofline
records of a real smoke-suite run (the stored fixture tests/fixtures/store_v1, made on a real host), the
doctor records from the probe's own builder, and the other kinds from the record builders of
tests/unit/test_report.py. Each example writes a real store, loads it as `edgebench report` does and renders
both formats. Only the PNG encoding of the figures is skipped here (each figure is still built from its
data); test_report.py and the end-to-end test in test_report_crash.py rasterise them for real.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report import R1, doctor_health, every_probe_records, parse, workload_records

from edgebench.jobs import Job, JobOutcome
from edgebench.records import Record, Samples, utc_now
from edgebench.render.report import load_report_data, plots, render
from edgebench.render.report.html import SECTIONS
from edgebench.results.store import Store

FIXTURE = Path(__file__).parent.parent / "fixtures" / "store_v1" / "v1.db"
FIXTURE_RUN = "20261201T081909Z-7de074"  # a smoke-suite run: bench, matmul, bandwidth, roofline on `local`
DEVICES = ("local", "phone", "board")

Pool = dict[str, tuple[list[Record], list[Samples]]]


def _kind(r: Record) -> str:
    """The report's view of a record's kind: the probe, with bench's streaming and cold-load records and the
    per-op accuracy records apart (each feeds a section of its own)."""
    if r.probe == "bench" and r.params.get("stream"):
        return "stream"
    if r.probe == "bench" and r.params.get("cache") == "cold":
        return "coldload"
    if r.probe == "accuracy" and "op" in r.params:
        return "divergence"
    return r.probe


@cache
def pool() -> Pool:
    """Records (and raw samples) of one run and one device per kind, keyed by kind."""
    out: dict[str, tuple[list[Record], list[Samples]]] = {}

    def add(records: list[Record], samples: list[Samples]) -> None:
        for r in records:
            out.setdefault(_kind(r), ([], []))[0].append(r)
        for s in samples:
            if s.probe in out:
                out[s.probe][1].append(s)

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "v1.db"
        shutil.copy(FIXTURE, copy)
        store = Store(copy)  # migrates the v1 fixture to today's schema
        try:
            add(store.records([FIXTURE_RUN]), store.samples([FIXTURE_RUN]))
        finally:
            store.close()
    stored = set(out)
    built, samples = every_probe_records()
    # One device and one run per hand-built kind; the stored kinds come from the real run only.
    keep = [
        r
        for r in built
        if r.device in ("phone", "local")
        and (r.run_id == R1 or r.probe == "history")
        and _kind(r) not in stored
    ]
    add(
        keep + workload_records() + list(doctor_health("phone", R1)),
        [s for s in samples if s.device == "phone" and s.run_id == R1 and s.probe not in stored],
    )
    return out


KINDS = sorted(pool())
RUN_SHAPES = ("data", "empty", "failed")


@st.composite
def stores(draw: st.DrawFn) -> list[tuple[str, dict[str, frozenset[str]]]]:
    """Runs, each (shape, {device: kinds}): 'data' runs have records of the drawn kinds on each drawn device
    (any subset, the empty one included), 'failed' runs only failed jobs, 'empty' runs nothing at all."""
    n_runs = draw(st.integers(1, 3))
    runs = []
    for _ in range(n_runs):
        shape = draw(st.sampled_from(RUN_SHAPES))
        devices = draw(st.lists(st.sampled_from(DEVICES), min_size=1, max_size=3, unique=True))
        kinds = {d: draw(st.frozensets(st.sampled_from(KINDS))) for d in devices}
        runs.append((shape, kinds))
    return runs


def _moved(r: Record | Samples, run_id: str, device: str) -> Record | Samples:
    return dataclasses.replace(r, run_id=run_id, device=device)


def write_store(path: Path, runs: list[tuple[str, dict[str, frozenset[str]]]]) -> list[str]:
    """A store holding these runs, written through the store's own job API; returns the run ids."""
    store = Store(path)
    ids = []
    try:
        for i, (shape, kinds) in enumerate(runs):
            run_id = f"2026120{i + 1}T000000Z-{i:06x}"
            ids.append(run_id)
            store.begin_run(run_id, "suite", {"argv": ["run", "suites/any.toml"]}, suite="any")
            for device, wanted in kinds.items():
                if shape == "empty":
                    continue
                store.save_device(run_id, device, {"arch": "x86_64", "cores": 2}, {"transport": "local"})
                for kind in sorted(wanted):
                    records, samples = pool()[kind]
                    job = Job(device=device, probe=records[0].probe, params={"kind": kind})
                    if shape == "failed":
                        outcome = JobOutcome(job, "error", error=f"{device}: timed out", error_kind="lab")
                    else:
                        outcome = JobOutcome(
                            job,
                            "ok",
                            [_moved(r, run_id, device) for r in records],  # type: ignore[misc]
                            [_moved(s, run_id, device) for s in samples],  # type: ignore[misc]
                        )
                    store.save_job(
                        run_id, dataclasses.replace(outcome, started=utc_now(), finished=utc_now())
                    )
            store.finish_run(run_id, "ok" if shape == "data" else "error")
    finally:
        store.close()
    return ids


@pytest.fixture(scope="module", autouse=True)
def figures_built_not_encoded() -> Iterator[None]:
    """Every figure is built from its data, its PNG encoding (most of a report's time) skipped."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "to_data_uri", lambda fig: "data:image/png;base64,")
        yield


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=stores(), selected=st.lists(st.integers(0, 2), unique=True))
def test_any_store_renders_in_both_formats(
    runs: list[tuple[str, dict[str, frozenset[str]]]], selected: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "any.db"
        ids = write_store(path, runs)
        chosen = [ids[i] for i in selected if i < len(ids)] or None  # none chosen: every run
        with Store(path) as store:
            data = load_report_data(store, chosen)
    html = render(data, "html")
    assert list(parse(html).sections) == [sid for sid, _, _ in SECTIONS]
    md = render(data, "md")
    assert md.startswith("# ") and data.title in md


def test_the_pool_holds_every_kind_of_the_report() -> None:
    """The property draws from every kind of record the report has a section for."""
    assert {
        "bench", "matmul", "bandwidth", "roofline", "threads", "thermal", "power", "decode", "profile",
        "accuracy", "divergence", "variants", "sensitivity", "history", "stream", "coldload", "soak",
        "contention", "doctor",
    } <= set(KINDS)  # fmt: skip


def test_the_reported_case_bench_bandwidth_matmul_without_roofline() -> None:
    """The failing case of the issue, kept as an example: ceilings and benches, no roofline counts."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.db"
        write_store(path, [("data", {"local": frozenset({"bench", "bandwidth", "matmul"})})])
        with Store(path) as store:
            data = load_report_data(store)
    html = render(data, "html")
    assert parse(html).sections["roofline"] == "data"  # the ceilings are drawn, no models on them
    render(data, "md")
