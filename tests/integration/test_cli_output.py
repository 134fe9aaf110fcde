"""CLI output a CI log can read: nothing truncated in a pipe, a hyperfine-style bench summary (the full
table on request), "B ran Nx faster than A", `--version`, help text with its brackets intact, usage
errors refused before a run is stored, and the runtime that follows the model file's extension."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer

from edgebench import __version__
from edgebench.cli import build_app
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

FAST = ["--runs", "30", "--min-seconds", "0", "--warmup", "1", "--threads", "1"]


def piped(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A shell pipeline, as a CI job or a user runs it: `edgebench ... | cat`."""
    env = {**os.environ, "COLUMNS": "80"}  # what a narrow CI log or a pipe reports
    return subprocess.run(
        command, shell=True, cwd=cwd, capture_output=True, text=True, timeout=600, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_bench_through_a_pipe_shows_full_names_and_a_short_summary(workdir: Path) -> None:
    py = sys.executable
    res = piped(f"{py} -m edgebench bench builtin:mlp {' '.join(FAST)} | cat", workdir)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "Benchmark 1: mlp on local (onnxruntime, threads=1)"
    assert lines[1].startswith("  Time (mean ± σ):") and "[p50 " in lines[1] and "p99 n/a" in lines[1]
    assert lines[2].startswith("  Range (min … max):") and "30 runs" in lines[2] and "peak memory" in lines[2]
    assert len(lines) == 3
    # The numbers are those of the stored samples (numpy on them, the independent reference).
    with sqlite3.connect(workdir / "edgebench.db") as db:
        [(vals,)] = db.execute("SELECT vals FROM samples WHERE metric='latency_ms'").fetchall()
    x = np.asarray(json.loads(vals))
    mean, std = re.search(r"Time \(mean ± σ\):\s+([\d.]+) ms ±\s+([\d.]+) ms", lines[1]).groups()  # type: ignore[union-attr]
    assert float(mean) == pytest.approx(x.mean(), rel=1e-3) and float(std) == pytest.approx(
        x.std(ddof=1), rel=1e-3
    )
    lo, hi = re.search(r"Range \(min … max\):\s+([\d.]+) ms …\s+([\d.]+) ms", lines[2]).groups()  # type: ignore[union-attr]
    assert float(lo) == pytest.approx(x.min(), rel=1e-3) and float(hi) == pytest.approx(x.max(), rel=1e-3)
    table = piped(f"{py} -m edgebench bench builtin:mlp {' '.join(FAST)} --table | cat", workdir)
    assert table.returncode == 0, table.stderr
    for word in ("first_inference_ms", "peak_rss_mb", "onnxruntime", "latency_cv", "samples_n"):
        assert word in table.stdout, word
    assert "…" not in table.stdout and max(len(line) for line in table.stdout.splitlines()) > 80
    results = piped(f"{py} -m edgebench results --run latest~1 | cat", workdir)
    assert "first_inference_ms" in results.stdout and "…" not in results.stdout


def test_several_models_say_which_ran_faster(workdir: Path) -> None:
    res = edgebench("bench", "builtin:mlp", "builtin:convnet", *FAST, "--json", cwd=workdir)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert {r["model"] for r in doc["records"]} == {"mlp", "convnet"}
    text = edgebench("results", "--run", doc["run_id"], "--json", cwd=workdir)
    assert text.returncode == 0
    shown = edgebench("bench", "builtin:mlp", "builtin:convnet", *FAST, cwd=workdir)
    lines = shown.stdout.splitlines()
    assert lines[-3] == "Summary"
    fastest, slower = lines[-2].strip(), lines[-1].strip()
    means = {s["label"]: s["mean_ms"] for s in doc["summary"]}
    found = re.match(r"([\d.]+) times faster than .*\[ratio of p50s, 95% CI ([\d.]+)-([\d.]+)", slower)
    assert fastest.endswith(" ran") and found, slower
    # The ratio is that of the stored samples' medians (this call's own run), inside its interval.
    with sqlite3.connect(workdir / "edgebench.db") as db:
        run = db.execute("SELECT run_id FROM runs ORDER BY created DESC LIMIT 1").fetchone()[0]
        rows = db.execute("SELECT model, vals FROM samples WHERE run_id=? AND metric='latency_ms'", (run,))
        stored = {m: float(np.median(json.loads(v))) for m, v in rows}
    ratio, lo, hi = (float(g) for g in found.groups())
    assert found.group(1) == f"{max(stored.values()) / min(stored.values()):.3g}"  # printed to 3 digits
    assert lo <= ratio <= hi
    assert len(means) == 2


def test_version() -> None:
    res = subprocess.run([sys.executable, "-m", "edgebench", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == f"edgebench {__version__}\n"


def _commands() -> list[tuple[list[str], Any]]:
    root = typer.main.get_command(build_app())
    out: list[tuple[list[str], Any]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        out.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():  # typer's click or click's own Group
            walk(sub, [*path, name])

    walk(root, [])
    return out


def _words(text: str) -> str:
    return " ".join(text.split())


def test_help_of_every_verb_shows_bracketed_text_intact(tmp_path: Path) -> None:
    commands = _commands()
    assert {"gate", "runs", "compare", "bench", "fit", "report"} <= {p[0] for p, _ in commands if p}
    bracketed = 0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # an interpreter start each
        helps = list(pool.map(lambda c: edgebench(*c[0], "--help", cwd=tmp_path), commands))
    for (path, cmd), res in zip(commands, helps, strict=True):
        assert res.returncode == 0, (path, res.stderr)
        shown = _words(res.stdout)
        for param in cmd.params:
            help_text = getattr(param, "help", None) or ""
            for token in re.findall(r"\[[^\]]*\]+", help_text):
                bracketed += 1
                assert _words(token) in shown, (path, param.name, token)
        assert "\x1b[" not in res.stdout  # no colour codes in a pipe
    assert bracketed >= 3
    gate = edgebench("gate", "--help", cwd=tmp_path).stdout
    assert "[[gate]]" in _words(gate)


def test_usage_errors_are_refused_before_a_run_is_stored(workdir: Path) -> None:
    from edgebench.models.convert import onnx_to_mnn
    from edgebench.models.refs import resolve_model

    mnn = onnx_to_mnn(resolve_model("builtin:mlp").path, workdir / "mlp.mnn")
    for args, needle in (
        (["builtin:mlp", "--runtime", "foo"], "unknown runtime 'foo'"),
        ([str(mnn), "--runtime", "onnxruntime"], "onnxruntime cannot run an MNN model"),
        (["builtin:mlp.tflite", "--runtime", "mnn"], "cannot run a .tflite model"),
    ):
        res = edgebench("bench", *args, cwd=workdir)
        assert res.returncode == 2 and needle in res.stderr and res.stderr.count("\n") == 1, res.stderr
    res = edgebench("probe", "threads", "--model", mnn, "--runtime", "onnxruntime", cwd=workdir)
    assert res.returncode == 2 and "onnxruntime cannot run an MNN model" in res.stderr
    assert (
        not (workdir / "edgebench.db").exists()
        or not sqlite3.connect(workdir / "edgebench.db").execute("SELECT count(*) FROM runs").fetchone()[0]
    )


def test_the_runtime_follows_the_model_files_extension(workdir: Path) -> None:
    from edgebench.models.convert import onnx_to_mnn
    from edgebench.models.refs import resolve_model

    mnn = onnx_to_mnn(resolve_model("builtin:mlp").path, workdir / "mlp.mnn")
    res = edgebench("bench", mnn, *FAST, "--shape", "x=1x1024", "--json", cwd=workdir)
    assert res.returncode == 0, res.stderr
    assert {r["runtime"] for r in json.loads(res.stdout)["records"]} == {"mnn"}
    threads = edgebench(
        "probe", "threads", "--model", mnn, "--threads", "1", "--runs", "10", "--min-seconds", "0",
        "--shape", "x=1x1024", "--json", cwd=workdir,
    )  # fmt: skip
    assert threads.returncode == 0, threads.stderr
    assert {r["runtime"] for r in json.loads(threads.stdout)["records"]} == {"mnn"}
    suite = workdir / "s.toml"
    suite.write_text(
        f'name = "s"\ndevices = ["local"]\nmodels = ["{mnn}"]\n[[probe]]\nkind = "bench"\n'
        "params = { runs = 10, min_seconds = 0, shapes = { x = [1, 1024] } }\n"
    )
    run = edgebench("run", suite, "--json", cwd=workdir)
    assert run.returncode == 0, run.stderr
    assert {r["runtime"] for r in json.loads(run.stdout)["records"]} == {"mnn"}
