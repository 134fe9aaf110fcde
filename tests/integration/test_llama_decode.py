"""`probe decode` on llama.cpp: the real `llama-bench` (../shared/lab-tools/llama.cpp-20261001-linux-x86_64,
BUILD.md there) pushed and run as a phone lab runs it, on the host (local transport), a real sshd board and
the emulated phone without Python (adbd runs the tool), on built-in GGUFs written with `gguf`.

The runner each device is given is a small sh wrapper pushed with the real binary beside it: it runs the
binary with edgebench's argv and keeps a copy of the JSON it printed, which the test reads itself: every
stored decode sample must be that invocation's `samples_ns` over its tokens, exactly. The floor's bytes are
counted here from the file with `gguf`'s reader and its bandwidth must be the one measured at the decode's
thread count. Bad input is one line naming the file before anything is pushed; llama-bench killed by a signal
is a typed error naming the signal, the model and the flags, and the next job runs.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from edgebench.models.refs import resolve_model
from edgebench.results.store import Store
from edgebench.testing.adblab import write_descriptor
from edgebench.testing.cli import edgebench
from edgebench.testing.labtools import tool_or_skip

pytestmark = pytest.mark.integration

TOOL_DIR = "llama.cpp-20261001-linux-x86_64"
MODEL = "builtin:llama:layers=2,hidden=256,heads=4,kv_heads=2,vocab=512,dtype=q4_0"
PHONE_LOG = "/data/local/tmp/llama-bench-printed.json"
QUICK = ["--prompt-tokens", "16", "--new-tokens", "8", "--rounds", "3", "--threads", "1", "--timeout", "300"]


@pytest.fixture(scope="module")
def tool() -> Path:
    return tool_or_skip(Path(__file__).resolve().parents[2], TOOL_DIR, "llama-bench", "llama.cpp llama-bench")


class LlamaDevice(NamedTuple):
    lab: Path
    name: str
    printed: Path  # where, on the host, the wrapper's copy of the tool's JSON is read


def runner_toml(tool: Path, folder: Path, log: str) -> str:
    """The [runners] line: a /bin/sh wrapper running the real llama-bench beside it, its JSON copied to
    `log`; asked for 3 threads, the tool is killed by SIGSEGV from outside while it runs."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "llama-bench-wrapper.sh"
    script.write_text(
        "#!/bin/sh\n"
        'b="${0%/*}/llama-bench"\n'
        'chmod 755 "$b" 2>/dev/null\n'
        'case "$*" in *"-t 3 "*) "$b" "$@" >/dev/null 2>&1 & pid=$!; sleep 0.3; kill -SEGV $pid; wait $pid; '
        "exit $?;; esac\n"
        f'"$b" "$@" >"{log}"\nrc=$?\ncat "{log}"\nexit $rc\n'
    )
    return (
        "[runners]\n"
        f'llama_bench = {{ path = "{script.name}", push = "{script}", libs = ["{tool / "llama-bench"}"] }}\n'
    )


@pytest.fixture(params=["host", "ssh_board", "stock_phone"])
def device(request: pytest.FixtureRequest, tool: Path, tmp_path: Path) -> LlamaDevice:
    if request.param == "stock_phone":  # no Python on it: llama-bench alone
        lab = request.getfixturevalue("adb_phone_factory")(name="stock", path="/system/bin")
        runners = runner_toml(tool, tmp_path / "runner", PHONE_LOG)
        write_descriptor(lab.lab_dir, "stock", lab.phone, extra='agent = "native"\n' + runners)
        return LlamaDevice(lab.lab_dir, "stock", lab.root / PHONE_LOG.lstrip("/"))
    log = tmp_path / "printed.json"
    if request.param == "ssh_board":
        board = request.getfixturevalue("ssh_board")
        lab_dir = tmp_path / "lab"
        path = board.write_descriptor(lab_dir)
        path.write_text(path.read_text() + runner_toml(tool, tmp_path / "runner", str(log)))
        return LlamaDevice(lab_dir, board.name, log)
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    (lab_dir / "host.toml").write_text(
        f'name = "host"\ntransport = "local"\nworkdir = "{tmp_path / "work"}"\n'
        + runner_toml(tool, tmp_path / "runner", str(log))
    )
    return LlamaDevice(lab_dir, "host", log)


def decode(dev: LlamaDevice, cwd: Path, *extra: str, model: str = MODEL) -> subprocess.CompletedProcess[str]:
    return edgebench(
        "probe", "decode", "--model", model, "--device", dev.name, "--lab", dev.lab, *QUICK, *extra,
        "--json", "--store", cwd / "s.db", cwd=cwd,
    )  # fmt: skip


def test_every_device_decodes_a_gguf_with_llama_bench_and_stores_what_it_printed(
    device: LlamaDevice, tmp_path: Path
) -> None:
    res = decode(device, tmp_path, "--depths", "0,32", "--no-floor")
    assert res.returncode == 0, res.stderr[-2000:]
    records = [r for r in json.loads(res.stdout)["records"] if r["probe"] == "decode"]
    printed = json.loads(device.printed.read_text())  # what the tool printed in that very invocation
    assert {(t["n_prompt"], t["n_gen"], t["n_depth"]) for t in printed} == {
        (16, 0, 0), (0, 8, 0), (16, 0, 32), (0, 8, 32)
    }  # fmt: skip
    with Store(tmp_path / "s.db") as store:
        stored = {s.params["depth"]: list(s.values) for s in store.samples(metric="decode_ms_per_token")}
    for t in printed:
        depth = t["n_depth"]
        at = {(r["metric"], r["params"].get("stat")): r for r in records if r["params"].get("depth") == depth}
        assert all(r["params"]["threads"] == t["n_threads"] == 1 for r in at.values())
        if t["n_gen"]:
            # each stored sample is one repetition's generation over its tokens, as printed
            assert stored[depth] == pytest.approx([s / t["n_gen"] / 1e6 for s in t["samples_ns"]], rel=1e-12)
            assert at[("decode_ms_per_token", "p50")]["value"] == pytest.approx(
                float(np.median(t["samples_ns"])) / t["n_gen"] / 1e6, rel=1e-12
            )
            assert ("decode_ms_per_token", "p99") not in at  # 3 repetitions bound no tail: refused
            tokens_per_s = t["n_gen"] * len(t["samples_ns"]) / (sum(t["samples_ns"]) / 1e9)
            assert at[("decode_tokens_per_s", None)]["value"] == pytest.approx(tokens_per_s, rel=1e-9)
            kept = at[("decode_ms_per_token", "p50")]["annotations"]["llama_bench"]
            assert kept["build_commit"] == t["build_commit"] and kept["backends"] == t["backends"]
            assert kept["samples_ns"] == t["samples_ns"] and kept["model_size"] == t["model_size"]
        else:
            rate = t["n_prompt"] / (float(np.median(t["samples_ns"])) / 1e9)
            assert at[("prefill_tokens_per_s", None)]["value"] == pytest.approx(rate, rel=1e-9)
    assert "p99 needs at least" in res.stderr  # said, not hidden


def test_the_floor_is_the_files_bytes_over_the_bandwidth_at_the_decodes_threads(
    tool: Path, tmp_path: Path
) -> None:
    """On the host (the Python agent measures the bandwidth): the floor's bytes counted here from the file,
    its bandwidth the best read figure measured at 1 thread by this very job; a cache-sized model's floor is
    uncertain."""
    import gguf

    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "host.toml").write_text(
        f'name = "host"\ntransport = "local"\nworkdir = "{tmp_path / "work"}"\n'
        + runner_toml(tool, tmp_path / "runner", str(tmp_path / "printed.json"))
    )
    dev = LlamaDevice(lab, "host", tmp_path / "printed.json")
    res = decode(dev, tmp_path, "--bandwidth-mb", "64", "--depths", "0,64")
    assert res.returncode == 0, res.stderr[-2000:]
    records = json.loads(res.stdout)["records"]
    floor = next(r for r in records if r["metric"] == "decode_floor_ms" and r["params"]["depth"] == 0)
    notes = floor["annotations"]
    reader = gguf.GGUFReader(resolve_model(MODEL).path)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    per_token = (
        sum(sizes.values()) - sizes["token_embd.weight"] + sizes["token_embd.weight"] // int(embd.shape[-1])
    )
    assert notes["weight_bytes_per_token"] == per_token
    kv_per_position = 2 * 2 * 2 * (256 // 4) * 2  # K and V x layers x kv_heads x head_dim x f16
    assert notes["kv_bytes_per_position"] == kv_per_position
    bandwidth = [
        r for r in records
        if r["probe"] == "bandwidth" and r["metric"] == "bandwidth_gbps" and r["params"].get("stat") == "best"
    ]  # fmt: skip
    assert bandwidth and {r["params"]["threads"] for r in bandwidth} == {1}
    assert notes["bandwidth_threads"] == 1 and notes["bandwidth_kernel"] == "read"  # a decode streams reads
    assert notes["bandwidth_gbps"] == max(r["value"] for r in bandwidth if r["params"]["kernel"] == "read")
    past = 0 + (8 - 1) / 2
    want = (per_token + kv_per_position * past) / (notes["bandwidth_gbps"] * 1e9) * 1e3
    assert floor["value"] == pytest.approx(want, rel=1e-9)
    eff = next(r for r in records if r["metric"] == "decode_efficiency" and r["params"]["depth"] == 0)
    p50s = {
        r["params"]["depth"]: r["value"]
        for r in records
        if r["metric"] == "decode_ms_per_token" and r["params"].get("stat") == "p50"
    }
    assert eff["value"] == pytest.approx(floor["value"] / p50s[0], rel=1e-9)
    # what 1000 more positions add per step, measured (through the two depths) and the floor's KV term
    [slope] = [r for r in records if r["metric"] == "decode_depth_slope_ms"]
    assert slope["value"] == pytest.approx((p50s[64] - p50s[0]) / 64 * 1000, rel=1e-9)
    floor_slope = kv_per_position * 1000 / (notes["bandwidth_gbps"] * 1e9) * 1e3
    assert slope["annotations"]["floor_slope_ms"] == pytest.approx(floor_slope, rel=1e-9)
    assert notes["uncertain"] and "decode_floor_ms is uncertain" in res.stderr  # 1 MB of weights: caches


def test_bad_input_is_one_line_naming_the_file_before_anything_is_pushed(tool: Path, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    work = tmp_path / "work"
    (lab / "host.toml").write_text(
        f'name = "host"\ntransport = "local"\nworkdir = "{work}"\n'
        + runner_toml(tool, tmp_path / "runner", str(tmp_path / "printed.json"))
    )
    dev = LlamaDevice(lab, "host", tmp_path / "printed.json")
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model\n")
    whole = resolve_model(MODEL).path
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    for path, said in ((not_gguf, "notes.gguf"), (cut, "cut.gguf")):
        res = decode(dev, tmp_path, model=str(path))
        assert res.returncode != 0
        lines = [ln for ln in res.stderr.splitlines() if "error" in ln]
        assert len(lines) == 1 and said in lines[0], res.stderr[-2000:]
    assert not work.exists() or not any(p.suffix == ".gguf" for p in work.rglob("*"))  # nothing pushed
    res = edgebench(
        "bench", MODEL, "--device", dev.name, "--lab", lab, "--store", tmp_path / "s.db", cwd=tmp_path
    )
    assert res.returncode != 0 and "llama.cpp runs probe decode only, not bench" in res.stderr, res.stderr


def test_a_tool_killed_by_a_signal_is_a_typed_error_and_the_next_job_runs(tool: Path, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "host.toml").write_text(
        f'name = "host"\ntransport = "local"\nworkdir = "{tmp_path / "work"}"\n'
        + runner_toml(tool, tmp_path / "runner", str(tmp_path / "printed.json"))
    )
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(resolve_model(MODEL).path.read_bytes())
    suite = tmp_path / "llm.toml"
    suite.write_text(
        'name = "llm"\ndevices = ["host"]\n'
        f"models = [{json.dumps(str(mine))}]\n"
        '[[probe]]\nkind = "decode"\n'
        "params = { prompt_tokens = 16, new_tokens = 8, rounds = 3, threads = [3, 1], floor = false }\n"
    )
    res = edgebench("run", suite, "--lab", lab, "--store", tmp_path / "s.db", cwd=tmp_path)
    assert res.returncode != 0
    with sqlite3.connect(tmp_path / "s.db") as db:
        rows = db.execute("select params, status, error from jobs").fetchall()
    jobs = {json.loads(p)["threads"]: (status, error) for p, status, error in rows}
    status, failed = jobs[3]
    assert status == "error" and "SIGSEGV" in failed and "mine.gguf" in failed, failed
    assert (
        "-t 3" in failed and "--repack 0" in failed and "\n" not in failed
    )  # one line: signal, model, flags
    assert jobs[1][0] == "ok", jobs


def host_lab(tool: Path, tmp_path: Path) -> LlamaDevice:
    lab = tmp_path / "lab"
    lab.mkdir(exist_ok=True)
    (lab / "host.toml").write_text(
        f'name = "host"\ntransport = "local"\nworkdir = "{tmp_path / "work"}"\n'
        + runner_toml(tool, tmp_path / "runner", str(tmp_path / "printed.json"))
    )
    return LlamaDevice(lab, "host", tmp_path / "printed.json")


def test_the_report_draws_tokens_per_s_against_depth_and_the_gate_reads_them(
    tool: Path, tmp_path: Path
) -> None:
    """Two releases of one LLM (`llm.gguf`: the next one has twice the layers, a real slowdown): the report's
    decode table has a row per depth and the plot of tokens/s against depth with the floor beside it; the
    gate compares decode and prefill tokens/s per depth and fails the slower release."""
    dev = host_lab(tool, tmp_path)
    llm = tmp_path / "llm.gguf"
    runs = []
    for layers in (2, 8):
        llm.write_bytes(resolve_model(MODEL.replace("layers=2", f"layers={layers}")).path.read_bytes())
        res = decode(dev, tmp_path, "--depths", "0,64", "--bandwidth-mb", "64", model=str(llm))
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append(json.loads(res.stdout)["run_id"])
    out = tmp_path / "report"
    res = edgebench("report", "--store", tmp_path / "s.db", "--out", out, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    html = next(out.glob("*.html")).read_text() if out.is_dir() else out.read_text()
    assert 'data-plot="decode-depth"' in html and "<th>depth</th>" in html
    res = edgebench(
        "gate",
        "--baseline",
        runs[0],
        "--candidate",
        runs[1],
        "--store",
        tmp_path / "s.db",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    pairs = json.loads(res.stdout)["pairs"]
    judged = {(p["metric"], p["params"].get("depth")): p["verdict"] for p in pairs if p["probe"] == "decode"}
    assert judged[("decode_tokens_per_s", 0)] == judged[("decode_tokens_per_s", 64)] == "FAIL", judged
    assert ("prefill_tokens_per_s", 0) in judged
