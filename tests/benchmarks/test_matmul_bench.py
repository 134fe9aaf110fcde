"""The matmul probe against the best each path can do on this machine, side by side in one
pytest-benchmark run: each round runs the probe (a real agent process on `local`) and then the reference
on the same CPUs and thread count, so drifting machine load hits both sides alike. The reference runs in a
process of its own session (edgebench.testing.bare.OwnSession), as the agent does, and times only the
paths it is judged on, so both sides spend about as long exposed to the machine's moods per round.

- fp32: the probe's figure vs numpy.matmul (the BLAS numpy links) — >= 0.85.
- int8: the probe's best int8 figure vs the best of the same int8 paths run here (onnxruntime
  MatMulInteger and QLinearMatMul with uint8 x int8, and the dynamic-quantized MatMul, through a plain
  InferenceSession.run) — >= 0.85. MatMulInteger with uint8 x uint8 and every path through io-binding
  with 64-byte aligned A and C are timed once at the end and printed, not judged: on an AMX machine a
  session's int8 rate swings 2x with where its buffers land (one path read 2315 and 1120 GOPS in
  back-to-back sessions, 2 threads), so the best of eight sessions beat the probe's best of three by the
  draw alone (0.53 and 0.81 in two runs), while the plain paths showed no lasting gain from alignment
  (MatMulInteger 891 vs 873).

Like with like on a shared machine (edgebench.testing.verdict): every trial on both sides records the
process CPU time, and a trial counts as quiet when it got at least 85% of the CPUs it asked for *and* the
rest of the machine was idle while its side ran (`OthersWatch`). CPU shares alone were fooled: beside two
busy loops, a 2-thread onnxruntime pool spinning while its other thread waited for a CPU read share 0.97
at 40% of the rate, and stretches in which the reference happened to get both CPUs made a sound int8
probe "short on a quiet machine" at 0.46-0.55. The probe's best trial is held to a figure the reference
reached in three trials: one undisturbed trial of the reference is not its rate; and the probe's third
best over the reference's best must stay under HIGH (a figure counted wrong reads 2x). Rounds repeat
(MIN_ROUNDS, then more until the verdict is conclusive, within BUDGET_S and MAX_ROUNDS). Over quiet trials
a shortfall fails; under BROKEN fails whatever the load; when the machine was never quiet (GEMM rates swing
up to 2x for seconds on a shared machine) the final verdict holds each side's rate per CPU-second it ran
(preemption takes wall time, not CPU time) to 0.7 and the medians to BROKEN: pass or fail, never a skip.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebench.descriptors import builtin_local
from edgebench.execution.oneshot import run_now
from edgebench.jobs import Job
from edgebench.testing.bare import OwnSession, bare_numpy_matmul_trials, cpu_timed_trials
from edgebench.testing.verdict import HIGH, OthersWatch, Side, Verdict, judge

N = 1024
OPS = 2 * N**3
MIN_ROUNDS = 3
MAX_ROUNDS = 10
BUDGET_S = 150.0  # rounds start while another fits in it: a conclusive verdict usually comes first
# Many one-call trials on both sides: on this shared host a core's GEMM rate swings 3x with what the
# host's other tenants run (the guest's CPU share stays 1: it cannot see it), so trials long enough to
# average over those swings compared a slow stretch of one side with a fast stretch of the other.
TRIALS = 30
# The probe and its reference run in processes of their own, and this VM's speed differs from one process
# to the next (the same GEMM 20-40% apart between back-to-back processes): over quiet trials a probe
# equal to its reference read 0.903 (fp32, 2 threads) and 0.949 (int8, 1 thread) after ten rounds in one
# fresh-clone run and passed 0.97/0.95 in the next. 0.85 still fails a probe on one thread of two (0.5)
# or on an emulated dtype (0.25 and below).
FP32_BOUND = 0.85
INT8_BOUND = 0.85
# A loaded shared machine halves a GEMM rate for seconds, and more with two threads: beside two busy loops
# the 2-thread probe read 0.48 and 0.53 of numpy over disturbed trials in two fresh-clone runs (and 1.0 in
# three more; alone in the agent, one of its runs took 54 GFLOPS where the next took 116), with both sides
# in sessions of their own. So over disturbed trials only a path far off fails (an emulated dtype is 4x and
# more); one thread used for two (0.5) is caught over quiet trials, on a quiet machine, by the bound.
BROKEN = 0.4
THREADS = (1, 2)


def add(side: Side, wall_s: list[float], cpu_s: list[float], threads: int, machine_quiet: bool) -> None:
    """Each trial as (TOPS, CPU share of the threads it asked for, whether the machine was otherwise idle)."""
    for w, c in zip(wall_s, cpu_s, strict=True):
        side.add(OPS / w / 1e12, c / (w * threads), machine_quiet)


def conclude(verdicts: dict[int, Verdict]) -> None:
    """Fail on any failed thread count (final verdicts are pass or fail)."""
    failed = [v.reason for v in verdicts.values() if v.outcome != "pass"]
    assert not failed, failed


def cpus_for(threads: int) -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < threads:
        pytest.skip(f"needs {threads} CPUs")
    return allowed[:threads]


def timed_trials(step: Callable[[], object]) -> tuple[list[float], list[float]]:
    return cpu_timed_trials(step, TRIALS)


def probe_trials(params: dict) -> dict[tuple[str, str, str], tuple[list[float], list[float], int]]:
    """The probe's raw trials (wall and CPU seconds per call) per backend, op and dtype, from its samples."""
    given = {"sizes": [N], "skinny": False, "trials": TRIALS, "min_trial_seconds": 0.0}
    job = Job("local", "matmul", params={**given, **params})
    shot = run_now(builtin_local(), [job], None, "matmul")
    shot.raise_first_error()
    samples = {
        (s.metric, s.params["backend"], s.params["op"], s.params["dtype"]): s
        for s in shot.outcomes[0].samples
    }
    out = {}
    for (metric, backend, op, dtype), s in samples.items():
        if metric == "trial_ms":
            cpu = samples[("trial_cpu_ms", backend, op, dtype)]
            out[(backend, op, dtype)] = (
                [v / 1e3 for v in s.values],
                [v / 1e3 for v in cpu.values],
                int(s.params["threads"]),
            )
    # The figure users read is the record: it must be this test's own count (OPS, 2 x N^3) over the
    # fastest trial the test then judges against the reference's own timing, not another arithmetic.
    for r in shot.records:
        if r.metric == "effective_tops" and r.params.get("stat") == "best":
            wall, _, _ = out[(r.params["backend"], r.params["op"], r.params["dtype"])]
            assert r.value == pytest.approx(OPS / min(wall) / 1e12, rel=1e-6), r
    return out


def int8_graph(op: str) -> tuple[bytes, dict[str, np.ndarray]]:
    """One-node onnxruntime graphs built with onnx.helper (independent of the agent's own writer)."""
    rng = np.random.default_rng(1)
    a_u8 = rng.integers(0, 256, (N, N), dtype=np.uint8)
    b_s8 = rng.integers(-128, 128, (N, N), dtype=np.int8)
    scalar = lambda name, v, dt: numpy_helper.from_array(np.array(v, dt), name)  # noqa: E731
    opsets = [helper.make_opsetid("", 17)]
    if op == "MatMulInteger" or op == "MatMulInteger:u8u8":
        b = (b_s8.astype(np.int16) + 128).astype(np.uint8) if op.endswith("u8u8") else b_s8
        node = helper.make_node("MatMulInteger", ["A", "B", "az", "bz"], ["C"])
        inits = [numpy_helper.from_array(b, "B"), scalar("az", 128, np.uint8), scalar("bz", 0, b.dtype)]
        out_type, in_type, feeds = TensorProto.INT32, TensorProto.UINT8, {"A": a_u8}
    elif op == "QLinearMatMul":
        node = helper.make_node("QLinearMatMul", ["A", "as", "az", "B", "bs", "bz", "ys", "yz"], ["C"])
        inits = [numpy_helper.from_array(b_s8, "B"), scalar("as", 1.0, np.float32),
                 scalar("az", 128, np.uint8), scalar("bs", 1.0, np.float32), scalar("bz", 0, np.int8),
                 scalar("ys", 6000.0, np.float32), scalar("yz", 128, np.uint8)]  # fmt: skip
        out_type, in_type, feeds = TensorProto.UINT8, TensorProto.UINT8, {"A": a_u8}
    else:  # the dynamic-quantized MatMul, as onnxruntime fuses quantize_dynamic's output
        node = helper.make_node(
            "DynamicQuantizeMatMul", ["A", "B", "bs", "bz"], ["C"], domain="com.microsoft"
        )
        inits = [numpy_helper.from_array(b_s8, "B"), scalar("bs", 0.01, np.float32), scalar("bz", 0, np.int8)]
        out_type, in_type = TensorProto.FLOAT, TensorProto.FLOAT
        feeds = {"A": rng.uniform(-1, 1, (N, N)).astype(np.float32)}
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", in_type, [N, N])],
                              [helper.make_tensor_value_info("C", out_type, [N, N])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString(), feeds


OPS_INT8 = ("MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulInteger:u8u8")
INT8_PATHS = (*OPS_INT8, *(f"{op} io-bound aligned" for op in OPS_INT8))
JUDGED_PATHS = OPS_INT8[:3]  # the probe's own int8 paths, as many session draws on each side
OUT_TYPES = {"MatMulInteger": np.int32, "QLinearMatMul": np.uint8, "DynamicQuantizeMatMul": np.float32}


def aligned(array: np.ndarray | None, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A 64-byte aligned array (a copy of `array` when given), allocated independently of the agent."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    out = raw[start : start + nbytes].view(dtype).reshape(shape)
    if array is not None:
        out[...] = array
    return out


def ort_int8_trials(
    threads: int, cpus: list[int], ops: tuple[str, ...], io_bound: bool
) -> dict[str, tuple[list[float], list[float]]]:
    """The int8 `ops` on `cpus` through plain InferenceSession.run, and through io-binding with aligned A
    and C when `io_bound`. Run it in an `OwnSession`, as the agent's probe runs in a session of its own."""
    os.sched_setaffinity(0, cpus)
    found = {}
    for op in ops:
        model, feeds = int8_graph(op)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        found[op] = timed_trials(lambda s=sess, f=feeds: s.run(None, f))
        if not io_bound:
            continue
        a = aligned(feeds["A"], feeds["A"].shape, feeds["A"].dtype.type)
        c = aligned(None, (N, N), OUT_TYPES[op.split(":")[0]])
        binding = sess.io_binding()
        binding.bind_cpu_input("A", a)
        binding.bind_output("C", "cpu", 0, c.dtype, list(c.shape), c.ctypes.data)
        found[f"{op} io-bound aligned"] = timed_trials(lambda s=sess, b=binding: s.run_with_iobinding(b))
    return found


def alternate(benchmark, one_round: Callable[[list[int]], None], pending: Callable[[], list[int]]) -> int:  # type: ignore[no-untyped-def]
    """Rounds of both sides until every thread count passed (MIN_ROUNDS, then while another round fits in
    BUDGET_S, MAX_ROUNDS at most): the rounds run. What is still open then gets its final verdict."""
    rounds, start = 0, time.monotonic()

    def step() -> None:
        nonlocal rounds
        spent = time.monotonic() - start
        if rounds >= MIN_ROUNDS and spent + spent / rounds > BUDGET_S:
            return
        todo = pending() if rounds >= MIN_ROUNDS else list(THREADS)
        if todo:
            one_round(todo)
            rounds += 1

    benchmark.pedantic(step, rounds=MAX_ROUNDS, iterations=1, warmup_rounds=0)
    return rounds


def test_fp32_probe_reaches_numpy_matmul(benchmark) -> None:  # type: ignore[no-untyped-def]
    probe = {t: Side() for t in THREADS}
    reference = {t: Side() for t in THREADS}

    own = OwnSession()

    def one_round(threads_todo: list[int]) -> None:
        for threads in threads_todo:
            cpus = cpus_for(threads)
            with OthersWatch() as watch:
                got = probe_trials(
                    {"backend": "numpy", "dtype": "fp32", "threads": threads, "affinity": cpus}
                )
            add(probe[threads], *got[("numpy", "matmul", "fp32")], watch.quiet)
            # numpy in a session of its own, as the agent is (edgebench.testing.bare.OwnSession)
            with OthersWatch(trees=[worker]) as watch:
                wall, cpu = own.call(bare_numpy_matmul_trials, N, threads, cpus, TRIALS)
            add(reference[threads], wall, cpu, threads, watch.quiet)

    def verdicts(final: bool = False) -> dict[int, Verdict]:
        return {t: judge(f"fp32 threads={t}", probe[t], reference[t], FP32_BOUND, BROKEN, high=HIGH, final=final)
                for t in THREADS}  # fmt: skip

    def pending() -> list[int]:
        return [t for t, v in verdicts().items() if v.outcome != "pass"]

    with own:
        worker = own.call(os.getpid)
        rounds = alternate(benchmark, one_round, pending)
    # every fp32 path the probe has (onnxruntime's MLAS may beat the BLAS numpy links), once, for the record
    best_path = {}
    for t in THREADS:
        got = probe_trials({"backend": ["numpy", "onnxruntime"], "dtype": "fp32", "threads": t,
                            "affinity": cpus_for(t)})  # fmt: skip
        best_path[t] = {key[0]: OPS / min(wall) / 1e12 for key, (wall, _, _) in got.items()}
    final = verdicts(final=True)
    for t in THREADS:
        quiet = final[t].basis.startswith("quiet")
        print(f"\nfp32 n={N} threads={t}: probe (numpy backend) {probe[t].best(quiet) * 1e3:.1f} GFLOPS, "
              f"numpy.matmul {reference[t].corroborated(quiet) * 1e3:.1f}; {final[t].reason}; probe's fp32 paths: "
              + ", ".join(f"{b} {v * 1e3:.1f}" for b, v in best_path[t].items()))  # fmt: skip
    benchmark.extra_info.update({"ratio": {t: v.ratio for t, v in final.items()}, "rounds": rounds,
                                 "basis": {t: v.basis for t, v in final.items()}})  # fmt: skip
    conclude(final)


def test_int8_probe_reaches_the_best_int8_path(benchmark) -> None:  # type: ignore[no-untyped-def]
    probe = {t: Side() for t in THREADS}
    paths: dict[int, dict[str, Side]] = {t: {op: Side() for op in INT8_PATHS} for t in THREADS}

    def best_path(t: int) -> tuple[str, Side]:
        """The fastest reference path: the best figure a path reached in CORROBORATED trials, quiet or not
        (load only slows a path). Choosing among paths with quiet trials only made a weak path the
        reference when the fastest one's trials used a little more than their CPUs (2 threads, share
        1.13-1.2): 2.2x "over quiet trials", which a probe at half speed would also have passed."""
        op = max(JUDGED_PATHS, key=lambda o: paths[t][o].corroborated(False))
        return op, paths[t][op]

    def one_round(threads_todo: list[int]) -> None:
        for threads in threads_todo:
            cpus = cpus_for(threads)
            with OthersWatch() as watch:
                got = probe_trials(
                    {"backend": "onnxruntime", "dtype": "int8", "threads": threads, "affinity": cpus}
                )
            for wall, cpu, t in got.values():  # the probe's best int8 figure: all its int8 paths
                add(probe[threads], wall, cpu, t, watch.quiet)
            with OthersWatch(trees=[worker]) as watch:
                timed = own.call(ort_int8_trials, threads, cpus, JUDGED_PATHS, False)
            for op, (wall, cpu) in timed.items():
                add(paths[threads][op], wall, cpu, threads, watch.quiet)

    def verdicts(final: bool = False) -> dict[int, Verdict]:
        return {t: judge(f"int8 threads={t}", probe[t], best_path(t)[1], INT8_BOUND, BROKEN, high=HIGH,
                         final=final) for t in THREADS}  # fmt: skip

    def pending() -> list[int]:
        return [t for t, v in verdicts().items() if v.outcome != "pass"]

    own = OwnSession()
    with own:
        worker = own.call(os.getpid)
        rounds = alternate(benchmark, one_round, pending)
        # the paths not judged, once, for the record
        for t in THREADS:
            with OthersWatch(trees=[worker]) as watch:
                timed = own.call(ort_int8_trials, t, cpus_for(t), OPS_INT8, True)
            for op, (wall, cpu) in timed.items():
                if op not in JUDGED_PATHS:
                    add(paths[t][op], wall, cpu, t, watch.quiet)
    final = verdicts(final=True)
    for t in THREADS:
        op, side = best_path(t)
        quiet = final[t].basis.startswith("quiet")
        print(f"\nint8 n={N} threads={t}: probe {probe[t].best(quiet) * 1e3:.1f} GOPS "
              f"(CPU share {probe[t].best_share(quiet):.2f}), best path here ({op}) {side.corroborated(quiet) * 1e3:.1f} "
              f"GOPS (CPU share {side.best_share(quiet):.2f}); {final[t].reason}; paths "
              + ", ".join(f"{o} {s.corroborated(quiet) * 1e3:.0f}/{s.best_share(quiet):.2f}" for o, s in paths[t].items()))  # fmt: skip
    benchmark.extra_info.update({"ratio": {t: v.ratio for t, v in final.items()}, "rounds": rounds})
    conclude(final)
