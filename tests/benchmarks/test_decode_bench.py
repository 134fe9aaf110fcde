"""edgebench's decode against a bare onnxruntime greedy loop (its own process, none of the agent's code) on
the same built-in decoder and threads, alternated in one run: decode ms per token p50 and the prefill time
(goal 0.95-1.05; the bounds asserted are generous)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from edgebench.descriptors import builtin_local
from edgebench.execution.oneshot import run_now
from edgebench.jobs import Job
from edgebench.models.decoders import parse_decoder
from edgebench.models.refs import resolve_model
from edgebench.stats import corroborated_ratio

KEY = "decoder:layers=4,hidden=512,heads=8,vocab=4000,ffn=2048"  # 57 MB of fp32 weights
ROUNDS, PROMPT, NEW, THREADS = 4, 64, 48, 1

BARE = """
import json, statistics, sys, time
import numpy as np, onnxruntime as ort
path, layers, heads, head_dim, prompt_n, steps, threads = sys.argv[1], *map(int, sys.argv[2:])
opts = ort.SessionOptions()
opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
names = [o.name for o in sess.get_outputs()]
kv = [f"past_key_values.{i}.{p}" for i in range(layers) for p in ("key", "value")]
def generate(prompt):
    past = {n: np.zeros((1, heads, 0, head_dim), np.float32) for n in kv}
    ids, start, times, prefill = prompt, 0, [], None
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        out = sess.run(names, {"input_ids": np.array([ids], np.int64),
                               "attention_mask": np.ones((1, start + len(ids)), np.int64),
                               "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None], **past})
        past, start = dict(zip(kv, out[1:])), start + len(ids)
        ids = [int(out[0][0, -1].argmax())]
        ms = (time.perf_counter() - t0) * 1e3
        times.append(ms) if prefill is not None else None
        prefill = ms if prefill is None else prefill
    return prefill, times
prompt = [int(t) for t in np.random.default_rng(0).integers(0, 4000, prompt_n)]
for _ in range(3):
    generate(prompt)
prefill, times = zip(*(generate(prompt) for _ in range(3)))
print(json.dumps({"prefill_ms": statistics.median(prefill), "step_ms": [t for r in times for t in r]}))
"""


def bare(path: str) -> tuple[float, float]:
    c = parse_decoder(KEY)
    argv = [sys.executable, "-c", BARE, path]
    argv += [str(v) for v in (c.layers, c.heads, c.head_dim, PROMPT, NEW, THREADS)]
    # a session of its own, as the agent has (README: agents and references in their own session)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    return doc["prefill_ms"], statistics.median(doc["step_ms"])


def ours(job: Job) -> tuple[float, float]:
    shot = run_now(builtin_local(), [job], None, "decode")
    shot.raise_first_error()
    got = {(r.metric, r.params.get("stat")): r.value for r in shot.records}
    return got[("ttft_ms", "p50")], got[("decode_ms_per_token", "p50")]


def test_decode_matches_a_bare_onnxruntime_loop(benchmark) -> None:  # type: ignore[no-untyped-def]
    model = resolve_model(f"builtin:{KEY}")
    params = {
        "prompt_tokens": PROMPT, "new_tokens": NEW, "threads": THREADS, "rounds": 3, "warmup": 3,
        "floor": False, "verify": False,
    }  # fmt: skip
    job = Job("local", "decode", model, "onnxruntime", params)
    edge: list[tuple[float, float]] = []
    ref: list[tuple[float, float]] = []

    def measure() -> tuple[float, float]:
        for _ in range(ROUNDS):  # alternate the two sides so drifting machine load hits both alike
            edge.append(ours(job))
            ref.append(bare(str(model.path)))
        # Each side's corroborated fastest round (k-th fastest, k a third of the rounds): a busy machine
        # only adds time, so the least-disturbed rounds are the comparable ones (a ratio of medians over
        # four rounds swung 1.2-1.5 beside other work), and one lucky round alone does not decide.
        return (
            corroborated_ratio([e[1] for e in edge], [r[1] for r in ref]),
            corroborated_ratio([e[0] for e in edge], [r[0] for r in ref]),
        )

    step, prefill = measure()
    if not (0.7 < step < 1.4 and 0.7 < prefill < 1.4):
        step, prefill = measure()  # out of band: as many rounds again, judged over all of them
    benchmark.extra_info.update(
        {"edgebench": edge, "bare": ref, "step_ratio": step, "prefill_ratio": prefill}
    )
    benchmark.pedantic(lambda: None, rounds=1)
    print(
        f"\nedgebench / bare onnxruntime loop: decode ms/token p50 (corroborated fastest of {len(edge)} rounds) {step:.3f}, prefill {prefill:.3f} (goal "
        f"0.95-1.05); edgebench {statistics.median(e[1] for e in edge):.3f} ms/token, bare "
        f"{statistics.median(r[1] for r in ref):.3f} ms/token"
    )
    assert 0.7 < step < 1.4 and 0.7 < prefill < 1.4  # generous: a shared 2-core machine
