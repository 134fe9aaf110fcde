"""The record: one flat schema for CLI output, the store and pandas frames (DESIGN.md).

A record's `params` say *what* was measured (model shapes, threads, dtype, the statistic...) and nothing
else, so two records with equal keys measured the same thing and may be compared; everything else about it
(inputs actually used, effective values seen, sizes, paths, versions, sample counts) goes in `annotations`.
`Record.key()` is the one pairing rule: gates, history, report deltas, fit and interop all pair by it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

RECORD_FIELDS = (
    "run_id", "device", "probe", "model", "runtime", "metric", "value", "unit", "params", "ts", "annotations",
)  # fmt: skip


def utc_now() -> str:
    """An ISO-8601 UTC timestamp with a trailing Z."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus random suffix."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def params_key(params: dict[str, Any]) -> str:
    """Canonical JSON of params: equal params, equal text."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def params_as_recorded(params: Mapping[str, Any], identity: Mapping[str, Any]) -> bool:
    """Whether a job's params agree with a record's identity params, read as records are made
    (`ProbeParams.identity`): a host path by its file name, and threads 0 (the runtime's default) as the
    count the runtime reported, whatever it was."""
    for k, v in params.items():
        if k not in identity or identity[k] == v:
            continue
        if k == "threads" and v == 0:
            continue
        if isinstance(v, str) and os.path.basename(v) == identity[k]:
            continue
        return False
    return True


@dataclass(frozen=True, order=True)
class RecordKey:
    """What makes two records (or a record and its samples) the same measurement across runs."""

    device: str
    model: str
    runtime: str
    probe: str
    metric: str
    params: str  # canonical JSON of the identity params, `stat` included

    @property
    def stat(self) -> str:
        return str(self.param_dict().get("stat", ""))

    def param_dict(self) -> dict[str, Any]:
        return dict(json.loads(self.params))

    def series(self) -> RecordKey:
        """The key of the raw samples behind this record: the same measurement, any statistic."""
        rest = {k: v for k, v in self.param_dict().items() if k != "stat"}
        return RecordKey(self.device, self.model, self.runtime, self.probe, self.metric, params_key(rest))

    def label(self) -> str:
        rest = {k: v for k, v in self.param_dict().items() if k != "stat"}
        p = params_key(rest) if rest else ""
        stat = f"[{self.stat}]" if self.stat else ""
        return f"{self.device} {self.model} {self.runtime} {self.probe}:{self.metric}{stat} {p}".strip()


def make_key(
    device: str, model: str | None, runtime: str | None, probe: str, metric: str, params: dict[str, Any]
) -> RecordKey:
    return RecordKey(device, model or "-", runtime or "-", probe, metric, params_key(params))


@dataclass(frozen=True)
class Record:
    """One measurement: identity in `params`, everything else about it in `annotations`."""

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
    annotations: dict[str, Any] = field(default_factory=dict)

    def key(self) -> RecordKey:
        """The pairing rule: same device, model, runtime, probe, metric and identity params."""
        return make_key(self.device, self.model, self.runtime, self.probe, self.metric, self.params)

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
    annotations: dict[str, Any] = field(default_factory=dict)

    def key(self) -> RecordKey:
        """Equal to `record.key().series()` of the records these samples are behind."""
        return make_key(self.device, self.model, self.runtime, self.probe, self.metric, self.params)

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
    base_annotations: dict[str, Any] = field(default_factory=dict)

    def record(
        self,
        metric: str,
        value: float | None,
        unit: str,
        annotations: dict[str, Any] | None = None,
        **params: Any,
    ) -> Record:
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
            annotations={**self.base_annotations, **(annotations or {})},
        )

    def samples(
        self,
        metric: str,
        unit: str,
        values: list[float] | tuple[float, ...],
        annotations: dict[str, Any] | None = None,
        **params: Any,
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
            annotations={**self.base_annotations, **(annotations or {})},
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
