"""Bare runtime loops: the references tests and benchmarks hold edgebench's figures against.

Written straight on each runtime's own API, sharing nothing with the agent, so a defect in the agent's
sessions or timers cannot hide in its own reference. Each loop makes its inputs the inputs on every run
(MNN's session reuses its input buffer for activations: the input is copied in again, outside the timer,
before every `runSession`) and returns per-run milliseconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BareTimes:
    """Per-run milliseconds of a bare loop and the outputs of its last run."""

    ms: tuple[float, ...]
    outputs: tuple[np.ndarray, ...]

    @property
    def p50(self) -> float:
        return statistics.median(self.ms)


def _loop(
    run: Callable[[], object], refresh: Callable[[], None], runs: int, warmup_s: float
) -> tuple[float, ...]:
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        refresh()
        run()
    times = []
    for _ in range(runs):
        refresh()
        t0 = time.perf_counter_ns()
        run()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return tuple(times)


def bare_mnn(
    path: str, feeds: dict[str, np.ndarray], threads: int, runs: int = 200, warmup_s: float = 0.5
) -> BareTimes:
    """MNN Interpreter/Session loop, the inputs copied in before every run (outside the timer)."""
    import MNN

    interp = MNN.Interpreter(path)
    session = interp.createSession({"backend": "CPU", "precision": "normal", "numThread": threads})
    tensors = {name: interp.getSessionInput(session, name) for name in feeds}
    resized = False
    for name, array in feeds.items():
        if list(tensors[name].getShape()) != list(array.shape):
            interp.resizeTensor(tensors[name], tuple(array.shape))
            resized = True
    if resized:
        interp.resizeSession(session)
        tensors = {name: interp.getSessionInput(session, name) for name in feeds}
    hosts = {
        name: MNN.Tensor(tuple(a.shape), MNN.Halide_Type_Float, a, MNN.Tensor_DimensionType_Caffe)
        for name, a in feeds.items()
    }

    def refresh() -> None:
        for name, tensor in tensors.items():
            tensor.copyFrom(hosts[name])

    times = _loop(lambda: interp.runSession(session), refresh, runs, warmup_s)
    outputs = []
    for tensor in interp.getSessionOutputAll(session).values():
        shape = tuple(tensor.getShape())
        host = MNN.Tensor(
            shape, MNN.Halide_Type_Float, np.zeros(shape, np.float32), MNN.Tensor_DimensionType_Caffe
        )
        tensor.copyToHostTensor(host)
        outputs.append(np.array(host.getNumpyData(), copy=True))
    return BareTimes(times, tuple(outputs))


def bare_onnxruntime(
    path: str, feeds: dict[str, np.ndarray], threads: int, runs: int = 200, warmup_s: float = 0.5
) -> BareTimes:
    """onnxruntime InferenceSession.run loop (onnxruntime never writes into its inputs)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    last: list[object] = []

    def run() -> None:
        last[:] = sess.run(None, feeds)

    times = _loop(run, lambda: None, runs, warmup_s)
    return BareTimes(times, tuple(np.asarray(o) for o in last))
