"""Verbs: gate, history, export-pytest-benchmark, import-pytest-benchmark."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer

from ..errors import UserError
from ..records import Record
from .common import JSON_OPT, STORE_OPT, console, make_table, note, open_store, print_json, records_json

_RUN_REF = "a run id or reference: latest, latest~1, suite:NAME, suite:NAME~1, tag:NAME, a prefix"
_GATE_BASELINE = typer.Option(..., "--baseline", help=f"The reference run ({_RUN_REF}).")
_GATE_CANDIDATE = typer.Option(..., "--candidate", help=f"The run to judge ({_RUN_REF}).")
_GATE_MAX_SLOWDOWN = typer.Option(
    None, "--max-slowdown", help="Allowed latency slowdown, e.g. 5% (default 5%, or the suite's)."
)
_GATE_SUITE = typer.Option(
    None,
    "--suite",
    help="Suite whose [[gate]] tables add rules to the defaults (replace_defaults = true drops "
    "the defaults of that metric).",
)
_GATE_ALPHA = typer.Option(0.01, "--alpha", help="Significance level (false discovery rate across pairs).")
_GATE_MIN_SAMPLES = typer.Option(10, "--min-samples", min=3, help="Fewer samples per side is INCOMPLETE.")
_GATE_STRICT = typer.Option(
    False, "--strict", help="NOISY, MISSING and INCOMPLETE fail the gate too (exit 1)."
)
_GATE_SEED = typer.Option(0, "--seed", help="Seed of the bootstrap and permutation resampling.")
_GATE_JUNIT = typer.Option(None, "--junit", help="Write JUnit XML (one testcase per pair).")
_GATE_MARKDOWN = typer.Option(None, "--markdown", help="Write a Markdown summary (for a PR comment).")
_GATE_NO_STORE = typer.Option(False, "--no-store", help="Do not keep the verdicts as a gate run.")
_GATE_MAX_WAIT = typer.Option(
    "10%",
    "--max-wait",
    help="A job is disturbed (its pairs NOISY, never FAIL) when other processes took more than this share "
    "of its CPUs, or its threads waited this share of their time on a run queue.",
)
_GATE_WIDE = typer.Option(False, "--wide", help="Every column at full width (default: fit 120 columns).")
_GATE_CONFIRM = typer.Option(
    False,
    "--confirm",
    help="Before a FAIL (and for NOISY/INCOMPLETE pairs, or a PASS its jobs call disturbed): measure the "
    "baseline's model (its kept copy) and the candidate's alternately on the same device, A B / B A, and "
    "decide on those pairs (needs --lab).",
)
_GATE_CONFIRM_BUDGET = typer.Option(
    300.0, "--confirm-budget", help="Seconds --confirm may measure in all (shared by the pairs it confirms)."
)
_GATE_CONFIRM_PAIRS = typer.Option(
    20,
    "--confirm-pairs",
    help="Most A/B pairs per confirmed pair (>= 7 at --alpha 0.01). Judged twice, alpha split between the "
    "looks: as soon as the exact test can reach alpha/2 (8 pairs at 0.01) and at the last pair.",
)
_GATE_LAB = typer.Option(Path("devices"), "--lab", help="Folder of device descriptors (for --confirm).")
_HISTORY_DEVICE = typer.Option(..., "--device", "-d", help="Device name as stored.")
_HISTORY_MODEL = typer.Option(..., "--model", "-m", help="Model name as stored (its file stem).")
_HISTORY_METRIC = typer.Option("latency_ms", "--metric")
_HISTORY_STAT = typer.Option("p50", "--stat", help="For metrics with a stat param (p50, p99, mean ...).")
_HISTORY_PROBE = typer.Option(None, "--probe", help="Only this probe's records (default: any).")
_HISTORY_RUNTIME = typer.Option(None, "--runtime", help="Only this runtime (default: one series each).")
_HISTORY_MIN_CHANGE = typer.Option("2%", "--min-change", help="Smaller steps are not reported.")
_HISTORY_ALPHA = typer.Option(0.01, "--alpha", help="Significance level of each step.")
_HISTORY_SEED = typer.Option(0, "--seed")
_EXPORT_RUN = typer.Option(None, "--run", help="Run id or reference (default: latest).")
_EXPORT_OUT = typer.Option(None, "--out", "-o", help="Write the JSON here (default: stdout).")
_EXPORT_NO_DATA = typer.Option(False, "--no-data", help="Leave out the raw samples (stats.data).")
_IMPORT_FILES = typer.Argument(..., help="pytest-benchmark JSON files (one run each).")
_IMPORT_DEVICE = typer.Option(None, "--device", "-d", help="Device name (default: the file's machine node).")


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
    app.command("history")(history)
    app.command("export-pytest-benchmark")(export_pytest_benchmark)
    app.command("import-pytest-benchmark")(import_pytest_benchmark)


def _write(path: Path, text: str, what: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot write {what}: {exc.strerror}") from None
    note(f"edgebench: wrote {what} to {path}")


def gate(
    baseline: str = _GATE_BASELINE,
    candidate: str = _GATE_CANDIDATE,
    store: Path = STORE_OPT,
    max_slowdown: str = _GATE_MAX_SLOWDOWN,
    suite: Path = _GATE_SUITE,
    alpha: float = _GATE_ALPHA,
    min_samples: int = _GATE_MIN_SAMPLES,
    strict: bool = _GATE_STRICT,
    seed: int = _GATE_SEED,
    junit: Path = _GATE_JUNIT,
    markdown: Path = _GATE_MARKDOWN,
    no_store: bool = _GATE_NO_STORE,
    max_wait: str = _GATE_MAX_WAIT,
    wide: bool = _GATE_WIDE,
    confirm: bool = _GATE_CONFIRM,
    confirm_budget: float = _GATE_CONFIRM_BUDGET,
    confirm_pairs: int = _GATE_CONFIRM_PAIRS,
    lab: Path = _GATE_LAB,
    as_json: bool = JSON_OPT,
) -> int:
    """Compare a candidate run with a baseline: exit 0 pass, 1 regression, 2 usage, 3 lab failure."""
    from ..analysis.gate import GateOptions, default_rules, gate_runs, merge_rules, parse_percent
    from ..execution.provenance import host_provenance
    from ..execution.suite import rules_from_suite
    from ..records import new_run_id
    from ..render.junit import gate_junit
    from ..render.markdown_gate import gate_markdown

    if not 0 < alpha < 0.5:
        raise UserError(f"--alpha {alpha:g}: must be between 0 and 0.5")
    slowdown = parse_percent(max_slowdown, "--max-slowdown") if max_slowdown is not None else None
    overrides = rules_from_suite(suite) if suite is not None else []
    rules = merge_rules(default_rules(), overrides, slowdown)
    wait = parse_percent(max_wait, "--max-wait")
    opts = GateOptions(alpha=alpha, min_samples=min_samples, seed=seed, strict=strict, max_wait=wait)
    run_id = None if no_store else new_run_id()
    with open_store(store) as st:
        base_id = st.resolve_run(baseline, "--baseline run")
        cand_id = st.resolve_run(candidate, "--candidate run")
        result = gate_runs(st, base_id, cand_id, rules, opts)
        confirmed: dict[str, object] = {}
        if confirm:
            from .gate_confirm import confirm_gate, confirm_options

            kept = None if no_store else store
            args = confirm_options(lab, kept, confirm_budget, confirm_pairs, alpha, wait)
            result, confirmed = confirm_gate(st, result, args)
        records = gate_records(result, run_id or cand_id)
        if run_id is not None:
            st.save_gate(
                run_id, {**result.to_dict(), **confirmed, "gate_run": run_id}, records, host_provenance()
            )
    if junit is not None:
        _write(junit, gate_junit(result), "JUnit XML")
    if markdown is not None:
        _write(markdown, gate_markdown(result), "Markdown")
    if as_json:
        print_json(records_json(records, gate_run=run_id, **result.to_dict(), **confirmed))
    else:
        _show_gate(result, run_id, wide)
    for n in result.notes:
        note(f"edgebench: note: {n}")
    return result.exit_code


def gate_records(result, run_id: str) -> list[Record]:
    """One record per pair (probe `gate`, metric `change`), kept in the gate's own run so reports and
    `history --probe gate --metric change` read gates like any result. Identity: what was gated; the
    verdict and its numbers are annotations."""
    out = []
    for v in result.verdicts:
        params = {
            **v.key.to_dict()["params"],
            "gated_probe": v.key.probe,
            "gated_metric": v.key.metric,
            **({"stat": v.key.stat} if v.key.stat else {}),
        }
        annotations = {
            "verdict": v.verdict,
            "reason": v.reason,
            "baseline_run": result.baseline,
            "candidate_run": result.candidate,
            "baseline": _finite(v.baseline),
            "candidate": _finite(v.candidate),
            "ci_low": _finite(v.ci_low),
            "ci_high": _finite(v.ci_high),
            "q_value": _finite(v.q_value),
            "rule": v.rule.selection(),
            "threshold": v.rule.describe(v.unit),
            "warnings": list(v.warnings),
        }
        unit = "ratio" if v.rule.threshold.relative else v.unit
        out.append(
            Record(
                run_id,
                v.key.device,
                "gate",
                v.key.model,
                v.key.runtime,
                "change",
                _finite(v.change),
                unit,
                params,
                annotations=annotations,
            )
        )
    return out


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


_STYLE = {
    "PASS": "green",
    "IMPROVED": "cyan",
    "FAIL": "bold red",
    "NOISY": "yellow",
    "MISSING": "magenta",
    "INCOMPLETE": "bold yellow",
    "n/a": "dim",
}


TABLE_WIDTH = 120  # the gate's tables fit this many columns unless --wide


def _gate_console(wide: bool):
    """Full width with --wide (a pipe: unlimited); else at most 120 columns, cells wrapped to fit."""
    from rich.console import Console

    if wide:
        return console()
    tty = sys.stdout.isatty()
    width = min(Console().width, TABLE_WIDTH) if tty else TABLE_WIDTH
    return Console(file=sys.stdout, width=width, soft_wrap=False, no_color=not tty, highlight=False)


def _show_gate(result, run_id: str | None, wide: bool = False) -> None:
    """The pairs (FAIL first, with the jobs' warnings under them), then every rule and what it covered.
    Fits 120 columns (baseline and candidate values and q in the change cell, text wrapped) unless wide."""
    from rich.text import Text

    out = _gate_console(wide)
    columns = ["verdict", "measurement", "baseline", "candidate", "change [CI]", "q", "n", "why"]
    if not wide:
        columns = ["verdict", "measurement", "change [CI]", "n", "why"]
    table = make_table(f"gate: baseline {result.baseline} -> candidate {result.candidate}", columns)
    for v in result.verdicts:
        stat = f"[{v.key.stat}]" if v.key.stat else ""
        params = "" if v.key.params == "{}" else f" {v.key.params}"
        why = v.reason + "".join(f"\n! {w}" for w in v.warnings)
        what = f"{v.key.device} {v.key.model} {v.key.runtime}\n{v.key.probe}:{v.key.metric}{stat}{params}"
        q = "-" if v.q_value is None else f"{v.q_value:.2g}"
        if wide:
            cells = [_num(v.baseline, v.unit), _num(v.candidate, v.unit), v.change_text(), q]
        else:
            values = f"{_num(v.baseline, v.unit)} -> {_num(v.candidate, v.unit)}"
            cells = [f"{v.change_text()}\n{values}" + ("" if q == "-" else f"\nq={q}")]
        table.add_row(
            Text(v.verdict, style=_STYLE.get(v.verdict, "")),
            Text(what),
            *[Text(c) for c in cells],
            Text(f"{v.n_baseline}/{v.n_candidate}"),
            Text(why),
        )
    out.print(table)
    rules = make_table("rules", ["rule", "threshold", "from", "pairs", "verdicts", "status"])
    for r in result.rules:
        counts = ", ".join(f"{n} {k}" for k, n in r.counts.items() if n) or r.note or "-"
        rules.add_row(
            Text(r.rule.selection()),
            Text(r.rule.describe()),
            Text(r.rule.source),
            Text(str(r.pairs)),
            Text(counts if not r.note or not r.pairs else f"{counts}; {r.note}"),
            Text(r.status, style=_STYLE.get(r.status, "")),
        )
    out.print(rules)
    counts = ", ".join(f"{n} {k}" for k, n in result.counts().items() if n) or "nothing compared"
    unpaired = (
        f"; {result.unpaired_candidate} candidate measurement(s) without a baseline"
        if result.unpaired_candidate
        else ""
    )
    stored = f" (stored as gate run {run_id})" if run_id else ""
    out.print(Text(f"gate {result.overall}: {counts}{unpaired}{stored}"))


def _num(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.4g} {unit}".strip()


def history(
    device: str = _HISTORY_DEVICE,
    model: str = _HISTORY_MODEL,
    metric: str = _HISTORY_METRIC,
    stat: str = _HISTORY_STAT,
    probe: str = _HISTORY_PROBE,
    runtime: str = _HISTORY_RUNTIME,
    min_change: str = _HISTORY_MIN_CHANGE,
    alpha: float = _HISTORY_ALPHA,
    seed: int = _HISTORY_SEED,
    store: Path = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Find the runs where a device/model metric stepped (change points over the nightly series)."""
    from ..analysis.gate import check_stat, parse_percent
    from ..analysis.history import change_point_records, change_points, load_series

    check_stat(stat)
    if not 0 < alpha < 0.5:
        raise UserError(f"--alpha {alpha:g}: must be between 0 and 0.5")
    floor = parse_percent(min_change, "--min-change")
    with open_store(store) as st:
        all_series = load_series(st, device, model, metric, stat, probe, runtime)
    found = [(s, change_points(s, alpha=alpha, min_change=floor, seed=seed)) for s in all_series]
    records = [r for s, cps in found for r in change_point_records(s, cps)]
    if as_json:
        print_json(
            records_json(
                records,
                series=[
                    {
                        "device": s.device,
                        "model": s.model,
                        "runtime": s.runtime,
                        "probe": s.probe,
                        "metric": s.metric,
                        "stat": s.stat,
                        "params": s.params,
                        "unit": s.unit,
                        "points": [{"run_id": p.run_id, "ts": p.ts, "value": p.value} for p in s.points],
                        "change_points": [cp.run_id for cp in cps],
                    }
                    for s, cps in found
                ],
            )
        )
        return 0
    _show_history(found)
    return 0


def _show_history(found) -> None:
    from rich.text import Text

    out = console()
    for s, cps in found:
        out.print(Text(f"history {s.label()}: {len(s.points)} runs, {len(cps)} step(s)"))
        if not cps:
            continue
        table = make_table(
            None,
            [
                "first run at new level",
                "measured",
                "previous run",
                f"before ({s.unit})",
                f"after ({s.unit})",
                "change",
                "p",
            ],
        )
        for cp in cps:
            table.add_row(
                cp.run_id,
                cp.ts,
                cp.previous_run,
                f"{cp.before:.4g}",
                f"{cp.after:.4g}",
                f"{cp.change * 100:+.1f}%",
                f"{cp.p_value:.2g}",
            )
        out.print(table)


def export_pytest_benchmark(
    run: str = _EXPORT_RUN,
    out: Path = _EXPORT_OUT,
    no_data: bool = _EXPORT_NO_DATA,
    store: Path = STORE_OPT,
) -> int:
    """Write a stored run as pytest-benchmark JSON (readable by `pytest-benchmark compare`)."""
    from ..results.interop import export_run

    with open_store(store) as st:
        run_id = st.resolve_run(run) if run else st.latest_run().run_id
        doc = export_run(st, run_id, include_data=not no_data)
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        _write(out, text, f"{len(doc['benchmarks'])} benchmarks of run {run_id}")
    return 0


def import_pytest_benchmark(
    files: list[Path] = _IMPORT_FILES,
    device: str = _IMPORT_DEVICE,
    store: Path = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> int:
    """Import pytest-benchmark JSON into the store (stats; raw data when saved with --benchmark-save-data)."""
    from ..results.interop import import_file, read_pytest_benchmark, records_from_pytest_benchmark
    from ..results.store import Store

    for path in files:  # check every file before storing any, so a bad one leaves the store as it was
        records_from_pytest_benchmark(read_pytest_benchmark(path), path, "check", device)
    imported = []
    with Store(store) as st:
        for path in files:
            run_id, n_records, n_samples = import_file(st, path, device)
            imported.append({"file": str(path), "run_id": run_id, "records": n_records, "samples": n_samples})
            note(
                f"edgebench: imported {path} as run {run_id} ({n_records} records, {n_samples} sample series)"
            )
    if as_json:
        print_json({"records": [], "runs": imported})
    else:
        for item in imported:
            print(item["run_id"])
    return 0
