"""Disturbance: what else used the device while a job ran, as records, and the stated thresholds over it.

The agent measures (agent.disturbance); each bench job stores its figures as records of metric
`disturbance_<name>` beside its latencies (same identity, so they pair with the invocation they describe).
A job is *disturbed* when other processes took more than `max_wait` of the CPUs it could run on, its
threads waited on a run queue for more than `max_wait` of the time they wanted a CPU, or a VM's host stole
more than `max_wait` of it. The run-queue wait does not count for a job that ran more threads than it was
allowed CPUs (`threads` > `cpus`, 4 threads on a 2-core board): its threads wait on each other, which is
the job's own cost, not a disturbance (and counting it would make an oversubscription regression NOISY
forever). Others' CPU share and steal still count for it. The gate never fails a pair measured disturbed:
it is NOISY, with the evidence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..records import Record, RecordContext

PREFIX = "disturbance_"
# name in the agent's reply -> unit of its record
FIELDS = {
    "others_cpu_share": "ratio",
    "steal_share": "ratio",
    "runqueue_wait_share": "ratio",
    "freq_min_mhz": "MHz",
    "freq_max_mhz": "MHz",
    "temp_max_c": "C",
    "threads": "count",  # the job's threads (0: the runtime's default, one per CPU)
    "cpus": "count",  # the CPUs it was allowed (at its end)
}
DEFAULT_MAX_WAIT = 0.10


@dataclass(frozen=True)
class Disturbance:
    """One job's (one invocation's) disturbance figures; None where the device could not tell."""

    others_cpu_share: float | None = None
    steal_share: float | None = None
    runqueue_wait_share: float | None = None
    freq_min_mhz: float | None = None
    freq_max_mhz: float | None = None
    temp_max_c: float | None = None
    threads: float | None = None  # 0: the runtime's default
    cpus: float | None = None

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> Disturbance:
        """From the agent's `disturbance` document (unknown keys ignored, non-numbers left out)."""
        return cls(**{k: _number(reply.get(k)) for k in FIELDS})

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> Disturbance:
        """From a job's `disturbance_*` records."""
        found = {r.metric[len(PREFIX) :]: r.value for r in records if r.metric.startswith(PREFIX)}
        return cls(**{k: _number(found.get(k)) for k in FIELDS})

    def to_records(self, ctx: RecordContext) -> list[Record]:
        """One record per known figure (`disturbance_others_cpu_share` ...), with the job's identity."""
        return [
            ctx.record(PREFIX + k, getattr(self, k), unit)
            for k, unit in FIELDS.items()
            if getattr(self, k) is not None
        ]

    @property
    def known(self) -> bool:
        return any(getattr(self, k) is not None for k in ("others_cpu_share", "runqueue_wait_share"))

    @property
    def oversubscribed(self) -> bool:
        """The job ran more threads than it was allowed CPUs. A thread count of 0 (the runtime's default)
        is read as one thread per CPU, and an unknown count or CPU count as not oversubscribed."""
        return bool(self.threads and self.cpus and self.threads > self.cpus)


@dataclass(frozen=True)
class Thresholds:
    """Stated limits: beyond any of them a job counts as disturbed."""

    max_wait: float = DEFAULT_MAX_WAIT  # others' CPU share, run-queue wait share and steal share

    def evidence(self, d: Disturbance) -> str | None:
        """Why the job counts as disturbed ("others used 63% of the CPUs"), or None when it does not.

        A job that ran more threads than CPUs (`Disturbance.oversubscribed`) is not judged on its run-queue
        wait, which its own threads cause; when something else disturbed it, the evidence says the wait
        was left out ("(its run-queue wait, 45%, not counted: 4 threads on 2 CPUs)").
        """
        why = []
        own_wait = ""
        if d.others_cpu_share is not None and d.others_cpu_share > self.max_wait:
            why.append(f"others used {d.others_cpu_share:.0%} of the CPUs")
        if d.runqueue_wait_share is not None and d.runqueue_wait_share > self.max_wait:
            if d.oversubscribed:
                own_wait = (
                    f" (its run-queue wait, {d.runqueue_wait_share:.0%}, not counted: "
                    f"{d.threads:.0f} threads on {d.cpus:.0f} CPUs)"
                )
            else:
                why.append(f"its threads waited {d.runqueue_wait_share:.0%} of their time on a run queue")
        if d.steal_share is not None and d.steal_share > self.max_wait:
            why.append(f"the VM's host stole {d.steal_share:.0%} of the CPUs")
        return "; ".join(why) + own_wait if why else None


def summary(d: Disturbance) -> str:
    """A short line of the figures for tables: `others 12%, wait 3%, 1200-2400 MHz, 48 C` (`wait 45% (4
    threads on 2 CPUs)` where the job's threads outnumbered its CPUs)."""
    parts = []
    if d.others_cpu_share is not None:
        parts.append(f"others {d.others_cpu_share:.0%}")
    if d.runqueue_wait_share is not None:
        own = f" ({d.threads:.0f} threads on {d.cpus:.0f} CPUs)" if d.oversubscribed else ""
        parts.append(f"wait {d.runqueue_wait_share:.0%}{own}")
    if d.steal_share:
        parts.append(f"steal {d.steal_share:.0%}")
    if d.freq_min_mhz is not None and d.freq_max_mhz is not None:
        parts.append(f"{d.freq_min_mhz:.0f}-{d.freq_max_mhz:.0f} MHz")
    if d.temp_max_c is not None:
        parts.append(f"{d.temp_max_c:.0f} C")
    return ", ".join(parts) or "unknown"


def by_job(records: Iterable[Record]) -> dict[tuple[Any, ...], Disturbance]:
    """Each job's disturbance, keyed by (run, device, model, runtime, probe, identity params, invocation)."""
    from ..records import params_key

    grouped: dict[tuple[Any, ...], list[Record]] = {}
    for r in records:
        if r.metric.startswith(PREFIX):
            key = (
                r.run_id,
                r.device,
                r.model or "-",
                r.runtime or "-",
                r.probe,
                params_key(r.params),
                int(r.annotations.get("invocation") or 0),
            )
            grouped.setdefault(key, []).append(r)
    return {k: Disturbance.from_records(v) for k, v in grouped.items()}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
