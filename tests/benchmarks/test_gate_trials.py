"""False alarms and power of the gate on real runs (issue 38's trials), on the local device.

One trial: a baseline run of a two-model suite (`repeats = 3`, onnx.helper MLPs), then four candidate
runs, each gated against that baseline:
  same        the same models;
  same busy   the same models, two busy loops (`edgebench.testing.load`) running throughout;
  heavy       `enc` 15% heavier (23 MatMul layers instead of 20, same name);
  heavy busy  the heavier `enc` with the busy loops.
and the two busy candidates gated again with `--confirm` (baseline and candidate measured alternately
from the store's kept copies, after the loops stopped):
  same confirm   `same busy` confirmed;
  heavy confirm  `heavy busy` confirmed.
Counted per scenario: whether any bench pair FAILed (false alarm for `same`), and the heavier `enc`'s
verdict. Bars (issue 38): same code FAIL in 0 of 20 quiet and at most 1 of 20 busy trials, none confirmed;
heavier never PASS, and FAIL in >= 18 of 20 with `--confirm`. The heavier model's FAIL rate without
`--confirm` is reported with how many of its trials were measured disturbed (disturbed pairs are NOISY by
design, so ">= 19/20 FAIL quietly" is only asserted over trials the agent measured quiet). Measured on this
2-core VM with nothing else running, two passes of 20 trials: unchanged code read -11.1% to +9.8%, then
-4.8% to +3.5%, from one run to the next (three invocations a side, each side tight: the host drifts
between runs minutes apart), the heavier -1.6% to +28%, then +8.9% to +23.4%; the gate FAILed it in 6,
then 13 of 20 and said NOISY otherwise (FAILing more would FAIL the drifting unchanged pairs too). With
`--confirm` (both sides in one alternation) the heavier read 1.12-1.19 and FAILed 20 of 20; the unchanged
code 0.97-1.02, PASS 19 and NOISY 1, none FAIL.

EDGEBENCH_FULL_TRIALS=1 runs 20 trials (about 25 minutes); the default is 1 trial (about a minute), which
still asserts that no same-code trial FAILs, no heavier trial PASSes and the confirmed heavier one FAILs.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from edgebench.results.store import Store
from edgebench.testing.cli import edgebench
from edgebench.testing.load import busy_loops
from tests.integration.test_gate_invocations_real import LAYERS, mlp

TRIALS = (
    20
    if os.environ.get("EDGEBENCH_FULL_TRIALS") == "1"
    else int(os.environ.get("EDGEBENCH_GATE_TRIALS", "1"))
)
SUITE = """name = "trial"
devices = ["local"]
models = [{{name = "enc", path = "{enc}"}}, {{name = "dec", path = "{dec}"}}]
[[probe]]
kind = "bench"
params = {{ threads = 1, runs = 30, warmup = 1, warmup_seconds = 0.05, min_seconds = 0.15, repeats = 3 }}
"""


def run(suite: Path, store: Path, cwd: Path) -> str:
    res = edgebench("run", suite, "--store", store, "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["run_id"])


def gate(store: Path, base: str, cand: str, cwd: Path, *extra: str) -> list[dict]:  # type: ignore[type-arg]
    res = edgebench(
        "gate",
        "--store",
        store,
        "--baseline",
        base,
        "--candidate",
        cand,
        "--json",
        "--no-store",
        *extra,
        cwd=cwd,
    )
    assert res.returncode in (0, 1), res.stderr
    return [p for p in json.loads(res.stdout)["pairs"] if p["metric"] == "latency_ms"]


def one_trial(folder: Path) -> dict[str, tuple[bool, str, bool]]:
    """scenario -> (any bench pair FAILed, the enc p50 verdict, the enc pair measured disturbed)."""
    folder.mkdir()
    enc, heavy = mlp(folder / "enc.onnx", LAYERS), mlp(folder / "enc-heavy.onnx", LAYERS + 3)
    dec = mlp(folder / "dec.onnx", LAYERS // 2)
    plain, heavier = folder / "plain.toml", folder / "heavy.toml"
    plain.write_text(SUITE.format(enc=enc, dec=dec))
    heavier.write_text(SUITE.format(enc=heavy, dec=dec))
    store = folder / "t.db"
    base = run(plain, store, folder)
    out = {}
    for name, suite, busy in (
        ("same", plain, False),
        ("same busy", plain, True),
        ("heavy", heavier, False),
        ("heavy busy", heavier, True),
    ):
        if busy:
            with busy_loops():
                cand = run(suite, store, folder)
        else:
            cand = run(suite, store, folder)
        pairs = gate(store, base, cand, folder)
        enc_p50 = next(p for p in pairs if p["model"] == "enc" and p.get("stat") == "p50")
        out[name] = (
            any(p["verdict"] == "FAIL" for p in pairs),
            enc_p50["verdict"],
            "measured disturbed" in enc_p50["reason"],
        )
        if busy:
            confirmed = gate(store, base, cand, folder, "--confirm")
            verdict = next(p for p in confirmed if p["model"] == "enc" and p.get("stat") == "p50")
            out[name.replace("busy", "confirm")] = (
                any(p["verdict"] == "FAIL" for p in confirmed),
                verdict["verdict"],
                False,
            )
            print(f"  {name}, --confirm: enc {verdict['verdict']}: {verdict['reason']}", flush=True)
        # The statistics alone, the disturbance guard off: what the invocations say on this host.
        alone = gate(store, base, cand, folder, "--max-wait", "100%")
        enc_alone = next(p for p in alone if p["model"] == "enc" and p.get("stat") == "p50")
        print(
            f"  {name}, --max-wait 100%: enc {enc_alone['verdict']} {enc_alone['change']:+.1%}, any FAIL: "
            f"{any(p['verdict'] == 'FAIL' for p in alone)}",
            flush=True,
        )
    with Store(store) as st:
        shares = sorted(r.value or 0.0 for r in st.records() if r.metric == "disturbance_others_cpu_share")
    print(
        f"  others' CPU share over the trial's jobs: median {shares[len(shares) // 2]:.0%}, max {shares[-1]:.0%}"
    )
    return out


# five suite runs and two confirms a trial, on a host that may be busy
@pytest.mark.timeout(300 + 300 * TRIALS)
def test_gate_false_alarms_and_power_on_real_runs(tmp_path: Path) -> None:
    trials = []
    for i in range(TRIALS):
        trials.append(one_trial(tmp_path / f"t{i}"))
        print(f"trial {i + 1}: {trials[-1]}", flush=True)
    for name in ("same", "same busy", "same confirm", "heavy", "heavy busy", "heavy confirm"):
        got = [t[name] for t in trials]
        verdicts = Counter(v for _, v, _ in got)
        print(
            f"{name}: any FAIL in {sum(f for f, _, _ in got)}/{TRIALS}; enc {dict(verdicts)}; "
            f"enc measured disturbed in {sum(d for _, _, d in got)}/{TRIALS}"
        )
    assert sum(t["same"][0] for t in trials) == 0
    assert sum(t["same busy"][0] for t in trials) <= TRIALS // 20  # measured disturbed: NOISY, not FAIL
    assert sum(t["same confirm"][0] for t in trials) == 0
    assert all(t[s][1] != "PASS" for t in trials for s in ("heavy", "heavy busy", "heavy confirm"))
    confirmed = [t["heavy confirm"][1] for t in trials]
    assert confirmed.count("FAIL") >= 0.9 * len(confirmed), confirmed
    quiet_heavy = [t["heavy"][1] for t in trials if not t["heavy"][2]]
    if len(quiet_heavy) >= 5:
        assert quiet_heavy.count("FAIL") >= 0.9 * len(quiet_heavy), quiet_heavy
    else:
        print(f"power not asserted: {len(quiet_heavy)} heavier trials measured quiet, 5 needed")
