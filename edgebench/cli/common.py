"""Options and output helpers shared by the verbs: store, lab, devices, JSON on stdout, notes on stderr."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from ..descriptors import Lab, load_lab
from ..errors import UserError
from ..lab.device import Device
from ..records import Record

STORE_OPT = typer.Option(Path("edgebench.db"), "--store", help="SQLite result store.")
LAB_OPT = typer.Option(Path("devices"), "--lab", help="Folder of device descriptors.")
JSON_OPT = typer.Option(False, "--json", help='Print {"records": [...]} on stdout, nothing else.')
LOCK_DIR_OPT = typer.Option(
    None,
    "--lock-dir",
    help="Folder of device leases shared by every run on this host (default: EDGEBENCH_LOCK_DIR or "
    "~/.cache/edgebench/locks).",
)


def positive_seconds(value: float | None) -> float | None:
    """Typer callback for time limits: nan, inf, zero and negatives are refused, naming the flag (exit 2)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a positive number of seconds, got {value:g}")
    return value


LEASE_TIMEOUT_OPT = typer.Option(
    None,
    "--lease-timeout",
    callback=positive_seconds,
    help="Give up when another run holds the device for longer than this, s (default: wait).",
)


def note(message: str) -> None:
    """Progress, warnings and logs: always stderr, so --json stdout stays clean."""
    print(message, file=sys.stderr, flush=True)


def warn(messages: Iterable[str], prefix: str = "") -> None:
    for m in messages:
        note(f"edgebench: warning: {prefix}{m}")


def print_json(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, indent=1, default=str, allow_nan=False) + "\n")
    sys.stdout.flush()


def records_json(records: Iterable[Record], **extra: Any) -> dict[str, Any]:
    return {"records": [_finite(r.to_dict()) for r in records], **extra}


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    v = d.get("value")
    if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
        d["value"] = None
    return d


def device_waits(device: str) -> Callable[[str, str], None]:
    """A session's on_state for one-shot verbs: say on stderr who holds the device while the verb waits."""

    def on_state(state: str, detail: str) -> None:
        if state == "queued":
            note(f"edgebench: {device}: waiting: {detail}")

    return on_state


def parse_shapes(values: list[str] | None) -> dict[str, list[int]]:
    """--shape NAME=1x3x224x224 (repeatable), checked as every probe's `shapes` is."""
    from ..probes.params import ParamError, Spec, convert

    names = [str(v).partition("=")[0].strip() for v in values or []]
    twice = next((n for i, n in enumerate(names) if n and n in names[:i]), None)
    if twice is not None:
        raise UserError(f"--shape: input '{twice}' is given twice")
    try:
        shapes = convert("shapes", list(values or []), Spec("shapes", "identity", "")) if values else None
    except ParamError as exc:
        raise UserError(f"--shape: {exc.reason}") from None
    return {k: list(v) for k, v in (shapes or {}).items()}


def open_lab(lab: Path) -> Lab:
    return load_lab(lab)


@contextmanager
def connected(lab: Lab, name: str):
    """Open the named device for the duration of a command."""
    spec = lab.get(name)
    device = Device(spec)
    try:
        yield device
    finally:
        device.close()


PIPE_WIDTH = 100_000  # "unlimited": a table in a pipe or a CI log takes its natural width, never folds


def console(stderr: bool = False):
    """A Rich console for tables: the terminal's width on a terminal; in a pipe, a file or a CI log no
    width limit (nothing truncated or folded into 80 columns) and no colour codes."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(file=stream, soft_wrap=False)
    return Console(file=stream, width=PIPE_WIDTH, soft_wrap=True, no_color=True, highlight=False)


def make_table(title: str | None, columns: list[str]):
    """A Rich table whose title and headers are plain text (no markup: `[[gate]]` stays as written)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title) if title else None)
    for c in columns:
        table.add_column(Text(c), overflow="fold")
    return table


def render_table(title: str, columns: list[str], rows: list[list[Any]], stderr: bool = False) -> None:
    """A table of plain values (escaped, never read as markup), full width when not on a terminal."""
    from rich.text import Text

    table = make_table(title, columns)
    for row in rows:
        table.add_row(*[v if _is_renderable(v) else Text(_cell(v)) for v in row])
    console(stderr).print(table)


def _is_renderable(v: Any) -> bool:
    from rich.text import Text

    return isinstance(v, Text)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_cell(x)}" for k, x in v.items())
    return str(v)


def open_store(path: Path):
    """A store that must already exist: reading never creates an empty one."""
    from ..results.store import Store

    if not path.exists():
        raise UserError(f"{path}: no such store")
    return Store(path)


def resolve_runs(store: Any, refs: Iterable[str], what: str = "run") -> list[str]:
    """Run references (ids, latest, latest~N, suite:NAME, tag:NAME, prefixes) as run ids, in order."""
    return list(dict.fromkeys(store.resolve_run(r, what) for r in refs))
