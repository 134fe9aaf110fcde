"""`gate --confirm`: the glue between a gate's first-stage verdicts and the alternated re-measurement.

The confirmed verdicts replace the first-stage ones in the gate's result, so the table, JSON, JUnit and
Markdown all say the same thing, each with its evidence (pairs, the Hodges-Lehmann ratio and its interval,
p) in the reason and method; the first stage's word is kept in the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..analysis.confirm import PairedDecision, look_schedule, min_pairs_for
from ..analysis.disturbance import DEFAULT_MAX_WAIT
from ..analysis.gate import NOISY, VERDICTS, GateResult, PairVerdict, rule_report
from ..errors import UserError
from ..execution.confirm import (
    ConfirmBudget,
    ConfirmRun,
    Question,
    Unconfirmable,
    confirm,
    disturbed_jobs,
    plan,
)
from .common import note, open_lab


@dataclass(frozen=True)
class ConfirmArgs:
    """What the command line asked of the confirmation."""

    lab: Path
    store: Path | None  # None: --no-store, the confirm run is not kept either
    budget: ConfirmBudget
    lock_dir: Path | None = None


def confirm_options(
    lab: Path,
    store: Path | None,
    seconds: float,
    pairs: int,
    alpha: float,
    max_wait: float = DEFAULT_MAX_WAIT,
) -> ConfirmArgs:
    """The command line's --confirm options, checked (a budget that could settle nothing is exit 2);
    `max_wait` is the gate's: two sides of a pair whose disturbance differs by more are set aside."""
    budget = ConfirmBudget(seconds, pairs, alpha=alpha, max_wait=max_wait)
    check_args(budget)
    return ConfirmArgs(lab, store, budget)


def check_args(budget: ConfirmBudget) -> None:
    """Refuse a budget that could never settle anything (one line, exit 2): fewer pairs than one look at
    alpha needs (the looks of a larger budget share alpha: `analysis.confirm.look_schedule`)."""
    need = min_pairs_for(budget.alpha)
    if budget.max_pairs < need:
        raise UserError(
            f"--confirm-pairs {budget.max_pairs}: at --alpha {budget.alpha:g} the signed-rank test needs at "
            f"least {need} pairs to conclude anything (2^-n <= alpha)"
        )
    if not budget.seconds > 0:
        raise UserError(f"--confirm-budget {budget.seconds:g}: must be a positive number of seconds")


def confirm_gate(store: Any, result: GateResult, args: ConfirmArgs) -> tuple[GateResult, dict[str, Any]]:
    """Re-measure the gate's FAIL, NOISY and INCOMPLETE pairs (and a PASS whose jobs warned of a disturbed
    device); the result with the confirmed verdicts and
    the JSON to add to the gate's document (`confirm_run`, `confirmations`)."""
    check_args(args.budget)
    warned = store.jobs([result.baseline, result.candidate])
    targets, skipped = plan(
        result.verdicts,
        store.job_models([result.baseline]),
        store.job_models([result.candidate]),
        disturbed=lambda key: bool(disturbed_jobs(key, warned)),
    )
    if not targets:
        confirmed = apply(result, ConfirmRun(""), skipped)
        return confirmed, {"confirm_run": None, "confirmations": []}
    lab = open_lab(args.lab)
    specs = {t.device: lab.get(t.device) for t in targets}
    questions = sum(len(t.questions) for t in targets)
    note(
        f"edgebench: confirming {questions} pair(s) on {', '.join(specs)}: baseline and candidate "
        f"alternately, up to {args.budget.max_pairs} pairs within {args.budget.seconds:g} s, "
        f"{look_schedule(args.budget.alpha, args.budget.max_pairs).text()}"
    )
    run = confirm(
        specs,
        targets,
        args.store,
        args.budget,
        gate={"baseline": result.baseline, "candidate": result.candidate},
        lock_dir=args.lock_dir,
    )
    return apply(result, run, skipped), {
        "confirm_run": run.run_id if args.store is not None else None,
        "confirmations": confirmations(run),
    }


def confirmations(run: ConfirmRun) -> list[dict[str, Any]]:
    """Each confirmed pair's evidence as JSON: the decision and the values measured per side."""
    out = []
    for r in run.results:
        for q in r.target.questions:
            d = r.decisions.get(q)
            base, cand = r.values.get(q, ([], []))
            out.append(
                {
                    "set_aside": list(r.set_aside),
                    **q.key.to_dict(),
                    "rule": q.rule.selection(),
                    "confirmed": d.to_dict() if d is not None else None,
                    "error": r.error,
                    "baseline_values": base,
                    "candidate_values": cand,
                    "seconds": round(r.seconds, 3),
                }
            )
    return out


def confirmed_verdict(
    v: PairVerdict, d: PairedDecision, error: str | None, set_aside: Sequence[str] = ()
) -> PairVerdict:
    """The first-stage verdict replaced by the paired decision, with the evidence in reason and method."""
    verdict = d.verdict or NOISY
    reason = f"{d.reason} ({d.evidence()}); first stage: {v.verdict}"
    if set_aside:
        reason += f"; {len(set_aside)} pair(s) set aside, one side disturbed alone ({set_aside[0]})"
    if error:
        reason += f"; stopped early: {error}"
    return replace(
        v,
        verdict=verdict,
        reason=reason,
        baseline=d.baseline,
        candidate=d.candidate,
        change=d.change,
        ci_low=d.ci_low,
        ci_high=d.ci_high,
        p_value=d.p_worse,
        q_value=None,
        n_baseline=d.n_pairs,
        n_candidate=d.n_pairs,
        method=(
            f"confirm: Wilcoxon signed-rank and Hodges-Lehmann on {d.n_pairs} alternated invocation pairs "
            f"({d.confidence:.0%} CI)"
        ),
        samples_needed=None,
    )


def apply(result: GateResult, run: ConfirmRun, skipped: list[Unconfirmable]) -> GateResult:
    """Pure: the gate's result with confirmed verdicts in place of the first-stage ones; pairs that could
    not be confirmed keep their verdict with a warning saying why."""
    decided: dict[Question, tuple[PairedDecision | None, str | None]] = {}
    aside: dict[Question, list[str]] = {}
    for r in run.results:
        for q in r.target.questions:
            decided[q] = (r.decisions.get(q), r.error)
            aside[q] = r.set_aside
    why_not = {u.question: u.reason for u in skipped}
    verdicts = []
    for v in result.verdicts:
        q = Question(v.key, v.rule)
        d, error = decided.get(q, (None, None))
        if d is not None:
            verdicts.append(confirmed_verdict(v, d, error, aside.get(q, ())))
        elif q in decided or q in why_not:
            verdicts.append(replace(v, warnings=(*v.warnings, f"not confirmed: {error or why_not.get(q)}")))
        else:
            verdicts.append(v)
    order = {name: i for i, name in enumerate(VERDICTS)}
    verdicts.sort(key=lambda v: (order[v.verdict], v.key))
    rules = tuple(rule_report(r.rule, verdicts, {}) if r.pairs else r for r in result.rules)
    confirmed = sum(1 for q, (d, _) in decided.items() if d is not None)
    notes = [*result.notes, *run.notes]
    if decided or skipped:
        notes.append(f"--confirm: {confirmed} pair(s) re-measured alternately (run {run.run_id or '-'})")
    return replace(result, verdicts=tuple(verdicts), rules=rules, notes=tuple(notes))
