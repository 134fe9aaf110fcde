"""A gate a CI can trust: what it cannot evaluate is INCOMPLETE (never PASS), suite rules add to the
defaults, the output lists every rule and what it covered, a FAIL shows the jobs' disturbance warnings,
verdicts are stored as a gate run, and the Markdown fits a PR comment.

The runs are made by the bench probe's own record builder (`bench_records`) from seeded samples, stored
in a real store and gated through the real CLI."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.lab.device import AgentReply
from edgebench.probes.bench import bench_records
from edgebench.records import RecordContext
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench


def store_bench(
    st: Store, run_id: str, samples: np.ndarray, suite: str | None = "nightly", invocations: int = 1
) -> None:
    """Bench jobs as the probe stores them: their records (p99 refused under 100 samples), samples and
    warnings (the outlier warning when the samples hold outliers); `invocations` repeated jobs split the
    samples between them."""
    st.begin_run(run_id, "suite", {"git_commit": "abc123"}, suite=suite)
    for i, part in enumerate(np.array_split(samples, invocations), 1):
        notes = {"invocation": i, "repeats": invocations} if invocations > 1 else {}
        ctx = RecordContext(run_id, "phone", "bench", "enc", "onnxruntime", {"threads": 2}, notes)
        reply = AgentReply(
            {"latencies_ms": [float(v) for v in part], "load_ms": 20.0, "first_inference_ms": 9.0,
             "peak_rss_mb": 50.0, "rss_before_load_mb": 30.0}
        )  # fmt: skip
        result = bench_records(ctx, reply)
        params = {"threads": 2, "runs": 97, **({"repeats": invocations} if invocations > 1 else {})}
        model = ModelRef("enc", Path("enc.onnx"))
        job = Job("phone", "bench", model, "onnxruntime", params, invocation=i if invocations > 1 else 0)
        st.save_job(run_id, JobOutcome(job, "ok", result.records, result.samples, warnings=result.warnings))
    st.finish_run(run_id, "ok")


def suite_file(tmp_path: Path, gate: str) -> Path:
    path = tmp_path / "nightly.toml"
    path.write_text(
        'name = "nightly"\ndevices = ["local"]\nmodels = ["builtin:mlp"]\n[[probe]]\nkind = "bench"\n' + gate
    )
    return path


P99_RULE = '[[gate]]\nmetric = "latency_ms"\nstat = "p99"\nmax_slowdown = "5%"\n'


@pytest.fixture
def lab_store(tmp_path: Path) -> Path:
    """Two runs of 97 samples each (no p99 record), the candidate unchanged."""
    rng = np.random.default_rng(7)
    path = tmp_path / "lab.db"
    with Store(path) as st:
        store_bench(st, "20261201T010000Z-aaaaaa", 10.0 * np.exp(rng.normal(0, 0.02, 97)))
        store_bench(st, "20261202T010000Z-bbbbbb", 10.0 * np.exp(rng.normal(0, 0.02, 97)))
        assert not [r for r in st.records() if r.params.get("stat") == "p99"]
    return path


def gate(store: Path, cwd: Path, *extra: object):  # type: ignore[no-untyped-def]
    res = edgebench(
        "gate",
        "--store",
        store,
        "--baseline",
        "suite:nightly~1",
        "--candidate",
        "suite:nightly",
        *extra,
        cwd=cwd,
    )
    assert "Traceback" not in res.stderr
    return res


def test_a_p99_rule_on_97_samples_is_incomplete_never_pass(lab_store: Path, tmp_path: Path) -> None:
    suite = suite_file(tmp_path, P99_RULE)
    res = gate(lab_store, tmp_path, "--suite", suite, "--json")
    got = json.loads(res.stdout)
    assert got["verdict"] == "INCOMPLETE" and got["exit_code"] == 0, got["verdict"]
    p99 = [p for p in got["pairs"] if p["stat"] == "p99"]
    assert len(p99) == 1 and p99[0]["verdict"] == "INCOMPLETE"
    assert "needs at least 368" in p99[0]["reason"] and p99[0]["n_baseline"] == 97
    # The suite rule added to the defaults: the p50 latency check still ran, and PASSed.
    rules = {r["rule"]: r for r in got["rules"]}
    assert rules["latency_ms[p50] probe=bench"]["pairs"] == 1
    assert rules["latency_ms[p50] probe=bench"]["status"] == "PASS"
    assert rules["latency_ms[p99]"]["status"] == "INCOMPLETE" and rules["latency_ms[p99]"]["required"]
    strict = gate(lab_store, tmp_path, "--suite", suite, "--strict", "--junit", tmp_path / "g.xml")
    assert strict.returncode == 1 and "gate FAIL" not in strict.stdout
    assert "INCOMPLETE" in strict.stdout
    root = ET.parse(tmp_path / "g.xml").getroot()
    assert root.get("failures") == "1" and "INCOMPLETE" in ET.tostring(root, encoding="unicode")


def test_a_rule_that_pairs_nothing_is_incomplete(lab_store: Path, tmp_path: Path) -> None:
    suite = suite_file(tmp_path, '[[gate]]\nmetric = "energy_mj_per_inference"\nmax_increase = "5%"\n')
    got = json.loads(gate(lab_store, tmp_path, "--suite", suite, "--json").stdout)
    rule = next(r for r in got["rules"] if r["rule"] == "energy_mj_per_inference")
    assert rule["status"] == "INCOMPLETE" and rule["pairs"] == 0 and "no record matches" in rule["note"]
    assert got["verdict"] == "INCOMPLETE"
    # The default energy rule, where nothing measured energy, is not applicable rather than incomplete.
    plain = json.loads(gate(lab_store, tmp_path, "--json").stdout)
    assert plain["verdict"] == "PASS"
    assert next(r for r in plain["rules"] if r["rule"] == "energy_mj_per_inference")["status"] == "n/a"
    assert gate(lab_store, tmp_path, "--suite", suite, "--strict").returncode == 1


def test_replace_defaults_drops_the_default_rule_of_that_metric(lab_store: Path, tmp_path: Path) -> None:
    suite = suite_file(tmp_path, P99_RULE + "replace_defaults = true\n")
    got = json.loads(gate(lab_store, tmp_path, "--suite", suite, "--json").stdout)
    assert [r["rule"] for r in got["rules"] if r["rule"].startswith("latency_ms")] == ["latency_ms[p99]"]
    # A suite rule on the very selection of a default sets its threshold instead of doubling it.
    same = suite_file(
        tmp_path, '[[gate]]\nmetric = "latency_ms"\nstat = "p50"\nprobe = "bench"\nmax_slowdown = "8%"\n'
    )
    rules = json.loads(gate(lab_store, tmp_path, "--suite", same, "--json").stdout)["rules"]
    p50 = [r for r in rules if r["rule"] == "latency_ms[p50] probe=bench"]
    assert len(p50) == 1 and p50[0]["threshold"] == "max slowdown 8%"


def test_nothing_compared_is_incomplete(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    with Store(path) as st:
        for rid in ("20261201T010000Z-aaaaaa", "20261202T010000Z-bbbbbb"):
            st.begin_run(rid, "suite", {}, suite="nightly")
            st.finish_run(rid, "ok")
    res = gate(path, tmp_path, "--json")
    assert json.loads(res.stdout)["verdict"] == "INCOMPLETE"
    assert gate(path, tmp_path, "--strict").returncode == 1


def test_a_fail_shows_the_stored_outlier_warnings(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / "lab.db"
    slow = 13.0 * np.exp(rng.normal(0, 0.02, 360))
    slow[:3] = 200.0  # a disturbed device: three samples far out, which the probe warns of
    with Store(path) as st:
        store_bench(st, "20261201T010000Z-aaaaaa", 10.0 * np.exp(rng.normal(0, 0.02, 360)), invocations=3)
        store_bench(st, "20261202T010000Z-bbbbbb", slow, invocations=3)
        warned = st.jobs(["20261202T010000Z-bbbbbb"])[0]["warnings"]
    assert any("outliers" in w for w in warned)
    res = gate(path, tmp_path, "--markdown", tmp_path / "g.md", "--wide")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "candidate: 3 of 120 samples are outliers" in res.stdout  # under the FAIL, in full
    md = (tmp_path / "g.md").read_text()
    first_row = next(line for line in md.splitlines() if line.startswith("| **+"))
    assert "**FAIL**" in first_row and "outliers" in first_row
    # PASS rows are folded away, the rules listed; the change is the first column.
    assert "<details><summary>" in md and md.index("**FAIL**") < md.index("<details>")
    assert md.splitlines()[4].startswith("| change [CI] |")
    assert "| `latency_ms[p50] probe=bench` | max slowdown 5% | default | 1 |" in md


def test_verdicts_are_stored_as_a_gate_run(lab_store: Path, tmp_path: Path) -> None:
    res = gate(lab_store, tmp_path, "--json")
    got = json.loads(res.stdout)
    gate_run = got["gate_run"]
    with Store(lab_store) as st:
        info = st.run(gate_run)
        stored = st.gates()
        records = st.records([gate_run])
        latest = st.resolve_run("latest")
    assert info.kind == "gate" and stored[0]["verdict"] == "PASS"
    assert (
        stored[0]["baseline"] == "20261201T010000Z-aaaaaa"
        and stored[0]["candidate"] == "20261202T010000Z-bbbbbb"
    )
    assert {r.metric for r in records} == {"change"} and all(r.annotations["verdict"] for r in records)
    assert latest == "20261202T010000Z-bbbbbb"  # a gate measures nothing: `latest` skips it
    listed = json.loads(edgebench("runs", "--store", lab_store, "--json", cwd=tmp_path).stdout)["runs"]
    assert listed[-1]["run_id"] == gate_run and listed[-1]["gate"]["verdict"] == "PASS"
    # history reads gate records like any series (one point per gate run).
    gate(lab_store, tmp_path)
    hist = edgebench(
        "history", "--store", lab_store, "--device", "phone", "--model", "enc", "--probe", "gate",
        "--metric", "change", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert hist.returncode == 0, hist.stderr
    series = json.loads(hist.stdout)["series"]
    assert any(len(s["points"]) == 2 for s in series)
    nostore = gate(lab_store, tmp_path, "--no-store", "--json")
    assert json.loads(nostore.stdout)["gate_run"] is None
