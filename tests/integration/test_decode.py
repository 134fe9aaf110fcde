"""`probe decode` through the real CLI: the same small decoder on the host, a real ssh board and the emulated
adb phone, the tokens every device decodes against a bare onnxruntime loop on the host, the floor from a
stored bandwidth run, MNN on the fp32 decoder (and a clear refusal of the quantized ones), a misnamed KV
input as one line, and a suite with `kind = "decode"`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import onnx
import pytest

from edgebench.agent.decode import prompt_ids
from edgebench.models.decoders import decoder_model, kv_bytes_per_position, parse_decoder
from edgebench.records import Record
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench
from edgebench.testing.decode_ref import greedy_tokens

pytestmark = pytest.mark.integration

KEY = "decoder:layers=2,hidden=64,heads=4,vocab=97,ffn=128"
MODEL = f"builtin:{KEY}"
NAME = "decoder-l2-h64-a4-f128-v97-fp32"
PROMPT, NEW = 16, 12
QUICK = [
    "--prompt-tokens",
    PROMPT,
    "--new-tokens",
    NEW,
    "--rounds",
    "3",  # 3 x 12 steps: the 36 a p90 needs for a bounded interval
    "--warmup-seconds",
    "0",
    "--timeout",
    "120",
]


def ok_json(res: subprocess.CompletedProcess[str]) -> dict:
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def by_key(records: list[dict]) -> dict[tuple[str, str | None], dict]:
    return {(r["metric"], r["params"].get("stat")): r for r in records if r["probe"] == "decode"}


def test_decode_gives_the_same_answer_on_every_kind_of_device(
    lab_device: tuple[Path, str], tmp_path: Path
) -> None:
    lab, name = lab_device
    store = tmp_path / "s.db"
    argv = ["probe", "decode", "--model", MODEL, "--device", name, "--lab", lab, *QUICK, "--threads", "1"]
    doc = ok_json(edgebench(*argv, "--no-floor", "--store", store, "--json", cwd=tmp_path))
    got = by_key(doc["records"])
    c = parse_decoder(KEY)
    for metric, stat in (("ttft_ms", "p50"), ("decode_ms_per_token", "p50"), ("decode_ms_per_token", "p90")):
        assert got[(metric, stat)]["value"] > 0
    steps = got[("decode_ms_per_token", "p50")]
    assert steps["annotations"]["n"] == 3 * NEW and ("decode_ms_per_token", "p99") not in got
    assert got[("decode_tokens_per_s", None)]["value"] == pytest.approx(
        1e3 / got[("decode_ms_per_token", "mean")]["value"]
    )
    assert got[("prefill_tokens_per_s", None)]["value"] == pytest.approx(
        PROMPT / got[("ttft_ms", "p50")]["value"] * 1e3
    )
    # The cache at the end is exactly prompt + new positions of key and value per layer.
    assert got[("kv_cache_mb", None)]["value"] * 2**20 == kv_bytes_per_position(c) * (PROMPT + NEW)
    assert got[("peak_rss_mb", None)]["value"] > 0 and ("decode_floor_ms", None) not in got
    notes = steps["annotations"]
    assert notes["kv_check"]["tokens_agree"] == notes["kv_check"]["tokens"] == NEW + 1
    assert notes["rounds_agree"] and notes["cache_inputs"] == [
        "past_key_values.0.key",
        "past_key_values.0.value",
    ]
    # The device decoded what the host's own loop decodes from the same prompt.
    _, path = decoder_model(KEY)
    assert notes["generated_tokens"] == greedy_tokens(path, prompt_ids(0, PROMPT, c.vocab), NEW)
    assert {(r["device"], r["model"], r["runtime"]) for r in doc["records"]} == {(name, NAME, "onnxruntime")}
    assert all(r["params"]["prompt_tokens"] == PROMPT and r["params"]["threads"] == 1 for r in doc["records"])
    with Store(store) as st:
        [kept] = st.samples(metric="decode_ms_per_token")
    assert len(kept.values) == 3 * NEW and kept.key() == Record(**steps).key().series()  # every step kept


def test_the_floor_comes_from_the_stored_bandwidth_run(ssh_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The descriptor's llc_bytes sizes the bandwidth arrays (4x it): this lab board says 2 MiB, so 8 MiB arrays
    # count as DRAM-sized here. The figure is then the board's, whatever cache it really came from.
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, name="llcboard", spec={"llc_bytes": 2 * 2**20})
    store = tmp_path / "s.db"
    common = ["--device", "llcboard", "--lab", lab, "--store", store, "--json"]
    bandwidth = ok_json(
        edgebench("probe", "bandwidth", "--kernel", "read", "--trials", "2", *common, cwd=tmp_path)
    )
    best = max(
        (
            r
            for r in bandwidth["records"]
            if r["metric"] == "bandwidth_gbps" and r["params"]["stat"] == "best"
        ),
        key=lambda r: r["value"],
    )
    res = edgebench("probe", "decode", "--model", MODEL, *QUICK, *common, cwd=tmp_path)
    doc = ok_json(res)
    assert f"from run {bandwidth['run_id']} (the store)" in res.stderr
    floor = by_key(doc["records"])[("decode_floor_ms", None)]
    a = floor["annotations"]
    assert (a["bandwidth_run"], a["bandwidth_source"], a["bandwidth_gbps"]) == (
        bandwidth["run_id"],
        "store",
        pytest.approx(best["value"]),
    )
    want = (a["weight_bytes_per_token"] + a["kv_bytes_per_position"] * (PROMPT + (NEW - 1) / 2)) / (
        best["value"] * 1e9
    )
    assert floor["value"] == pytest.approx(want * 1e3)
    # 0.2 MiB of weights against a 2 MiB cache: the DRAM floor does not bind, and the records say so.
    assert a["regime"] == "cache" and a["uncertain"] is True
    eff = by_key(doc["records"])[("decode_efficiency", None)]
    assert eff["value"] == pytest.approx(
        floor["value"] / by_key(doc["records"])[("decode_ms_per_token", "p50")]["value"]
    )
    assert not any(r["probe"] == "bandwidth" for r in doc["records"])  # nothing measured again


def test_without_a_stored_figure_the_bandwidth_is_measured_first(tmp_path: Path) -> None:
    res = edgebench(
        "probe", "decode", "--model", MODEL, *QUICK, "--bandwidth-mb", "16", "--json", cwd=tmp_path
    )
    doc = ok_json(res)
    assert "measuring it first" in res.stderr
    bw = [r for r in doc["records"] if r["probe"] == "bandwidth" and r["params"]["stat"] == "best"]
    assert {r["params"]["kernel"] for r in bw} == {"read", "copy", "triad"} and all(
        r["model"] is None for r in bw
    )
    assert {r["params"]["phase"] for r in bw} == {"before", "after"}  # bracketing the decode
    # the runtime picks its threads: the bandwidth is measured on every CPU the decode may use
    assert {r["params"]["threads"] for r in bw} == {len(os.sched_getaffinity(0))}
    a = by_key(doc["records"])[("decode_floor_ms", None)]["annotations"]
    assert a["bandwidth_source"] == "measured" and a["bandwidth_run"] == doc["run_id"]
    assert a["bandwidth_gbps"] == pytest.approx(max(r["value"] for r in bw))
    assert a["uncertain"] and "used arrays of 16 MiB, not 4x the last-level cache" in res.stderr


def test_the_measured_bandwidth_runs_at_the_decodes_threads_and_cpus(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    args = ["--threads", "1", "--affinity", str(cpu), "--bandwidth-mb", "16", "--no-store", "--json"]
    doc = ok_json(edgebench("probe", "decode", "--model", MODEL, *QUICK, *args, cwd=tmp_path))
    bw = [r for r in doc["records"] if r["probe"] == "bandwidth" and r["params"]["stat"] == "best"]
    assert bw and {r["params"]["threads"] for r in bw} == {1}
    assert {tuple(r["params"]["affinity"]) for r in bw} == {(cpu,)}
    a = by_key(doc["records"])[("decode_floor_ms", None)]["annotations"]
    assert a["bandwidth_threads"] == 1 and a["affinity"] == [cpu]


def test_mnn_decodes_the_fp32_decoder_like_onnxruntime_and_refuses_quantized_ones(tmp_path: Path) -> None:
    common = ["--model", MODEL, *QUICK, "--no-floor", "--no-store", "--json"]
    ours = ok_json(edgebench("probe", "decode", *common, "--runtime", "mnn", cwd=tmp_path))
    ref = ok_json(edgebench("probe", "decode", *common, cwd=tmp_path))
    mnn, onnxrt = by_key(ours["records"]), by_key(ref["records"])
    assert {r["runtime"] for r in ours["records"]} == {"mnn"}
    tokens = mnn[("decode_ms_per_token", "p50")]["annotations"]["generated_tokens"]
    assert tokens == onnxrt[("decode_ms_per_token", "p50")]["annotations"]["generated_tokens"]
    assert mnn[("kv_cache_mb", None)]["value"] == onnxrt[("kv_cache_mb", None)]["value"]
    for dtype, op in (("int8", "DynamicQuantizeMatMul"), ("int4", "MatMulNBits")):
        res = edgebench(
            "probe", "decode", "--model", f"{MODEL},dtype={dtype}", "--runtime", "mnn", *QUICK, cwd=tmp_path
        )
        assert res.returncode == 2, res.stderr
        [line] = res.stderr.strip().splitlines()[-1:]
        assert f"MNN's converter does not take com.microsoft:{op}" in line and "Traceback" not in res.stderr


def test_a_misnamed_kv_input_is_one_line_naming_it_and_loses_nothing(tmp_path: Path) -> None:
    _, path = decoder_model(KEY)
    model = onnx.load(str(path))
    for value in model.graph.input:
        if value.name == "past_key_values.1.value":
            value.name = "past_key_values.1.val"
    for node in model.graph.node:
        node.input[:] = ["past_key_values.1.val" if n == "past_key_values.1.value" else n for n in node.input]
    bad = tmp_path / "llm.onnx"
    onnx.save(model, bad)
    store = tmp_path / "s.db"
    ok_json(
        edgebench(
            "probe",
            "decode",
            "--model",
            MODEL,
            *QUICK,
            "--no-floor",
            "--store",
            store,
            "--json",
            cwd=tmp_path,
        )
    )
    with sqlite3.connect(store) as db:
        before = db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    res = edgebench("probe", "decode", "--model", bad, *QUICK, "--no-floor", "--store", store, cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert [line for line in res.stderr.splitlines() if "error" in line] == [
        "edgebench: error: llm.onnx: input 'past_key_values.1.val' is not a KV cache input (accepted: input_ids, "
        "attention_mask, position_ids, use_cache_branch, past_key_values.N.key|value or past.N.key|value)"
    ]
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT COUNT(*) FROM records").fetchone()[0] == before


def test_bad_flags_are_one_line_exit_2(tmp_path: Path) -> None:
    for argv, words in (
        (["--prompt-tokens", "0"], "--prompt-tokens: must be at least 1"),
        (["--runtime", "litert"], "LiteRT runs .tflite models; use --runtime onnxruntime or mnn"),
        (["--new-tokens", "4000"], "prompt_tokens + new_tokens = 4016 is over the model's 2048 positions"),
    ):
        res = edgebench(
            "probe", "decode", "--model", MODEL, "--prompt-tokens", "16", *argv, "--no-floor", cwd=tmp_path
        )
        assert res.returncode == 2, res.stderr
        assert words in res.stderr and len(res.stderr.strip().splitlines()) <= 2, res.stderr


def test_a_suite_runs_decode_and_the_report_and_fit_show_it(tmp_path: Path) -> None:
    suite = tmp_path / "llm.toml"
    suite.write_text(
        f'name = "llm"\ndevices = ["local"]\nmodels = ["{MODEL}", "{MODEL},dtype=int8"]\n'
        '[[probe]]\nkind = "decode"\n'
        f"params = {{ prompt_tokens = [{PROMPT}], new_tokens = [{NEW}], rounds = [2], floor = [false] }}\n"
        "[budget]\ndecode_tokens_per_s_min = 1\n"
    )
    run = ok_json(edgebench("run", suite, "--json", cwd=tmp_path))
    assert run["status"] == "ok" and not run["errors"]
    models = {r["model"] for r in run["records"] if r["metric"] == "decode_tokens_per_s"}
    assert models == {NAME, NAME.replace("fp32", "int8")}
    report = edgebench("report", "--suite", suite, "--out", tmp_path / "r.md", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "r.md").read_text()
    assert "## LLM decode" in text and f"| local | {NAME} | onnxruntime | {PROMPT}+{NEW} |" in text
    fit = ok_json(edgebench("fit", "--budget", "decode_tokens_per_s_min=1", "--json", cwd=tmp_path))
    fits = {r["model"]: r["value"] for r in fit["records"] if r["metric"] == "fits"}
    assert fits == {NAME: 1.0, NAME.replace("fp32", "int8"): 1.0}
