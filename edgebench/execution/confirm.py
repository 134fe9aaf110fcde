"""`gate --confirm`: measure a gated pair's baseline model and candidate model again on the same device,
alternately, and judge the pairs (`analysis.confirm`).

The baseline's model comes from the store's kept copy (`results.models`), since last night's file may have
changed on disk since; the candidate's too, for the same reason. Both run as their stored jobs ran (same
probe, runtime and params) through the ordinary device session (`execution.session.LocalSession`: lease,
health check, transport retries), so this works on the local host, ssh boards and adb phones alike.

Order: A B, then B A, then A B ...: a drift or a neighbour hits both sides of the pairs alike. The cool-down
guard is off between these jobs: the alternation, not waiting, is what makes the sides comparable, and
the budget would go on waiting. Pairs are measured one at a time and judged at the scheduled looks
(`analysis.confirm.look_schedule`: at 8 and 20 pairs for 20 at alpha 0.01, alpha split between them)
until every question the pair answers is settled, `max_pairs` are measured or the next pair would overrun
the time budget (shared out among the targets still to confirm): judged then, NOISY if still open.

Every job is stored in one run of kind `confirm` (its records annotated with `confirm_side`,
`confirm_pair` and `model_sha256`), so the evidence can be read again.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..analysis.confirm import PairedDecision, decide, look_schedule
from ..analysis.disturbance import DEFAULT_MAX_WAIT, Disturbance
from ..analysis.gate import (
    DISTURBANCE_WORDS,
    FAIL,
    IMPROVED,
    INCOMPLETE,
    NOISY,
    PASS,
    GateRule,
    PairKey,
    collect_side,
    with_rule_stats,
)
from ..descriptors import DeviceSpec
from ..errors import EdgebenchError, one_line
from ..jobs import Job, JobOutcome, ModelRef
from ..records import new_run_id, params_as_recorded
from ..results.models import JobModel
from ..results.store import Store
from .provenance import host_provenance
from .session import LocalSession
from .spool import JobWriter, StoreTrouble, store_spooled
from .suite import RunPolicy

CONFIRMABLE = (FAIL, NOISY, INCOMPLETE)
BASELINE, CANDIDATE = "baseline", "candidate"


@dataclass(frozen=True)
class ConfirmBudget:
    """How much re-measuring a gate may do: seconds in all, pairs per target, and alpha (shared by the
    looks at each target's pairs)."""

    seconds: float = 300.0
    max_pairs: int = 20
    alpha: float = 0.01
    # A pair whose two sides' measured disturbance differs by more than this share (others' CPU share,
    # run-queue wait or steal) is set aside and measured again: a neighbour met one side only
    max_wait: float = DEFAULT_MAX_WAIT


@dataclass(frozen=True)
class Question:
    """One gated pair a target's measurements answer."""

    key: PairKey
    rule: GateRule


@dataclass(frozen=True)
class ConfirmTarget:
    """A baseline job and a candidate job to measure alternately, and the questions their pairs answer."""

    device: str
    baseline: Job
    candidate: Job
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Unconfirmable:
    """A question that cannot be measured again, and why (no kept model, no stored job ...)."""

    question: Question
    reason: str


@dataclass
class TargetResult:
    """What measuring one target gave: a decision per question (None where none could be made), the
    values per side, and the error that stopped it, if any."""

    target: ConfirmTarget
    decisions: dict[Question, PairedDecision] = field(default_factory=dict)
    values: dict[Question, tuple[list[float], list[float]]] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    set_aside: list[str] = field(default_factory=list)  # pairs not judged: one side met a neighbour alone


@dataclass
class ConfirmRun:
    run_id: str
    results: list[TargetResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---- planning: which stored jobs measured a pair, and their kept models ----------------------------------
def _job_matches(job: JobModel, key: PairKey) -> bool:
    """Whether the job measured the pair: by the identity params its stored records carry, which is what
    the pair was made of; a job known without its records (`Store.jobs`) by its params as records
    would carry them (`params_as_recorded`)."""
    if (job.device, job.probe, job.model) != (key.device, key.probe, key.model):
        return False
    if job.runtime is not None and job.runtime != key.runtime:  # None: the model format's default runtime
        return False
    if job.status != "ok":
        return False
    if job.identities:
        return key.params in job.identities
    return params_as_recorded(job.params, json.loads(key.params))


def disturbed_jobs(key: PairKey, jobs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The warnings of the stored jobs (`Store.jobs`) that measured the pair and said the device was
    disturbed (outliers, no cool-down, transport retries): reason enough to confirm a PASS."""
    found = []
    for j in jobs:
        model = JobModel(
            0, "", j["device"], j["probe"], j["model"] or "", j["runtime"], j["params"], j["status"], "", None
        )
        if _job_matches(model, key):
            found += [w for w in j.get("warnings") or [] if any(d in w.lower() for d in DISTURBANCE_WORDS)]
    return found


def _job_for(found: Sequence[JobModel], key: PairKey, side: str) -> JobModel | str:
    """The side's last ok job that measured the pair, with a kept model; else why there is none."""
    mine = [j for j in found if _job_matches(j, key)]
    if not mine:
        same = [j for j in found if (j.device, j.probe, j.model) == (key.device, key.probe, key.model)]
        if same:
            return f"no ok job of the {side} run measured {key.label()}"
        return f"the {side} run kept no model for it (stored before schema 4, or not a model job)"
    job = mine[-1]
    if job.path is None:
        return f"the {side} run's copy of {job.model} (sha256 {job.sha256[:12]}) is not in the model store"
    return job


def plan(
    verdicts: Sequence[Any],
    baseline_jobs: Sequence[JobModel],
    candidate_jobs: Sequence[JobModel],
    disturbed: Callable[[PairKey], bool] = lambda key: False,
) -> tuple[list[ConfirmTarget], list[Unconfirmable]]:
    """Targets for the gate's FAIL, NOISY and INCOMPLETE pairs that both sides measured, and for PASS or
    IMPROVED pairs whose jobs said the device was disturbed (`disturbed`: a disturbed baseline can hide a
    slowdown as well as a disturbed candidate can fake one); the others say why they cannot be confirmed.
    Pairs measured by the same two jobs share one target."""
    grouped: dict[tuple[int, int], list[Question]] = {}
    jobs: dict[int, JobModel] = {}
    skipped = []
    for v in verdicts:
        if v.baseline is None or v.candidate is None:
            continue
        if v.verdict not in CONFIRMABLE and not (v.verdict in (PASS, IMPROVED) and disturbed(v.key)):
            continue
        q = Question(v.key, v.rule)
        base, cand = _job_for(baseline_jobs, v.key, BASELINE), _job_for(candidate_jobs, v.key, CANDIDATE)
        if isinstance(base, str) or isinstance(cand, str):
            skipped.append(Unconfirmable(q, base if isinstance(base, str) else str(cand)))
            continue
        jobs[base.job_id], jobs[cand.job_id] = base, cand
        grouped.setdefault((base.job_id, cand.job_id), []).append(q)
    targets = [
        ConfirmTarget(jobs[b].device, _job(jobs[b]), _job(jobs[c]), tuple(qs))
        for (b, c), qs in grouped.items()
    ]
    return targets, skipped


def _job(found: JobModel) -> Job:
    assert found.path is not None
    return Job(
        device=found.device,
        probe=found.probe,
        model=ModelRef(found.model, found.path),
        runtime=found.runtime,
        params=dict(found.params),
        identity={"model": f"sha256:{found.sha256}"},
    )


# ---- measuring ----------------------------------------------------------------------------------------
def value_of(outcome: JobOutcome, q: Question) -> float | None:
    """The question's statistic in one job's records (from its samples when no record holds it)."""
    sides = with_rule_stats(collect_side(outcome.records, outcome.samples), [q.rule])
    side = sides.get(q.key)
    if side is None or not math.isfinite(side.value):
        return None
    return side.value


def _annotated(outcome: JobOutcome, side: str, pair: int) -> JobOutcome:
    sha = outcome.job.identity.get("model", "").removeprefix("sha256:")
    extra = {"confirm_side": side, "confirm_pair": pair, "model_sha256": sha}
    outcome.records = [replace(r, annotations={**r.annotations, **extra}) for r in outcome.records]
    outcome.samples = [replace(s, annotations={**s.annotations, **extra}) for s in outcome.samples]
    return outcome


class _Measure:
    """One device's session and the run's writer: run a job, store it, hand back the outcome."""

    def __init__(self, session: LocalSession, writer: JobWriter | None) -> None:
        self.session = session
        self.writer = writer

    def __call__(self, job: Job, side: str, pair: int) -> JobOutcome:
        job = replace(job, identity={**job.identity, "confirm": f"{side}/{pair}"})
        outcome = _annotated(self.session.run(job, first=False), side, pair)
        if self.writer is not None:
            self.writer.save_job(outcome)
        return outcome


MeasureFn = Callable[[Job, str, int], JobOutcome]


def confirm_target(
    measure: MeasureFn,
    target: ConfirmTarget,
    budget: ConfirmBudget,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> TargetResult:
    """Measure A B / B A pairs, judged at the scheduled looks, until every question is settled, or
    max_pairs, or the deadline; never raises for a failed job (the result carries its error and the
    decisions so far)."""
    result = TargetResult(target, values={q: ([], []) for q in target.questions})
    looks = look_schedule(budget.alpha, budget.max_pairs)
    start, n, tried = clock(), 0, 0
    while True:
        order = [(BASELINE, target.baseline), (CANDIDATE, target.candidate)]
        got: dict[str, JobOutcome] = {}
        for side, job in order if tried % 2 == 0 else order[::-1]:
            got[side] = outcome = measure(job, side, tried)
            if not outcome.ok:
                result.error = f"{side} job failed: {outcome.error}"
                break
        tried += 1
        lopsided = None if result.error else unbalanced(got[BASELINE], got[CANDIDATE], budget.max_wait)
        if lopsided:
            result.set_aside.append(f"pair {tried}: {lopsided}")
        elif result.error is None:
            for q in target.questions:
                a, b = value_of(got[BASELINE], q), value_of(got[CANDIDATE], q)
                if a is None or b is None or (q.rule.threshold.relative and min(a, b) <= 0):
                    result.error = f"pair {n + 1} measured no usable {q.key.metric} for {q.key.label()}"
                    break
                result.values[q][0].append(a)
                result.values[q][1].append(b)
        if result.error is None and not lopsided:
            n += 1
        result.seconds = clock() - start
        per_pair = result.seconds / max(tried, 1)
        last = (
            result.error is not None
            or n >= budget.max_pairs
            or tried >= 2 * budget.max_pairs  # as many set aside as judged: the device is not steady
            or clock() + per_pair > deadline
        )
        # A look the budget forces before the next scheduled one takes its place: never more looks than
        # the schedule split alpha among.
        if n and ((n in looks.pairs and not lopsided) or last):
            k = len(looks.pairs)
            result.decisions = {
                q: decide(*result.values[q], q.rule, budget.alpha, final=last, looks=k)
                for q in target.questions
            }
            if last or all(d.conclusive for d in result.decisions.values()):
                return result
        elif last:
            return result


def unbalanced(baseline: JobOutcome, candidate: JobOutcome, max_wait: float) -> str | None:
    """Why a pair's sides met different disturbance (a share of others' CPU time, run-queue wait or steal
    apart by more than `max_wait`), or None. Load both sides met alike is what alternation cancels (two
    busy loops throughout: every pair balanced); a neighbour that came for one side only is not."""
    a, b = Disturbance.from_records(baseline.records), Disturbance.from_records(candidate.records)
    for name in ("others_cpu_share", "runqueue_wait_share", "steal_share"):
        x, y = getattr(a, name), getattr(b, name)
        if x is not None and y is not None and abs(x - y) > max_wait:
            return f"{name.replace('_', ' ')} {x:.0%} (baseline) against {y:.0%} (candidate)"
    return None


def confirm(
    specs: Mapping[str, DeviceSpec],
    targets: Sequence[ConfirmTarget],
    store_path: Path | None,
    budget: ConfirmBudget,
    *,
    gate: Mapping[str, str] | None = None,
    lock_dir: Path | None = None,
    lease_timeout_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ConfirmRun:
    """Confirm every target, device by device, as one stored run of kind `confirm` (`gate`: the runs it
    confirms, kept in the run's provenance). The time budget is shared: each target may use what is left
    divided by the targets still to go."""
    run = ConfirmRun(new_run_id())
    store = Store(store_path) if store_path is not None and targets else None
    writer = JobWriter(store, run.run_id) if store else None
    ends_by = clock() + budget.seconds
    left = len(targets)
    try:
        if store and writer:
            store_spooled(store)
            store.begin_run(run.run_id, "confirm", {**host_provenance(), "confirm": dict(gate or {})})
        for device in dict.fromkeys(t.device for t in targets):
            mine = [t for t in targets if t.device == device]
            policy = replace(RunPolicy(), cooldown=False, lease_timeout_s=lease_timeout_s)
            session = LocalSession(specs[device], run.run_id, policy, lock_dir=lock_dir)
            try:
                ready = session.prepare(lambda state, detail: None)
                if writer:
                    writer.save_device(ready.device, ready.fingerprint, ready.descriptor)
                measure = _Measure(session, writer)
                while mine:
                    deadline = clock() + max(0.0, ends_by - clock()) / max(left, 1)
                    run.results.append(confirm_target(measure, mine.pop(0), budget, deadline, clock))
                    left -= 1
            except EdgebenchError as exc:  # the device could not be used: its targets say why
                run.results += [TargetResult(t, error=f"{device}: {one_line(exc)}") for t in mine]
                left -= len(mine)
            finally:
                session.close()
    finally:
        if store and writer:
            _finish(writer, run)
            store.close()
    return run


def _finish(writer: JobWriter, run: ConfirmRun) -> None:
    status = "ok" if all(r.error is None for r in run.results) else "failed"
    try:
        writer.finish_run(status)
        note = writer.close(wait_s=0.0)
    except StoreTrouble as exc:
        note = one_line(exc)
    if note:
        run.notes.append(note)
