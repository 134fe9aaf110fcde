"""Repeated invocations: one job per invocation of a configuration, interleaved across the configurations.

A configuration asked for with `repeats = N` (a bench param) is measured in N independent invocations, each
its own job and so a fresh agent process. They run round-robin, A1 B1 C1 A2 B2 C2 ..., so that a drift of
the device (a neighbour starting, a thermal state, a frequency step) hits every configuration alike rather
than all invocations of one; the gate then judges on the invocations' statistics, not on samples that
share one invocation's disturbance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..jobs import Job


def repeats_of(job: Job) -> int:
    """How many invocations the job's configuration asks for (the `repeats` param; 1 when absent)."""
    value = job.params.get("repeats", 1)
    return value if isinstance(value, int) and value > 1 else 1


def interleave(jobs: Sequence[Job]) -> list[Job]:
    """Each job once per invocation, round by round in the given order; unrepeated jobs run in round 1.

    The order within a device is kept (the fleet runs each device's jobs in list order), so a device's
    configurations alternate: A1 B1 C1 A2 B2 C2 ...
    """
    rounds = max((repeats_of(j) for j in jobs), default=0)
    out: list[Job] = []
    for i in range(1, rounds + 1):
        for job in jobs:
            n = repeats_of(job)
            if n == 1 and i == 1:
                out.append(job)
            elif n > 1 and i <= n:
                out.append(replace(job, invocation=i))
    return out
