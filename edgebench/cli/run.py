"""Verbs: run (a suite over the fleet) and worker (a Dask worker holding this host's devices)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from ..jobs import JobOutcome
from .common import (
    LAB_OPT,
    LOCK_DIR_OPT,
    STORE_OPT,
    console,
    note,
    open_store,
    positive_seconds,
    print_json,
    records_json,
)

SUITE_ARG = typer.Argument(..., help="Suite file (TOML).")
RESUME_OPT = typer.Option(
    None,
    "--resume",
    help="Finish run RUN_ID: only its jobs with no ok record run, appended to the same run. Also a "
    "reference: latest (this suite's latest run), latest~N (the one N before it), tag:NAME or an id prefix.",
)
TAG_OPT = typer.Option(None, "--tag", help="Tag the run (repeatable), e.g. --tag nightly --tag rc-1.2.")
CLUSTER_OPT = typer.Option(
    None, "--cluster", help="Dask scheduler tcp://HOST:PORT; devices resolve on its workers."
)
TIMEOUT_OPT = typer.Option(
    None,
    "--timeout",
    callback=positive_seconds,
    help="Bound on every remote call of each job (default: suite, then descriptor).",
)
RUN_JSON_OPT = typer.Option(False, "--json", help="Print {run_id, status, records, errors} on stdout.")
SCHEDULER_OPT = typer.Option(..., "--scheduler", help="Dask scheduler address, tcp://HOST:PORT.")
DEVICE_OPT = typer.Option(
    None, "--device", "-d", help="Serve only these devices (repeatable; default: every device of the lab)."
)
NAME_OPT = typer.Option(None, "--name", help="Worker name shown by the scheduler.")
HOST_OPT = typer.Option(None, "--host", help="Address to listen on (default: chosen by Dask).")
IDLE_OPT = typer.Option(
    60.0, "--idle-release", min=1.0, help="Release a run's device lease after this many idle seconds."
)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("worker")(worker)


def run(
    suite: Path = SUITE_ARG,
    lab: Path = LAB_OPT,
    store: Path = STORE_OPT,
    resume: str = RESUME_OPT,
    cluster: str = CLUSTER_OPT,
    timeout: float = TIMEOUT_OPT,
    lock_dir: Path = LOCK_DIR_OPT,
    tag: list[str] = TAG_OPT,
    as_json: bool = RUN_JSON_OPT,
) -> int:
    """Run a suite: every device in parallel, its jobs in series, each job stored as it finishes."""
    from ..descriptors import load_lab
    from ..execution.fleet import run_suite
    from ..execution.suite import load_suite
    from ..results.store import Store, check_tag

    for t in tag or []:
        check_tag(t)
    the_suite = load_suite(suite)
    the_lab = None if cluster else load_lab(lab)
    if resume is not None:
        with open_store(store) as st:
            resume = _resume_run(st, resume, the_suite.name)
    _terminate_as_interrupt()
    with _Progress() as progress:
        result = run_suite(
            the_suite,
            store_path=store,
            lab=the_lab,
            resume=resume,
            cluster=cluster,
            timeout_s=timeout,
            lock_dir=lock_dir,
            observer=progress,
            argv=sys.argv[1:],
        )
    if tag:
        with Store(store) as st:
            st.add_tags(result.run_id, tag)
    _summary(result, suite)
    for line in result.notes:
        note(f"edgebench: {line}")
    if as_json:
        with Store(store) as st:
            records, errors = st.records([result.run_id]), st.errors([result.run_id])
        # Jobs the store still refused are in their spool; their records are printed all the same.
        records += [r for o in result.unstored for r in o.records]
        errors += [{**o.error_dict(), "run_id": result.run_id} for o in result.unstored if not o.ok]
        extra = {"store_error": result.store_error} if result.store_error else {}
        print_json(
            records_json(
                records,
                run_id=result.run_id,
                status=result.status,
                errors=errors,
                summary=[_summary_dict(s) for s in result.devices.values()],
                exit_code=result.exit_code,
                **extra,
            )
        )
    if result.store_error:
        note(f"edgebench: error: {result.store_error}")
    return result.exit_code


def worker(
    scheduler: str = SCHEDULER_OPT,
    lab: Path = LAB_OPT,
    device: list[str] = DEVICE_OPT,
    name: str = NAME_OPT,
    host: str = HOST_OPT,
    idle_release: float = IDLE_OPT,
    lock_dir: Path = LOCK_DIR_OPT,
) -> int:
    """Run a Dask worker that holds this host's devices, one resource `device:NAME` each."""
    from ..execution.cluster import serve_worker

    def ready(address: str, names: list[str]) -> None:
        note(f"edgebench: worker {address} joined {scheduler}; devices: {', '.join(names)}")

    serve_worker(
        scheduler,
        lab,
        devices=device or None,
        name=name,
        host=host,
        lock_dir=lock_dir,
        idle_release_s=idle_release,
        on_ready=ready,
    )
    note("edgebench: worker stopped")
    return 0


def _resume_run(st: Any, ref: str, suite: str) -> str:
    """The run --resume names: `latest` and `latest~N` count this suite's runs only (a `fit` or `bench`
    stored since is not what a resume means); ids, prefixes and tags resolve over the whole store."""
    from ..results.store import resolve_run_ref

    if ref == "latest" or ref.startswith("latest~"):
        own = [r for r in st.runs() if r.suite == suite and r.kind == "suite"]
        return resolve_run_ref(ref, own, st.tags(), f"--resume run '{ref}' of suite '{suite}' in {st.path}")
    return str(st.resolve_run(ref, "--resume run"))


def _terminate_as_interrupt() -> None:
    """cron and CI stop jobs with SIGTERM: stop like Ctrl-C (run marked interrupted, stored jobs kept)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


class _Progress:
    """Per-device progress on stderr: live bars on a terminal, one line per event otherwise (cron logs)."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._done: dict[str, int] = {}

    def __enter__(self) -> _Progress:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.fields[device]}", style="bold", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=Console(stderr=True),
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def planned(self, device: str, total: int, skipped: int) -> None:
        self._done[device] = skipped
        if self._progress is not None:
            self._tasks[device] = self._progress.add_task(
                device, total=total, completed=skipped, device=device, status="waiting"
            )
        elif skipped:
            note(f"edgebench: [{device}] {skipped} of {total} jobs already done, skipped")

    def state(self, device: str, state: str, detail: str) -> None:
        text = f"{state}: {detail}" if detail else state
        if self._progress is not None:
            from rich.markup import escape

            self._progress.update(self._tasks[device], status=escape(text))
        elif state not in ("running", "lease", "connecting", "ok"):
            note(f"edgebench: [{device}] {text}")

    def job_done(self, outcome: JobOutcome) -> None:
        device = outcome.job.device
        self._done[device] = self._done.get(device, 0) + 1
        if self._progress is not None:
            self._progress.update(self._tasks[device], advance=1)
        else:
            from ..execution.fleet import _job_label

            result = "ok" if outcome.ok else f"FAILED: {outcome.error}"
            note(f"edgebench: [{device}] {_job_label(outcome.job)}: {result} ({outcome.wall_s:.1f} s)")
        for w in outcome.warnings:
            if self._progress is not None:
                from rich.markup import escape

                self._progress.console.print(f"[yellow]warning[/] {escape(device)}: {escape(w)}")
            else:
                note(f"edgebench: warning: {device}: {w}")


def _summary_dict(s: Any) -> dict[str, Any]:
    return {
        "device": s.device,
        "state": s.state,
        "jobs": s.jobs,
        "ok": s.ok,
        "failed": s.failed,
        "skipped": s.skipped,
        "wall_s": round(s.wall_s, 3),
        "error": s.error,
    }


def _summary(result: Any, suite: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"run {result.run_id} ({result.suite}): {result.status}")
    for col in ("device", "state", "jobs", "ok", "failed", "skipped", "wall s", "error"):
        table.add_column(col)
    colours = {"ok": "green", "failed": "yellow", "quarantined": "red", "unreachable": "red"}
    for s in result.devices.values():
        state = f"[{colours.get(s.state, 'white')}]{s.state}[/]"
        table.add_row(
            escape(s.device),
            state,
            str(s.jobs),
            str(s.ok),
            str(s.failed),
            str(s.skipped),
            f"{s.wall_s:.1f}",
            escape(s.error or ""),
        )
    # Cron logs are not terminals: the table takes its full width instead of folding the error column.
    console(stderr=True).print(table)
    failed = sum(s.failed for s in result.devices.values())
    if failed:
        note(f"edgebench: {failed} job(s) failed; retry them: edgebench run {suite} --resume {result.run_id}")
