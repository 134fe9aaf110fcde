"""The record: one flat schema for CLI output, the store and pandas frames (DESIGN.md)."""

from __future__ import annotations

import datetime as _dt
import json
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

RECORD_FIELDS = ("run_id", "device", "probe", "model", "runtime", "metric", "value", "unit", "params", "ts")


def utc_now() -> str:
    """An ISO-8601 UTC timestamp with a trailing Z."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus random suffix."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class Record:
    """One measurement."""

    run_id: str
    device: str
    probe: str
    model: str | None
    runtime: str | None
    metric: str
    value: float | None
    unit: str
    params: dict[str, Any] = field(default_factory=dict)
    ts: str = field(default_factory=utc_now)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Samples:
    """Raw per-iteration values (latencies, sensor readings) behind the records, so stats can be recomputed.

    `params` matches the params of the records they summarise, minus `stat`.
    """

    run_id: str
    device: str
    probe: str
    model: str | None
    runtime: str | None
    metric: str
    unit: str
    values: tuple[float, ...]
    params: dict[str, Any] = field(default_factory=dict)
    ts: str = field(default_factory=utc_now)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["values"] = list(self.values)
        return d


@dataclass
class RecordContext:
    """Fills the identity fields every record of one job shares."""

    run_id: str
    device: str
    probe: str
    model: str | None = None
    runtime: str | None = None
    base_params: dict[str, Any] = field(default_factory=dict)

    def record(self, metric: str, value: float | None, unit: str, **params: Any) -> Record:
        return Record(
            run_id=self.run_id,
            device=self.device,
            probe=self.probe,
            model=self.model,
            runtime=self.runtime,
            metric=metric,
            value=None if value is None else float(value),
            unit=unit,
            params={**self.base_params, **params},
        )

    def samples(
        self, metric: str, unit: str, values: list[float] | tuple[float, ...], **params: Any
    ) -> Samples:
        return Samples(
            run_id=self.run_id,
            device=self.device,
            probe=self.probe,
            model=self.model,
            runtime=self.runtime,
            metric=metric,
            unit=unit,
            values=tuple(float(v) for v in values),
            params={**self.base_params, **params},
        )


@dataclass
class ProbeResult:
    """What a probe returns for one job: records, their raw samples, and notes for the user."""

    records: list[Record] = field(default_factory=list)
    samples: list[Samples] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def extend(self, other: ProbeResult) -> None:
        self.records.extend(other.records)
        self.samples.extend(other.samples)
        self.warnings.extend(other.warnings)


def params_key(params: dict[str, Any]) -> str:
    """Canonical JSON of params: the key records and samples are paired by."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
