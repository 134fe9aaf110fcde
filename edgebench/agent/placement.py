"""Where a model ran: the backend asked for, the unit each op actually ran on, the partitions and the ops
that fell back, with the evidence they were read from and the precision the backend computed in.

Every session reports one (`session.placement()`), normalised across runtimes so the host compares like
with like. A runtime that gives no evidence of where its ops ran says "unknown", never the backend asked
for: the failure this exists to catch is the silent one (a GPU backend that quietly ran on the CPU).

Standard library only: it runs in the agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

CPU = "cpu"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class OpUnit:
    """One op of the model as it ran: its name, its type, and the unit that ran it ("cpu", "vulkan",
    "OpenVINOExecutionProvider" mapped to the runtime's backend name...)."""

    name: str
    op_type: str
    unit: str


@dataclass(frozen=True)
class Placement:
    """What ran where, for one session."""

    requested: str  # the backend asked for, as the runtime names it ("cpu", "vulkan", "openvino", "gpu")
    # What ran: one unit ("vulkan", "cpu"), units joined with "+" in op count order ("vulkan+cpu"), or
    # "unknown" where the runtime gave no evidence
    actual: str
    ops_by_unit: dict[str, int] = field(default_factory=dict)
    # Maximal runs of consecutive ops (execution order) on one unit; None where ops are not known
    partitions: int | None = None
    # Ops that did not run on the requested backend, as "name (type)", in execution order
    fallback_ops: list[str] = field(default_factory=list)
    evidence: str = ""  # where the answer was read from, in a phrase
    # The precision the backend computed in: {"mode": "fp16"|"fp32"|..., runtime option: value...}
    precision: dict[str, Any] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        """The whole model ran on the requested backend, and there is evidence of it."""
        return self.actual == self.requested

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shortfall(self) -> str | None:
        """Why the model did not run wholly on the requested backend, in one line; None when it did."""
        if self.full:
            return None
        if self.actual == UNKNOWN:
            return f"{self.requested} was asked for; where the ops ran is unknown ({self.evidence})"
        if self.requested not in self.ops_by_unit:
            return f"{self.requested} was asked for; the model ran on {self.actual} ({self.evidence})"
        ops = self.fallback_ops
        named = ", ".join(ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "")
        total = sum(self.ops_by_unit.values())
        return (
            f"{self.requested} was asked for; {len(ops)} of {total} ops ran elsewhere ({named}), "
            f"{self.partitions} partitions"
        )


def partitions_of(units: Sequence[str]) -> int:
    """Maximal runs of one unit in `units` (execution order): each change of unit is a boundary where the
    data is copied between the units."""
    return sum(1 for i, unit in enumerate(units) if i == 0 or unit != units[i - 1])


def from_ops(
    requested: str, ops: Iterable[OpUnit], evidence: str, precision: dict[str, Any] | None = None
) -> Placement:
    """The placement read from each op's unit (execution order). No ops: "unknown"."""
    ops = list(ops)
    if not ops:
        return unknown(requested, evidence or "no op placement was reported", precision)
    counts: dict[str, int] = {}
    for op in ops:
        counts[op.unit] = counts.get(op.unit, 0) + 1
    ordered = sorted(counts, key=lambda u: (-counts[u], u != requested, u))
    return Placement(
        requested=requested,
        actual="+".join(ordered),
        ops_by_unit=dict(sorted(counts.items(), key=lambda kv: -kv[1])),
        partitions=partitions_of([op.unit for op in ops]),
        fallback_ops=[f"{op.name} ({op.op_type})" for op in ops if op.unit != requested],
        evidence=evidence,
        precision=dict(precision or {}),
    )


def whole(
    requested: str, unit: str, evidence: str, precision: dict[str, Any] | None = None, ops: int | None = None
) -> Placement:
    """The whole model on one unit, known as a whole (a session that fell back as a whole, or the CPU
    backend of a runtime that has no other)."""
    return Placement(
        requested=requested,
        actual=unit,
        ops_by_unit={unit: ops} if ops is not None else {},
        partitions=1,
        evidence=evidence,
        precision=dict(precision or {}),
    )


def unknown(requested: str, evidence: str, precision: dict[str, Any] | None = None) -> Placement:
    return Placement(requested, UNKNOWN, evidence=evidence, precision=dict(precision or {}))
