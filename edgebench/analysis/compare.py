"""Runs side by side, as `asv compare` and `pytest-benchmark compare` show them: one row per measurement,
one column per run, each later run as a ratio to the first.

Pairing is `Record.key()` and nothing else (device, model, runtime, probe, metric and identity params,
`stat` included), so a row never mixes two measurements. A run holding several records under one key (a
job repeated) shows their median. Pure: records in, rows out.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UserError
from ..records import Record, RecordKey

KEY_COLUMNS = ("device", "model", "runtime", "probe", "metric", "stat", "params", "unit")
DEFAULT_COLUMNS = ("device", "model", "runtime", "probe", "metric", "stat", "params")
SORTS = ("change", "name", "value")


@dataclass(frozen=True)
class CompareRow:
    """One measurement across the runs: its value in each (None where a run lacks it), ratios to the
    first run's value (None where either side is missing or the first is zero)."""

    key: RecordKey
    unit: str
    values: tuple[float | None, ...]

    @property
    def ratios(self) -> tuple[float | None, ...]:
        first = self.values[0]
        return tuple(None if first in (None, 0) or v is None else v / first for v in self.values[1:])

    @property
    def change(self) -> float:
        """The largest change against the first run, as |log ratio| (0 when nothing is comparable)."""
        logs = [abs(math.log(r)) for r in self.ratios if r is not None and r > 0]
        return max(logs, default=0.0)

    def cell(self, column: str) -> str:
        params = self.key.param_dict()
        if column == "stat":
            return str(params.get("stat", ""))
        if column == "params":
            rest = {k: v for k, v in params.items() if k != "stat"}
            return ", ".join(f"{k}={_compact(v)}" for k, v in sorted(rest.items()))
        if column == "unit":
            return self.unit
        return str(getattr(self.key, column))

    def to_dict(self, runs: Sequence[str]) -> dict[str, Any]:
        return {
            "device": self.key.device,
            "model": self.key.model,
            "runtime": self.key.runtime,
            "probe": self.key.probe,
            "metric": self.key.metric,
            "params": self.key.param_dict(),
            "unit": self.unit,
            "values": dict(zip(runs, self.values, strict=True)),
            "ratios": dict(zip(runs[1:], self.ratios, strict=True)),
        }


def compare_runs(
    records: Mapping[str, Sequence[Record]],
    metrics: Sequence[str] | None = None,
    sort: str = "change",
) -> list[CompareRow]:
    """Rows of every measurement any run holds (restricted to `metrics` when given), sorted."""
    if sort not in SORTS:
        raise UserError(f"--sort {sort!r}: use {', '.join(SORTS)}")
    runs = list(records)
    values: dict[RecordKey, list[list[float]]] = defaultdict(lambda: [[] for _ in runs])
    units: dict[RecordKey, str] = {}
    for i, run in enumerate(runs):
        for r in records[run]:
            if metrics and r.metric not in metrics:
                continue
            key = r.key()
            units.setdefault(key, r.unit)
            if r.value is not None and math.isfinite(r.value):
                values[key][i].append(float(r.value))
    rows = [
        CompareRow(key, units[key], tuple(float(np.median(v)) if v else None for v in values[key]))
        for key in units
    ]
    if sort == "name":
        return sorted(rows, key=lambda r: r.key)
    if sort == "value":
        return sorted(rows, key=lambda r: (-(r.values[0] or 0.0), r.key))
    return sorted(rows, key=lambda r: (-r.change, r.key))


def _compact(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), sort_keys=True) if isinstance(v, dict | list) else str(v)


def ratio_text(r: float | None) -> str:
    """1.62x (62% more), 0.50x; '-' when not comparable."""
    if r is None:
        return "-"
    return f"{r:.2f}x" if 0.01 <= r < 1000 else f"{r:.3g}x"


def value_text(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:.4g} {unit}".rstrip()


def markdown(rows: Sequence[CompareRow], runs: Sequence[str], columns: Sequence[str]) -> str:
    """The comparison as a Markdown table (for a PR comment): ratios next to each later run."""
    head = [*columns, f"`{runs[0]}`"]
    for run in runs[1:]:
        head += [f"`{run}`", "ratio"]
    align = ["---"] * len(columns) + ["---:"] * (len(head) - len(columns))
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    for row in rows:
        cells = [row.cell(c).replace("|", "\\|") for c in columns]
        cells.append(value_text(row.values[0], row.unit))
        for v, ratio in zip(row.values[1:], row.ratios, strict=True):
            cells += [value_text(v, row.unit), ratio_text(ratio)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def check_columns(columns: Sequence[str]) -> None:
    for c in columns:
        if c not in KEY_COLUMNS:
            raise UserError(f"--columns {c!r}: use {', '.join(KEY_COLUMNS)}")
