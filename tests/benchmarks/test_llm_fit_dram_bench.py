"""`edgebench fit` predicts the decode speed of a DRAM-sized GGUF it never measured within 15%.

Three built-in Llama Q8_0 GGUFs of different shapes, each over twice the host's last-level cache (so each
token streams its weights from DRAM, the regime a phone's LLM lives in): two are decoded with `probe decode`
on `local` (2 threads, the real llama-bench of ../shared/lab-tools), then `fit --model` predicts the third
from their efficiencies and the read bandwidth those jobs measured, before it is ever run; then the third is
decoded. The reference for the decode is the measurement of that model (edgebench's llama-bench run, itself
held to llama-bench run by hand in test_llama_decode_bench.py) and, printed beside it, llama-bench typed by
hand in its own process. The held-out model is never stored (fit reads each evidence model's latest run:
this round's), and the rounds alternate the models, so a drift of the machine's load hits them alike; the
ratio is the best round's prediction over the fastest measurement. Asserted: 0.85-1.15 (the issue's 15%),
out of band a failure once three rounds ran on a quiet machine (others took under 15% of it, measured); on
a machine never quiet more rounds within the budget, then within 1.4x (edgebench.testing.verdict.
band_verdict). Beside two busy loops llama.cpp is bimodal per process: the same 16-token prefill of the same
file, back to back, read ~750 or ~2150 ms (its threads meet at a barrier every op; which mode a process
gets is chance), so a median of a few rounds is a coin toss and the fastest of each side is compared.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from edgebench.agent.bandwidth import last_level_cache
from edgebench.models.refs import resolve_model
from edgebench.testing.cli import edgebench
from edgebench.testing.labtools import tool_or_skip
from edgebench.testing.verdict import (
    OTHERS_QUIET,
    QUIET_ROUNDS,
    OthersWatch,
    Verdict,
    band_verdict,
    until_conclusive,
)

TOOL_DIR = "llama.cpp-20261001-linux-x86_64"
THREADS, PROMPT, NEW, ROUNDS = 2, 16, 8, 2
BAND, BROKEN = (0.85, 1.15), 2.0
BUDGET_S = 600.0  # more rounds, while another fits, when the first are not conclusive
VOCAB = 32000
# (hidden, ffn, heads, kv_heads): head size 128 throughout, as the Llamas that ship
MEASURED = ((2048, 5632, 16, 4), (1536, 4096, 12, 4))
HELD_OUT = (1792, 4864, 14, 2)


def q8_bytes(params: float) -> float:
    return params * 34 / 32  # Q8_0: 32 int8 and one f16 scale per block


def over_twice(llc: int, hidden: int, ffn: int, heads: int, kv_heads: int) -> str:
    """The built-in Llama of this shape with the fewest layers over 2.2 x the last-level cache."""
    kv = hidden // heads * kv_heads
    layer = q8_bytes(2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn)
    embed = q8_bytes(2 * VOCAB * hidden)  # token embedding and output
    layers = max(2, int((2.2 * llc - embed) / layer) + 1)
    return (
        f"builtin:llama:layers={layers},hidden={hidden},ffn={ffn},heads={heads},kv_heads={kv_heads},"
        f"vocab={VOCAB},dtype=q8_0"
    )


def decode_rate(store: Path | None, model: str, env: dict[str, str], cwd: Path) -> float:
    """Decode tokens/s of `model` on local by `probe decode` (p50 of its ms/token), kept in `store` with
    its floor (the first job of a store measures the bandwidth); without a store, no floor."""
    keep = ["--store", str(store)] if store else ["--no-store", "--no-floor"]
    res = edgebench(
        "probe", "decode", "--model", model, "--device", "local", "--threads", str(THREADS),
        "--prompt-tokens", str(PROMPT), "--new-tokens", str(NEW), "--rounds", "3", *keep, "--json",
        cwd=cwd, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    records = json.loads(res.stdout)["records"]
    p50 = next(
        r["value"]
        for r in records
        if r["metric"] == "decode_ms_per_token" and r["params"].get("stat") == "p50"
    )
    return 1000.0 / p50


def latest_runs(store: Path, count: int) -> set[str]:
    """The ids of the store's latest `count` runs."""
    from edgebench.results.store import Store

    with Store(store) as st:
        return {r.run_id for r in st.runs()[-count:]}


def by_hand(tool: Path, model: Path) -> float:
    """llama-bench as typed, in a session of its own: decode tokens/s (median of its repetitions)."""
    argv = [str(tool), "-m", str(model), "-p", "0", "-n", str(NEW), "-t", str(THREADS), "-r", "3"]
    argv += ["-o", "json"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert res.returncode == 0, res.stderr[-2000:]
    [test] = json.loads(res.stdout)
    return NEW / (statistics.median(test["samples_ns"]) / 1e9)


@pytest.mark.timeout(2400)
def test_fit_predicts_a_dram_sized_gguf_it_never_measured(benchmark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tools = tool_or_skip(
        Path(__file__).resolve().parents[2], TOOL_DIR, "llama-bench", "llama.cpp llama-bench"
    )
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    llc = last_level_cache()
    assert llc, "the host's last-level cache size is unknown"
    measured = [over_twice(llc, *shape) for shape in MEASURED]
    held_out = over_twice(llc, *HELD_OUT)
    for name in (*measured, held_out):
        assert resolve_model(name).path.stat().st_size > 2 * llc, name
    rounds: list[dict] = []
    store = tmp_path / "s.db"  # fit reads each model's latest run: this round's

    def one_round() -> None:
        i = len(rounds)
        with OthersWatch() as watch:
            for name in measured if i % 2 == 0 else measured[::-1]:
                decode_rate(store, name, env, tmp_path)
            res = edgebench(
                "fit", "--model", held_out, "--device", "local", "--threads", str(THREADS), "--depth",
                str((NEW - 1) // 2 + 1), "--store", store, "--no-store", "--json", cwd=tmp_path, env=env,
            )  # fmt: skip
            assert res.returncode == 0, res.stderr[-2000:]
            [got] = json.loads(res.stdout)["llm"]
            decode = got["decode_tokens_per_s"]
            assert decode["p50"], decode
            assert sorted(decode["evidence"]["models"]) == sorted(resolve_model(m).name for m in measured)
            assert {p["run_id"] for p in decode["evidence"]["points"]} <= latest_runs(store, 2)
            assert resolve_model(held_out).name not in decode["evidence"]["models"]
            assert decode["bandwidth"]["threads"] == THREADS
            rate = decode_rate(None, held_out, env, tmp_path)
        hand = by_hand(tools / "llama-bench", resolve_model(held_out).path)
        rounds.append({"predicted": decode["p50"], "low": decode["low"], "high": decode["high"], "measured": rate,
                       "by_hand": hand, "efficiencies": [p["efficiency"] for p in decode["evidence"]["points"]],
                       "others_share": watch.others_share})  # fmt: skip

    def judged(final: bool) -> Verdict:
        # fastest to fastest: the best round's prediction (its evidence decoded fastest) against the
        # fastest measurement. Under load llama.cpp is bimodal per process (below), and load only slows.
        ratio = max(r["predicted"] for r in rounds) / max(r["measured"] for r in rounds)
        quiet = [r for r in rounds if r["others_share"] < OTHERS_QUIET]
        basis = f"fastest of {len(rounds)} rounds a side, {len(quiet)} quiet"
        text = f"fit's decode prediction / the measurement: {ratio:.3f} over the {basis} (band {BAND})"
        return band_verdict(text, ratio, basis, len(quiet) >= QUIET_ROUNDS, *BAND, BROKEN, final, ratio)

    for _ in range(ROUNDS):
        one_round()
    verdict, extra = until_conclusive(one_round, judged, BUDGET_S, min_rounds=0)
    ratio = verdict.ratio
    hand_ratio = statistics.median(r["predicted"] / r["by_hand"] for r in rounds)
    benchmark.extra_info.update({"rounds": rounds, "ratio": ratio, "by_hand_ratio": hand_ratio})
    benchmark.pedantic(lambda: None, rounds=1)
    size = resolve_model(held_out).path.stat().st_size / 1e9
    print(
        f"\nfit's decode prediction for a {size:.2f} GB Q8_0 never measured / its measurement, {THREADS} threads: "
        f"{ratio:.3f} (by hand {hand_ratio:.3f}); per round "
        + "; ".join(
            f"{r['predicted']:.2f} [{r['low']:.2f}-{r['high']:.2f}] vs {r['measured']:.2f} (by hand "
            f"{r['by_hand']:.2f}) tokens/s, efficiencies {[round(e, 3) for e in r['efficiencies']]}"
            for r in rounds
        )
    )
    assert verdict.outcome == "pass", verdict.reason
