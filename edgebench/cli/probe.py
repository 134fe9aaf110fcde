"""`edgebench probe KIND`: one sub-command per probe kind, each added by its own module."""

from __future__ import annotations

import importlib

import typer

# Modules under edgebench.cli that add `probe` sub-commands; each has register(probe_app).
PROBE_COMMAND_MODULES: tuple[str, ...] = (
    "probe_sustained",
    "probe_compute",
    "probe_workloads",
    "probe_decode",
)


def register(app: typer.Typer) -> None:
    probe_app = typer.Typer(no_args_is_help=True, help="Measure what a device really delivers.")
    for name in PROBE_COMMAND_MODULES:
        importlib.import_module(f"{__package__}.{name}").register(probe_app)
    app.add_typer(probe_app, name="probe")
