"""Bare runtime loops: the references tests and benchmarks hold edgebench's figures against.

Written straight on each runtime's own API, sharing nothing with the agent's sessions or timers, so a
defect there cannot hide in its own reference. Each loop makes its inputs the inputs on every run (MNN's
session reuses its input buffer for activations: the input is copied in again, outside the timer, before
every `runSession`) and returns per-run milliseconds. The one thing shared is the CPU clock that sorts
quiet trials from disturbed ones (`agent.timing.process_cpu_ns`, held to an exact bound in its unit test):
it decides which trials are compared, never a figure.

`OwnSession` runs them in a process of its own session, as edgebench's local transport starts its agents
and tools: with autogroup scheduling (Linux's default on desktops) a session shares the CPUs as one group,
so a loop run inside the test's process competes with whatever else runs in the test's session (busy
loops started beside the test suite took it to 0.72 of the agent's speed) while the agent does not.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from edgebench.agent.timing import process_cpu_ns


@dataclass(frozen=True)
class BareTimes:
    """Per-run milliseconds of a bare loop and the outputs of its last run."""

    ms: tuple[float, ...]
    outputs: tuple[np.ndarray, ...]

    @property
    def p50(self) -> float:
        return statistics.median(self.ms)


T = TypeVar("T")


class OwnSession:
    """One worker process in a session of its own (a fresh interpreter: nothing of the test's state),
    reused for every call so the runtime is imported once."""

    def __enter__(self) -> OwnSession:
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(1, mp_context=context, initializer=os.setsid)
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(cancel_futures=True)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._pool.submit(fn, *args, **kwargs).result()


def _loop(
    run: Callable[[], object], refresh: Callable[[], None], runs: int, warmup_s: float, min_s: float = 0.0
) -> tuple[float, ...]:
    """`runs` timed runs after the warm-up, and more until `min_s` seconds of them have passed."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        refresh()
        run()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs or time.perf_counter() - start < min_s:
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
    path: str,
    feeds: dict[str, np.ndarray],
    threads: int,
    runs: int = 200,
    warmup_s: float = 0.5,
    min_s: float = 0.0,
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

    times = _loop(run, lambda: None, runs, warmup_s, min_s)
    return BareTimes(times, tuple(np.asarray(o) for o in last))


def bare_onnxruntime_slowdown(
    path: str,
    feeds: dict[str, np.ndarray],
    hogs: int,
    runs: int = 300,
    warmup_s: float = 0.2,
    min_s: float = 1.0,
    hogs_alone_s: float = 1.0,
) -> float:
    """Mean latency of a one-thread bare onnxruntime loop beside `hogs` busy interpreters over its mean
    alone (before and after), each phase at least `min_s` long after the hogs ran `hogs_alone_s` alone, as
    the agent's contention phases are: a phase of a few hundred runs of a small model lasts tens of
    milliseconds, a few of the scheduler's slices, and read x3.3 where second-long ones read x1.7. Run it
    in an `OwnSession`: the loop and its hogs then share a session, as an agent and the co-runners it
    starts do, and busy work elsewhere weighs on both sides alike."""

    def phase() -> BareTimes:
        return bare_onnxruntime(path, feeds, threads=1, runs=runs, warmup_s=warmup_s, min_s=min_s)

    before = phase()
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        time.sleep(hogs_alone_s)
        beside = phase()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    after = phase()
    return statistics.fmean(beside.ms) / statistics.fmean([*before.ms, *after.ms])


def cpu_timed_trials(
    step: Callable[[], object], trials: int, min_trial_s: float = 0.0, warmup_s: float = 0.2
) -> tuple[list[float], list[float]]:
    """Warm up, then `trials` trials of at least `min_trial_s`: per-call wall and CPU seconds (every
    thread of the process)."""
    start = time.perf_counter()
    step()
    one = time.perf_counter() - start
    while time.perf_counter() - start < warmup_s:
        step()
    calls = max(1, int(min_trial_s / max(one, 1e-9)))
    wall, cpu = [], []
    for _ in range(trials):
        c0, t0 = process_cpu_ns(), time.perf_counter()
        for _ in range(calls):
            step()
        wall.append((time.perf_counter() - t0) / calls)
        cpu.append((process_cpu_ns() - c0) / 1e9 / calls)
    return wall, cpu


def bare_numpy_matmul_trials(
    n: int, threads: int, cpus: list[int], trials: int
) -> tuple[list[float], list[float]]:
    """numpy.matmul of two n x n float32 matrices on `cpus` with `threads` BLAS threads: one-call trials
    (`cpu_timed_trials`). Run it in an `OwnSession` (the agent's probe has a session of its own: beside two
    busy loops a reference in the test's session read half the probe's rate)."""
    from threadpoolctl import threadpool_limits

    os.sched_setaffinity(0, cpus)
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (n, n)).astype(np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        return cpu_timed_trials(lambda: np.matmul(a, b, out=out), trials)


def bare_cold_warm_loads(path: str, pairs: int) -> tuple[list[float], list[float]]:
    """(cold, warm) onnxruntime session loads in ms, `pairs` times: the file's pages dropped from the page
    cache (fsync, posix_fadvise DONTNEED: as `bench --cold-load` drops them), a load, then a load again."""
    import onnxruntime as ort

    def load() -> float:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        start = time.perf_counter_ns()
        session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        elapsed = (time.perf_counter_ns() - start) / 1e6
        del session
        return elapsed

    load()  # the runtime's own first-use costs are not the file's
    cold, warm = [], []
    for _ in range(pairs):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        cold.append(load())
        warm.append(load())
    return cold, warm


def bare_ncnn(
    path: str,
    feeds: dict[str, np.ndarray],
    threads: int,
    runs: int = 200,
    warmup_s: float = 0.5,
    fp16: bool | None = False,
    vulkan: bool = False,
) -> BareTimes:
    """ncnn Net/Extractor loop as its examples write it: fp16/bf16 storage and arithmetic set as asked
    (ncnn's own default differs by CPU; None keeps it), an extractor per run, every output extracted (on
    Vulkan, `extract` downloads each output: the time is through the read). The inputs are given without
    a batch axis of 1 (ncnn has none); the arrays stay referenced while their Mats wrap them (an
    `ncnn.Mat` does not own a numpy array's memory)."""
    import ncnn

    net = ncnn.Net()
    net.opt.num_threads = threads
    if vulkan:
        net.opt.use_vulkan_compute = True
        net.set_vulkan_device(0)
    if fp16 is not None:
        for name in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic"):
            setattr(net.opt, name, fp16)
    net.opt.use_bf16_storage = False
    assert net.load_param(path) == 0, path
    assert net.load_model(os.path.splitext(path)[0] + ".bin") == 0, path
    arrays = {
        name: np.ascontiguousarray(a.reshape(a.shape[1:]) if a.ndim > 1 and a.shape[0] == 1 else a)
        for name, a in feeds.items()
    }
    mats = [(name, ncnn.Mat(a).clone()) for name, a in arrays.items()]  # owned, as the session's
    names = list(net.output_names())
    last: list[object] = []

    def run() -> None:
        ex = net.create_extractor()
        for name, mat in mats:
            ex.input(name, mat)
        last[:] = [ex.extract(name)[1] for name in names]

    times = _loop(run, lambda: None, runs, warmup_s)
    return BareTimes(times, tuple(np.array(m, copy=True) for m in last))
