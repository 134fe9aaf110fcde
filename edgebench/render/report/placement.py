"""The report's "where it ran" section: for every run on a backend other than the CPU, the backend asked
for, the unit(s) that ran it, ops per unit, partitions, the ops that fell back and the precision it
computed in, with the evidence each was read from (agent.placement, recorded with every number).

A model whose ops left the backend asked for is marked, so a GPU figure that was in fact the CPU's is seen
beside the figure, not found later. Pure, like the other sections: ReportData in, (HTML, has data) out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...records import Record
from .data import ReportData
from .markup import esc, nodata, table


def placements(records: Sequence[Record]) -> list[dict[str, Any]]:
    """One row per (device, model, runtime, backend, precision asked, run): the newest run last, read
    from the first record of each that carries a placement."""
    rows: dict[tuple, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r.run_id):
        placed = r.annotations.get("placement")
        if not isinstance(placed, Mapping) or placed.get("requested") in (None, "cpu"):
            continue
        asked = str(placed.get("requested"))
        precision = r.params.get("precision")
        remedy = r.params.get("remedy")
        key = (r.device, r.model or "", r.runtime or "", asked, precision, remedy, r.run_id)
        rows.setdefault(key, {"record": r, "placement": placed, "asked": asked, "remedy": remedy})
    return list(rows.values())


def _ops_text(placed: Mapping[str, Any]) -> str:
    counts = placed.get("ops_by_unit") or {}
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))  # stored JSON keeps no order
    return ", ".join(f"{n} {unit}" for unit, n in ordered) or "not counted"


def _fallback_text(placed: Mapping[str, Any]) -> str:
    ops = list(placed.get("fallback_ops") or [])
    if not ops:
        return "none" if placed.get("actual") == placed.get("requested") else "–"
    return ", ".join(ops[:6]) + (f" and {len(ops) - 6} more" if len(ops) > 6 else "")


def _precision_text(placed: Mapping[str, Any], asked: Any) -> str:
    mode = (placed.get("precision") or {}).get("mode") or "unknown"
    return f"{mode} (asked {asked})" if asked else f"{mode} (the backend's default)"


COLUMNS = ("device", "model", "runtime", "probe", "asked", "ran on", "ops per unit", "partitions",
           "fell back", "precision", "evidence", "run")  # fmt: skip


def text_rows(records: Sequence[Record]) -> list[tuple[list[str], bool]]:
    """Each placement as the section's cells (COLUMNS, plain text) and whether the model ran wholly on the
    backend asked for."""
    out = []
    for row in placements(records):
        r, placed = row["record"], row["placement"]
        partitions = placed.get("partitions")
        cells = [
            r.device,
            r.model or "",
            r.runtime or "",
            r.probe + (f" ({row['remedy']})" if row["remedy"] else ""),
            row["asked"],
            str(placed.get("actual")),
            _ops_text(placed),
            str(partitions) if partitions is not None else "unknown",
            _fallback_text(placed),
            _precision_text(placed, r.params.get("precision")),
            str(placed.get("evidence") or ""),
            r.run_id,
        ]
        out.append((cells, placed.get("actual") == row["asked"]))
    return out


NOTE = (
    "Where each run on an accelerator backend actually ran, read back from the runtime (never the backend "
    'asked for): each partition boundary copies data between units; "unknown" where the runtime gave no '
    "evidence."
)


def where_it_ran(d: ReportData) -> tuple[str, bool]:
    found = text_rows(d.measurements)
    if not found:
        return nodata("runs on a backend other than the CPU (--backend)"), False
    rows = []
    for cells, full in found:
        html = [esc(c) for c in cells]
        if not full:
            html[5] += ' <span class="badge no">not wholly on it</span>'
        rows.append(html)
    return f"<p>{esc(NOTE)}</p>" + table(list(COLUMNS), rows, raw=True), True
