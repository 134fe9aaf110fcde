"""The README's nightly example, run as written: the shell block is taken from README.md and run by bash
(with jq, as cron would) after a first night, in a lab folder whose `suites/nightly.toml` is a short
nightly suite on the `local` device and the emulated phone the block itself starts (`edgebench lab phone`:
a real adb server and the emulated adbd on loopback)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).parents[2] / "README.md"
NIGHTLY = """name = "nightly"
devices = ["local", "phone"]
models = ["builtin:mlp", "builtin:convnet"]
[[probe]]
kind = "bench"
params = { threads = 1, runs = 30, warmup = 1, min_seconds = 0 }
[[gate]]
metric = "latency_ms"
stat = "p50"
probe = "bench"
max_slowdown = "100%"     # two runs on a shared 2-core host: only a doubling is a regression here
[budget]
latency_p99_ms = 1000
memory_mb = 2000
"""


def nightly_block() -> str:
    text = README.read_text()
    marker = text.index("<!-- nightly-example:")
    m = re.search(r"```sh\n(.*?)```", text[marker:], re.S)
    assert m, "the README lost its nightly example"
    return m.group(1)


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`edgebench` on PATH as the console script would be: this interpreter running the package."""
    bindir = cwd / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "edgebench"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m edgebench "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture
def lab_folder(tmp_path: Path) -> Iterator[Path]:
    """A fresh lab folder; whatever phone lab the block started there is stopped afterwards."""
    if shutil.which("adb") is None:
        pytest.skip("adb not installed (Debian package adb)")
    (tmp_path / "suites").mkdir()
    (tmp_path / "devices").mkdir()
    (tmp_path / "suites" / "nightly.toml").write_text(NIGHTLY)
    try:
        yield tmp_path
    finally:
        subprocess.run(
            [sys.executable, "-m", "edgebench", "lab", "stop"], cwd=tmp_path, capture_output=True, timeout=60
        )


def test_the_readme_nightly_example_runs_as_written(lab_folder: Path) -> None:
    tmp_path = lab_folder
    block = nightly_block()
    assert 'edgebench gate --baseline "$LAST"' in block and "LAST=" in block
    assert block.startswith("edgebench lab phone --lab devices")
    # One verdict per question: the gate runs first, and the report shows its stored verdicts.
    assert block.index("edgebench gate") < block.index("edgebench report")
    first = bash(block, tmp_path)  # the first night: nothing to gate against yet, said in one line
    assert first.returncode == 2, first.stderr
    assert "edgebench: error:" in first.stderr and "only 1 run(s) of suite nightly" in first.stderr
    assert (tmp_path / "reports" / "nightly.html").is_file()  # the first night is reported all the same
    # The phone's descriptor as the block wrote it: adb on loopback, this interpreter as its Python.
    phone = tomllib.loads((tmp_path / "devices" / "phone.toml").read_text())
    assert phone["transport"] == "adb" and phone["serial"].startswith("127.0.0.1:")
    assert Path(phone["python"]).samefile(sys.executable)
    checked = (tmp_path / "devices.txt").read_text()
    assert re.search(r"phone \(adb\)\s*│\s*ok", checked), checked
    second = bash(block, tmp_path)
    assert "already running" in second.stderr  # the second night finds the phone lab up
    # The script exits with the gate's verdict: 0, or 1 when this busy host made a night 2x slower.
    assert second.returncode in (0, 1), second.stdout + second.stderr
    junit = ET.parse(tmp_path / "gate.xml").getroot()
    assert int(junit.get("tests", "0")) >= 4
    assert (junit.get("failures") == "0") == (second.returncode == 0)
    verdict = "PASS" if second.returncode == 0 else "FAIL"
    assert f"edgebench gate: {verdict}" in (tmp_path / "gate.md").read_text()
    report = (tmp_path / "reports" / "nightly.html").read_text()
    runs = json.loads(
        subprocess.run(
            [sys.executable, "-m", "edgebench", "runs", "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        ).stdout
    )["runs"]
    nights = [r for r in runs if r["suite"] == "nightly"]
    gates = [r for r in runs if r["kind"] == "gate"]
    assert len(nights) == 2 and all(r["tags"] == ["nightly"] for r in nights)
    assert len(gates) == 1 and gates[0]["gate"]["baseline"] == nights[0]["run_id"]
    assert gates[0]["gate"]["candidate"] == nights[1]["run_id"]
    assert gates[0]["gate"]["verdict"] == verdict and gates[0]["gate"]["exit_code"] == second.returncode
    assert nights[1]["run_id"] in report and nights[0]["run_id"] in report
    assert f"the verdicts of stored gate run {gates[0]['run_id']}" in report
    assert all(set(r["devices"]) == {"local", "phone"} for r in nights), nights  # the phone was measured
