"""What a report is made of (ReportData), and loading it from a store. Renderers only see ReportData."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...analysis.budgets import Budget
from ...analysis.fit import assess
from ...analysis.fit_result import FitResult
from ...analysis.model_counts import PROBE as FIT_PROBE
from ...analysis.observations import MEASURING_PROBES
from ...errors import UserError
from ...records import Record, Samples, utc_now
from ...results.store import RunInfo, Store

ANALYSIS_PROBES = (FIT_PROBE, "gate")


@dataclass(frozen=True)
class ReportData:
    """Everything one report shows: runs with provenance, devices, records, raw samples, errors, budgets.

    `fit` is fit's result: the latest fit run among the selected runs as it was stored, or, when there is
    none, computed for the report from the stored measurements (`fit_source` says which).
    """

    title: str
    generated: str
    store_name: str
    runs: tuple[RunInfo, ...]
    jobs: tuple[dict[str, Any], ...]
    devices: tuple[dict[str, Any], ...]
    records: tuple[Record, ...]
    samples: tuple[Samples, ...]
    errors: tuple[dict[str, Any], ...]
    budgets: tuple[Budget, ...] = ()
    fit: FitResult = field(default_factory=lambda: FitResult(budgets=()))
    fit_source: str = ""
    fit_warnings: tuple[str, ...] = ()
    health: tuple[Record, ...] = ()  # the latest `doctor` records of the report's devices, from any run
    health_order: tuple[str, ...] = ()  # run ids of those records, oldest first
    # The latest suite run against the previous run of the same suite (a gate result as a dict: a stored
    # gate run's, else one computed for the report with the default rules), and where it came from.
    regression: dict[str, Any] | None = None
    regression_source: str = ""

    @property
    def run_order(self) -> list[str]:
        return [r.run_id for r in self.runs]

    @property
    def measurements(self) -> list[Record]:
        """Records of measurements (fit and gate records are analysis, shown in their own sections)."""
        return [r for r in self.records if r.probe not in ANALYSIS_PROBES]

    def budget(self, key: str) -> Budget | None:
        for b in self.budgets:
            if b.key == key:
                return b
        return None


def load_report_data(
    store: Store,
    run_ids: Sequence[str] | None = None,
    budgets: Sequence[Budget] = (),
    title: str | None = None,
    gate_rules: Sequence[Any] | None = None,
    gate_rules_source: str = "",
) -> ReportData:
    """Read the selected runs (default: every run in the store) and what the report needs of them.

    `gate_rules`: the rules (analysis.gate) the regression section applies when no stored gate run
    compared the two runs (the suite's `[[gate]]` rules merged with the defaults; None: the defaults)."""
    all_runs = store.runs()
    if not all_runs:
        raise UserError(f"{store.path}: the store has no runs yet (run `edgebench bench` or `edgebench run`)")
    if run_ids:
        wanted = list(dict.fromkeys(run_ids))
        known = {r.run_id: r for r in all_runs}
        for rid in wanted:
            if rid not in known:
                raise UserError(f"unknown run '{rid}' in {store.path}")
        runs = [r for r in all_runs if r.run_id in set(wanted)]
    else:
        runs = all_runs
    ids = [r.run_id for r in runs]
    records = store.records(ids)
    samples = store.samples(ids)
    devices = store.device_info(ids)
    ungated = [r for r in records if r.probe != "gate"]
    fit, fit_source, warnings = _fit_result(ungated, samples, devices, budgets, ids)
    health, health_order = _health_records(store, all_runs, {r.device for r in records})
    regression, regression_source = _regression(store, all_runs, runs, gate_rules, gate_rules_source)
    return ReportData(
        title=title or _default_title(runs),
        generated=utc_now(),
        store_name=store.path.name,
        runs=tuple(runs),
        jobs=tuple(store.jobs(ids)),
        devices=tuple(devices),
        records=tuple(records),
        samples=tuple(samples),
        errors=tuple(store.errors(ids)),
        budgets=tuple(budgets),
        fit=fit,
        fit_source=fit_source,
        fit_warnings=tuple(warnings),
        health=tuple(health),
        health_order=tuple(health_order),
        regression=regression,
        regression_source=regression_source,
    )


def _health_records(
    store: Store, runs: Sequence[RunInfo], devices: set[str]
) -> tuple[list[Record], list[str]]:
    """Every doctor record of these devices in the store (a device's health is measured in its own run)."""
    doctor_runs = [r.run_id for r in runs if r.kind == "doctor"]
    if not doctor_runs or not devices:
        return [], []
    found = [r for r in store.records(doctor_runs) if r.probe == "doctor" and r.device in devices]
    return found, doctor_runs


def previous_suite_run(all_runs: Sequence[RunInfo], selected: Sequence[RunInfo]) -> tuple[str, str] | None:
    """(previous, latest): the latest selected run of a suite and the run of that suite before it in the
    store (selected or not), or None when no selected run belongs to a suite with an earlier run."""
    latest = next((r for r in reversed(selected) if r.suite and r.kind == "suite"), None)
    if latest is None:
        return None
    same = [r.run_id for r in all_runs if r.suite == latest.suite and r.kind == "suite"]
    i = same.index(latest.run_id)
    return (same[i - 1], latest.run_id) if i > 0 else None


def _regression(
    store: Store,
    all_runs: Sequence[RunInfo],
    selected: Sequence[RunInfo],
    rules: Sequence[Any] | None = None,
    rules_source: str = "",
) -> tuple[dict[str, Any] | None, str]:
    """One verdict per question: the stored gate run that compared these two runs when there is one (the
    verdicts the release pipeline saw), else the gate applied now with the given rules; and which."""
    from ...analysis.gate import default_rules, gate_runs

    pair = previous_suite_run(all_runs, selected)
    if pair is None:
        return None, ""
    previous, latest = pair
    stored = [g for g in store.gates() if (g["baseline"], g["candidate"]) == (previous, latest)]
    if stored:
        return stored[-1]["result"], f"the verdicts of stored gate run {stored[-1]['run_id']}"
    result = gate_runs(store, previous, latest, list(rules) if rules is not None else default_rules())
    where = rules_source or "the default gate rules"
    return result.to_dict(), f"no stored gate run compared them: the gate applied here with {where}"


def _fit_result(
    records: Sequence[Record],
    samples: Sequence[Samples],
    devices: Sequence[dict[str, Any]],
    budgets: Sequence[Budget],
    run_order: Sequence[str],
) -> tuple[FitResult, str, list[str]]:
    """Fit's result for the report (the latest stored fit run's, else computed now), where it comes
    from, and the warnings of one computed now."""
    stored = [r for r in records if r.probe == FIT_PROBE]
    if stored:
        order = {rid: i for i, rid in enumerate(run_order)}
        latest = max({r.run_id for r in stored}, key=lambda rid: order.get(rid, -1))
        return FitResult.from_records(r for r in stored if r.run_id == latest), f"fit run {latest}", []
    measured = [r for r in records if r.probe != FIT_PROBE]
    if not any(r.probe in MEASURING_PROBES or r.probe == "decode" for r in measured):
        return FitResult(budgets=()), "", []
    result = assess(measured, budgets, samples=samples, device_info=devices, run_order=run_order)
    return result, "computed for this report from the stored measurements", result.warnings


def _default_title(runs: Sequence[RunInfo]) -> str:
    if len(runs) == 1:
        r = runs[0]
        return f"edgebench report: {r.suite or r.kind} run {r.run_id}"
    return f"edgebench report: {len(runs)} runs, {runs[0].created[:10]} to {runs[-1].created[:10]}"
