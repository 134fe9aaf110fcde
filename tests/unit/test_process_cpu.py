"""The agent's process CPU clock counts threads that are still running up to the moment it is read."""

from __future__ import annotations

import os
import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgebench.agent.timing import process_cpu_ns

N = 1024


def two_thread_int8_matmul() -> tuple[ort.InferenceSession, dict[str, np.ndarray]]:
    node = helper.make_node("MatMulInteger", ["a", "b"], ["c"])
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, [N, N]),
            helper.make_tensor_value_info("b", TensorProto.INT8, [N, N]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.INT32, [N, N])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {
        "a": rng.integers(0, 255, (N, N), dtype=np.uint8),
        "b": rng.integers(-128, 127, (N, N), dtype=np.int8),
    }
    return sess, feeds


def test_one_short_call_on_two_threads_never_reads_more_than_two_cpus() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    sess, feeds = two_thread_int8_matmul()
    for _ in range(20):
        sess.run(None, feeds)
    shares = []
    for _ in range(15):
        c0, t0 = process_cpu_ns(), time.perf_counter_ns()
        sess.run(None, feeds)
        shares.append((process_cpu_ns() - c0) / ((time.perf_counter_ns() - t0) * 2))
    # The reference is exact: two threads cannot use more than two CPUs (the process clock, which adds the
    # other thread's time as last accounted at a scheduler tick, read 0.5 and 1.7 by turns here, over one
    # call of ~1.3 ms; this clock 1.0). Under load a share may fall, never rise past 1.
    assert max(shares) <= 1.1, shares


def test_over_a_long_window_it_agrees_with_the_process_clock() -> None:
    # The reference: the process clock, whose lag of a scheduler tick per running thread is small against
    # half a second of two-thread calls (a clock that missed the worker thread would read about half).
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    sess, feeds = two_thread_int8_matmul()
    sess.run(None, feeds)
    c0, p0, t0 = process_cpu_ns(), time.process_time_ns(), time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        sess.run(None, feeds)
    ours, theirs = process_cpu_ns() - c0, time.process_time_ns() - p0
    assert 0.85 <= ours / theirs <= 1.15, (ours, theirs)


def test_it_moves_with_this_threads_own_work() -> None:
    before_own, before = time.thread_time_ns(), process_cpu_ns()
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:
        pass
    own, seen = time.thread_time_ns() - before_own, process_cpu_ns() - before
    assert seen >= own * 0.99 and own > 10_000_000
