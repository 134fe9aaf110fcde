"""Verbs: devices, bench, results."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import UserError
from ..jobs import Job
from ..probes.registry import BenchParams
from ..records import Record
from .common import (
    JSON_OPT,
    LAB_OPT,
    LEASE_TIMEOUT_OPT,
    LOCK_DIR_OPT,
    STORE_OPT,
    device_waits,
    note,
    open_lab,
    open_store,
    positive_seconds,
    print_json,
    records_json,
    render_table,
    resolve_runs,
    warn,
)
from .params import probe_flags, refuse_native_only


def register(app: typer.Typer) -> None:
    app.command("devices")(devices)
    app.command("bench")(bench)
    app.command("results")(results)


def devices(
    lab: Path = LAB_OPT,
    check: bool = typer.Option(False, "--check", help="Reach each device and report what it has."),
    device: list[str] = typer.Option(None, "--device", "-d", help="Only these devices (repeatable)."),
    as_json: bool = JSON_OPT,
) -> int:
    """List the lab's devices (local always exists); --check reaches each one (exit 3 if any fails)."""
    from ..lab.health import CHECK_COLUMNS, check_devices, check_rows, failed

    the_lab = open_lab(lab)
    names = [the_lab.get(n).name for n in device] if device else the_lab.names()
    if check:
        reports = check_devices(the_lab, names)
        for r in reports:
            warn(r.warnings, f"{r.name}: ")
        if as_json:
            print_json({"devices": [r.to_dict() for r in reports], "ok": not failed(reports)})
        else:
            render_table("devices", CHECK_COLUMNS, check_rows(reports))
        for r in failed(reports):
            note(f"edgebench: {r.name}: {r.status}")
        return 3 if failed(reports) else 0
    specs = [the_lab.devices[n] for n in names]
    if as_json:
        print_json(
            {
                "devices": [
                    {
                        "name": s.name,
                        "transport": s.transport,
                        "soc": s.soc,
                        "agent": s.agent,
                        "source": s.source,
                    }
                    for s in specs
                ]
            }
        )
    else:
        render_table(
            "devices",
            ["device", "transport", "soc", "descriptor"],
            [[s.name, s.transport, s.soc, s.source] for s in specs],
        )
    return 0


@probe_flags("bench")
def bench(
    models: list[str] = typer.Argument(
        ..., help="Model files (.onnx, .mnn, .tflite) or builtin:NAME; several are compared with each other."
    ),
    device: str = typer.Option("local", "--device", "-d"),
    runtime: str = typer.Option(
        None, "--runtime", help="onnxruntime, mnn or litert (default: from the model file: .mnn runs on MNN)."
    ),
    timeout: float = typer.Option(
        None, "--timeout", callback=positive_seconds, help="Bound on every remote call (default: descriptor)."
    ),
    store: Path = STORE_OPT,
    no_store: bool = typer.Option(False, "--no-store", help="Do not keep the results."),
    lab: Path = LAB_OPT,
    lock_dir: Path = LOCK_DIR_OPT,
    lease_timeout: float = LEASE_TIMEOUT_OPT,
    tag: list[str] = typer.Option(None, "--tag", help="Tag the run (repeatable)."),
    table: bool = typer.Option(False, "--table", help="Every record as a table (default: a short summary)."),
    as_json: bool = JSON_OPT,
    params: BenchParams = BenchParams(),
) -> int:
    """Benchmark models' latency, load time and memory on a device (several: which ran faster)."""
    from ..execution.oneshot import DeviceAccess, run_now
    from ..execution.repeats import interleave
    from ..models.refs import resolve_model
    from ..probes.common import check_runtime
    from ..render.bench_summary import comparison_lines, summarize_bench, summary_lines
    from ..results.store import Store, check_tag

    for t in tag or []:
        check_tag(t)
    the_lab = open_lab(lab)
    spec = the_lab.get(device)
    refs = [resolve_model(m) for m in models]
    check_inputs(params.inputs)
    refuse_native_only(params, spec.agent, spec.name, spec.source)
    # usage errors: refused before a run is stored
    runtimes = [check_runtime(ref, runtime, probe="bench") for ref in refs]
    jobs = interleave(
        [
            Job(
                device=spec.name,
                probe="bench",
                model=ref,
                runtime=runtime,
                params=params.given(),
                timeout_s=timeout,
            )
            for ref in refs
        ]
    )
    names, chosen = ", ".join(r.name for r in refs), ", ".join(dict.fromkeys(runtimes))
    note(f"edgebench: bench {names} on {spec.name} ({chosen})")
    access = DeviceAccess(lock_dir, lease_timeout)
    shot = run_now(
        spec, jobs, None if no_store else store, "bench", access=access, on_state=device_waits(spec.name)
    )
    if tag and not no_store:
        with Store(store) as st:
            st.add_tags(shot.run_id, tag)
    for o in shot.outcomes:
        model = f"{o.job.model.name}: " if o.job.model and len(jobs) > 1 else ""
        warn(o.warnings, f"{o.job.device}: {model}")
    ok = [o for o in shot.outcomes if o.ok]
    summaries = [s for o in ok if (s := summarize_bench(o.records, o.samples)) is not None]
    if as_json:
        print_json(records_json(shot.records, run_id=shot.run_id, summary=[s.to_dict() for s in summaries]))
    elif table:
        show_records(shot.records, f"bench on {spec.name} (run {shot.run_id})")
    else:
        lines = [ln for i, s in enumerate(summaries, 1) for ln in [*summary_lines(i, s), ""]]
        if lines:  # stdout stays empty when nothing was measured
            print("\n".join(lines + comparison_lines(summaries)).rstrip())
            where = "" if no_store else f" stored in {store}"
            note(f"edgebench: run {shot.run_id}{where}; --table for every record")
    if len(ok) < len(shot.outcomes):
        for o in shot.outcomes:
            if not o.ok and len(jobs) > 1:
                note(f"edgebench: error: {o.job.model.name if o.job.model else 'bench'}: {o.error}")
        if not ok or len(jobs) == 1:
            shot.raise_first_error()
        return 1
    return 0


def check_inputs(inputs: str | None) -> None:
    """An --inputs file that does not exist is a usage error before any device is touched."""
    if inputs is not None and not Path(inputs).is_file():
        raise UserError(f"{inputs}: inputs file not found")


def show_records(records: list[Record], title: str) -> None:
    """Records as a table; with records of several runs, the first column names the run."""
    several = len({r.run_id for r in records}) > 1
    rows = [
        [
            *([r.run_id] if several else []),
            r.device,
            r.model,
            r.runtime,
            r.probe,
            r.metric,
            {k: v for k, v in r.params.items() if k != "stat"} or None,
            r.params.get("stat"),
            r.value,
            r.unit,
        ]
        for r in records
    ]
    columns = ["device", "model", "runtime", "probe", "metric", "params", "stat", "value", "unit"]
    render_table(title, (["run"] if several else []) + columns, rows)


def results(
    store: Path = STORE_OPT,
    run: list[str] = typer.Option(
        None, "--run", help="Run id or reference: latest, latest~1, suite:NAME, a prefix (repeatable)."
    ),
    all_runs: bool = typer.Option(False, "--all", help="Every run in the store."),
    as_json: bool = JSON_OPT,
    as_csv: bool = typer.Option(False, "--csv", help="CSV on stdout."),
    parquet: Path = typer.Option(None, "--parquet", help="Write a Parquet file."),
) -> int:
    """Export stored records (JSON, CSV or Parquet) or show them as a table."""
    with open_store(store) as st:
        run_ids = None if all_runs else (resolve_runs(st, run) if run else [st.latest_run().run_id])
        records = st.records(run_ids)
        errors = st.errors(run_ids)
        frame = st.records_frame(run_ids)
    if as_json:
        print_json(records_json(records, runs=run_ids, errors=errors))
    elif as_csv:
        import sys

        json_columns(frame).to_csv(sys.stdout, index=False)
    elif parquet is not None:
        json_columns(frame).to_parquet(parquet, index=False)
        note(f"edgebench: wrote {len(frame)} records to {parquet}")
    else:
        show_records(records, f"results ({', '.join(run_ids) if run_ids else 'all runs'})")
        warn(disturbed_lines(records), "disturbed job ")
        warn([f"{e['device']} {e['probe']} {e['model'] or ''}: {e['error']}" for e in errors], "failed job ")
    return 0


def disturbed_lines(records: list[Record]) -> list[str]:
    """One line per job whose measured disturbance passes the default threshold (analysis.disturbance):
    `local mlp onnxruntime bench {"threads":2} invocation 2: others used 63% of the CPUs`."""
    from ..analysis.disturbance import Thresholds, by_job

    out = []
    for (_, device, model, runtime, probe, params, inv), d in sorted(by_job(records).items()):
        why = Thresholds().evidence(d)
        if why:
            where = f" invocation {inv}" if inv else ""
            out.append(f"{device} {model} {runtime} {probe} {params}{where}: {why}")
    return out


def json_columns(frame):
    """The dict columns of a records frame as canonical JSON text, for CSV and Parquet."""
    import json

    for column in ("params", "annotations"):
        frame[column] = frame[column].map(lambda p: json.dumps(p, sort_keys=True))
    return frame
