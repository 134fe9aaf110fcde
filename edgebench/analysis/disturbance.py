"""Disturbance: what else used the device while a job ran, as records, and the stated thresholds over it.

The agent measures (agent.disturbance); each bench job stores its figures as records of metric
`disturbance_<name>` beside its latencies (same identity, so they pair with the invocation they describe).
A job is *disturbed* when other processes took more than `max_wait` of the CPUs it could run on, its
threads waited on a run queue for more than `max_wait` of the time they wanted a CPU, or a VM's host stole
more than `max_wait` of it. The gate never fails a pair measured disturbed: it is NOISY, with the evidence.
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


@dataclass(frozen=True)
class Thresholds:
    """Stated limits: beyond any of them a job counts as disturbed."""

    max_wait: float = DEFAULT_MAX_WAIT  # others' CPU share, run-queue wait share and steal share

    def evidence(self, d: Disturbance) -> str | None:
        """Why the job counts as disturbed ("others used 63% of the CPUs"), or None when it does not."""
        why = []
        if d.others_cpu_share is not None and d.others_cpu_share > self.max_wait:
            why.append(f"others used {d.others_cpu_share:.0%} of the CPUs")
        if d.runqueue_wait_share is not None and d.runqueue_wait_share > self.max_wait:
            why.append(f"its threads waited {d.runqueue_wait_share:.0%} of their time on a run queue")
        if d.steal_share is not None and d.steal_share > self.max_wait:
            why.append(f"the VM's host stole {d.steal_share:.0%} of the CPUs")
        return "; ".join(why) or None


def summary(d: Disturbance) -> str:
    """A short line of the figures for tables: `others 12%, wait 3%, 1200-2400 MHz, 48 C`."""
    parts = []
    if d.others_cpu_share is not None:
        parts.append(f"others {d.others_cpu_share:.0%}")
    if d.runqueue_wait_share is not None:
        parts.append(f"wait {d.runqueue_wait_share:.0%}")
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
