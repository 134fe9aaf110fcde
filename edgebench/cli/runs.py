"""Verb: runs (the store's run index: what ran, when, on which devices, at which commit, with which tags)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import typer

from .common import STORE_OPT, note, open_store, print_json, render_table, resolve_runs

_REFS = typer.Argument(
    None, help="Runs to show: ids or references (latest, latest~1, suite:NAME, tag:NAME, a prefix)."
)
_TAG = typer.Option(None, "--tag", help="Only runs with this tag (repeatable: every tag given).")
_KIND = typer.Option(None, "--kind", help="Only runs of this kind (suite, bench, probe, gate, fit ...).")
_SUITE = typer.Option(None, "--suite", help="Only runs of this suite (its name).")
_LIMIT = typer.Option(20, "--limit", "-n", min=0, help="The latest N runs (0: all).")
_ADD_TAG = typer.Option(None, "--add-tag", help="Tag the runs named (repeatable).")
_PRUNE = typer.Option(
    None,
    "--prune-models",
    min=0,
    help="Delete the store's kept model copies (<store>.models/) but those of tagged runs and of the latest "
    "N runs of each suite (what gate --confirm measures again); copies used within the last hour stay.",
)
_IDS = typer.Option(False, "--ids", help="Print run ids only, one a line (for scripts: LAST=$(...)).")
_JSON = typer.Option(False, "--json", help='Print {"runs": [...]} on stdout, nothing else.')


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)


def runs(
    refs: list[str] = _REFS,
    store: Path = STORE_OPT,
    tag: list[str] = _TAG,
    kind: str = _KIND,
    suite: str = _SUITE,
    limit: int = _LIMIT,
    add_tag: list[str] = _ADD_TAG,
    prune_models: int = _PRUNE,
    ids: bool = _IDS,
    as_json: bool = _JSON,
) -> int:
    """List the store's runs: id, kind, suite, status, started, duration, devices, commit, tags."""
    with open_store(store) as st:
        chosen = resolve_runs(st, refs) if refs else None
        if add_tag:
            for run_id in chosen or [st.latest_run().run_id]:
                st.add_tags(run_id, add_tag)
        index = run_index(st)
        if prune_models is not None:
            report, kept_runs = st.prune_models(prune_models)
            note(
                f"edgebench: pruned {len(report.deleted)} model copies ({report.freed_bytes / 1e6:.1f} MB) "
                f"from {st.models.root}; kept {report.kept_bytes / 1e6:.1f} MB for {len(kept_runs)} runs"
            )
    rows = [r for r in index if chosen is None or r["run_id"] in chosen]
    rows = [
        r
        for r in rows
        if (kind is None or r["kind"] == kind)
        and (suite is None or r["suite"] == suite)
        and all(t in r["tags"] for t in tag or [])
    ]
    if chosen is None and limit:
        rows = rows[-limit:]
    if ids:
        for r in rows:
            print(r["run_id"])
    elif as_json:
        print_json({"runs": rows})
    else:
        render_table(
            f"runs in {store} ({len(rows)} of {len(index)})",
            ["id", "kind", "suite", "status", "started", "duration", "devices", "commit", "tags"],
            [
                [
                    r["run_id"],
                    r["kind"],
                    r["suite"] or "-",
                    r["status"] + (f" ({r['gate']['verdict']})" if "gate" in r else ""),
                    r["started"].replace("T", " ")[:19],
                    _duration(r["duration_s"]),
                    ", ".join(r["devices"]) or "-",
                    (r["commit"] or "-")[:10],
                    ", ".join(r["tags"]) or "-",
                ]
                for r in rows
            ],
        )
    return 0


def run_index(st: Any) -> list[dict[str, Any]]:
    """Every run as a flat dict (oldest first), with its devices, commit and tags."""
    tags, devices = st.tags(), st.run_devices()
    gates = {g["run_id"]: g for g in st.gates()}
    out = []
    for r in st.runs():
        row: dict[str, Any] = {
            "run_id": r.run_id,
            "kind": r.kind,
            "suite": r.suite,
            "status": r.status,
            "started": r.created,
            "finished": r.finished,
            "duration_s": seconds_between(r.created, r.finished),
            "devices": devices.get(r.run_id, []),
            "commit": (r.provenance or {}).get("git_commit"),
            "tags": tags.get(r.run_id, []),
        }
        if r.run_id in gates:  # a gate run: what it compared and what it found
            g = gates[r.run_id]
            row["gate"] = {k: g[k] for k in ("baseline", "candidate", "verdict", "exit_code")}
        out.append(row)
    return out


def seconds_between(start: str | None, end: str | None) -> float | None:
    try:
        a = dt.datetime.fromisoformat((start or "").replace("Z", "+00:00"))
        b = dt.datetime.fromisoformat((end or "").replace("Z", "+00:00"))
    except ValueError:
        return None
    return round((b - a).total_seconds(), 3)


def _duration(secs: float | None) -> str:
    if secs is None:
        return "-"
    if secs < 120:
        return f"{secs:.1f} s"
    return f"{secs / 60:.1f} min" if secs < 7200 else f"{secs / 3600:.1f} h"
