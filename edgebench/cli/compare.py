"""Verb: compare (runs side by side: one column per run, ratios against the first, sorted by change)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import UserError
from .common import STORE_OPT, console, make_table, open_store, print_json, resolve_runs

_RUNS = typer.Argument(
    ..., help="Two or more runs (ids or references: latest, latest~1, suite:NAME, tag:NAME, a prefix)."
)
_METRIC = typer.Option(None, "--metric", "-m", help="Only this metric (repeatable), e.g. latency_ms.")
_COLUMNS = typer.Option(
    None,
    "--columns",
    help="Identity columns shown (comma list): device, model, runtime, probe, metric, stat, params, unit.",
)
_SORT = typer.Option("change", "--sort", help="change (largest first), name or value (of the first run).")
_LIMIT = typer.Option(0, "--limit", "-n", min=0, help="Only the first N rows (0: all).")
_MARKDOWN = typer.Option(False, "--markdown", help="A Markdown table on stdout (for a PR comment).")
_JSON = typer.Option(
    False, "--json", help='Print {"records": [...], "runs": [...], "rows": [...]} on stdout.'
)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)


def compare(
    runs: list[str] = _RUNS,
    store: Path = STORE_OPT,
    metric: list[str] = _METRIC,
    columns: str = _COLUMNS,
    sort: str = _SORT,
    limit: int = _LIMIT,
    markdown: bool = _MARKDOWN,
    as_json: bool = _JSON,
) -> int:
    """Compare runs side by side: one column per run, ratios against the first, sorted by change."""
    from ..analysis.compare import (
        DEFAULT_COLUMNS,
        check_columns,
        compare_runs,
        ratio_text,
        value_text,
    )
    from ..analysis.compare import markdown as to_markdown

    shown = [c.strip() for c in columns.split(",") if c.strip()] if columns else list(DEFAULT_COLUMNS)
    check_columns(shown)
    with open_store(store) as st:
        ids = resolve_runs(st, runs)
        if len(ids) < 2:
            raise UserError(f"compare needs two different runs, got {', '.join(runs)} -> {', '.join(ids)}")
        records = {rid: st.records([rid]) for rid in ids}
    rows = compare_runs(records, metric or None, sort)
    if not rows:
        raise UserError(f"nothing to compare: the runs hold no {'/'.join(metric) if metric else ''} records")
    if limit:
        rows = rows[:limit]
    if as_json:
        print_json(
            {
                "records": [r.to_dict() for rid in ids for r in records[rid]],
                "runs": ids,
                "rows": [row.to_dict(ids) for row in rows],
            }
        )
    elif markdown:
        print(to_markdown(rows, ids, shown), end="")
    else:
        head = [*shown, ids[0]]
        for rid in ids[1:]:
            head += [rid, "ratio"]
        table = make_table(f"compare {len(ids)} runs (ratios against {ids[0]})", head)
        for row in rows:
            cells = [row.cell(c) for c in shown] + [value_text(row.values[0], row.unit)]
            for v, ratio in zip(row.values[1:], row.ratios, strict=True):
                cells += [value_text(v, row.unit), ratio_text(ratio)]
            table.add_row(*cells)
        console().print(table)
    return 0
