"""`edgebench lab phone|stop`: an emulated phone on loopback for a lab with no phone attached."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import LAB_OPT, note

STATE_OPT = typer.Option(
    Path(".edgebench-lab"), "--state", help="Where the lab keeps its adb server's home and the phone's files."
)
NAME_OPT = typer.Option("phone", "--name", help="Device name (writes LAB/NAME.toml).")
lab_app = typer.Typer(
    help="An emulated phone lab on loopback: a real adb server and an emulated adbd.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")


@lab_app.command("phone")
def phone(lab: Path = LAB_OPT, name: str = NAME_OPT, state: Path = STATE_OPT) -> int:
    """Start an adb server and an emulated phone on loopback (kept running) and write LAB/NAME.toml."""
    from ..testing.adblab import start_phone_lab

    started = start_phone_lab(lab, name, state)
    verb = "started" if started.started else "already running:"
    note(
        f"edgebench: lab {verb} emulated phone {name} at {started.serial} (adb server {started.adb_server}, "
        f"supervisor pid {started.pid}); descriptor {started.descriptor}; stop with "
        f"`edgebench lab stop --name {name}`"
    )
    return 0


@lab_app.command("stop")
def stop(name: str = NAME_OPT, state: Path = STATE_OPT) -> int:
    """Stop the emulated phone NAME and its adb server (the descriptor is kept)."""
    from ..testing.adblab import stop_phone_lab

    stopped = stop_phone_lab(name, state)
    note(f"edgebench: lab {name} {'stopped' if stopped else 'was not running'}")
    return 0
