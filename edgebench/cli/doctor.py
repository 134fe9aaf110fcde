"""`edgebench doctor --device D`: the harness against bare loops on that device, stored as device health."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..probes.registry import DoctorParams
from ..records import Record
from .common import JSON_OPT, LAB_OPT, STORE_OPT, print_json, records_json, render_table
from .params import probe_flags
from .probe_compute import NO_STORE_OPT, TIMEOUT_OPT, run_one


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


@probe_flags("doctor")
def doctor(
    device: str = typer.Option("local", "--device", "-d"),
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: DoctorParams = DoctorParams(),
) -> int:
    """Device health: harness overhead and noise floor per runtime, timer, governors, probe reach."""
    run_id, records = run_one(device, "doctor", params, timeout, store, no_store, lab)
    flags = next((r.annotations.get("flags") or [] for r in records if r.metric == "health_flags"), [])
    if as_json:
        print_json(records_json(records, run_id=run_id, flags=flags))
        return 0
    render_table(
        f"doctor on {device} (run {run_id})",
        ["check", "runtime", "what", "value", "unit", "reference", "flag"],
        [row(r) for r in records if r.metric != "health_flags"],
    )
    print(f"{device}: {'healthy' if not flags else 'flagged: ' + '; '.join(flags)}")
    return 0


def row(r: Record) -> list[Any]:
    """One line of the table: the figure and what it was held against."""
    a = r.annotations
    what = {k: v for k, v in r.params.items() if k not in ("threads",)} or ""
    reference = {
        "harness_overhead": lambda: f"bare p50 {a.get('bare_p50_ms', 0):.3f} ms",
        "noise_cv": lambda: f"robust CV {a.get('robust_cv', 0):.1%}",
        "probe_reach": lambda: (
            f"bare {a.get('bare_gflops') or a.get('bare_gbps') or 0:.1f}"
            + (" GFLOPS" if "bare_gflops" in a else " GB/s")
        ),
        "cpu_freq_mhz": lambda: f"governor {a.get('governor')}",
        "timer_resolution_ns": lambda: f"read {a.get('read_ns') or 0:.0f} ns",
    }.get(r.metric, lambda: "")()
    return [r.metric, r.runtime or "", what, r.value, r.unit, reference, a.get("flag") or ""]
