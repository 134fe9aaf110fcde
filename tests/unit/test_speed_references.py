"""The speed references of a profile: fixed kernels timed once per measured round beside the plain runs,
never during the warm-up, opened in the task's runtime at its threads."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edgebench.agent.numerics import _alternate, _speed_references
from edgebench.models.kernel_samples import sample_model
from edgebench.probes.profile import SPEED_REFERENCES, speed_reference_files


class Counted:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_each_reference_is_timed_once_per_measured_round_and_not_in_the_warm_up() -> None:
    pytest.importorskip("onnxruntime")
    paths = [str(sample_model(key)[1]) for key in SPEED_REFERENCES]
    beside = _speed_references({"runtime": "onnxruntime", "threads": 1, "speed_references": paths}, [])
    assert beside is not None
    plain, instrumented = Counted(), Counted()
    latencies = _alternate(plain, instrumented, warmup=2, runs=5, beside=beside)
    assert len(latencies) == 5 and plain.calls == instrumented.calls == 7
    assert sorted(beside.times) == sorted(paths)
    assert all(len(t) == 5 and min(t) > 0 for t in beside.times.values())
    # each reference's time agrees with a bare onnxruntime loop over the same file (a generous ratio band)
    for path, times in beside.times.items():
        bare = bare_ms(path)
        assert 0.2 <= float(np.median(times)) / bare <= 5.0, (path, times, bare)


class Evicting:
    """A plain run whose model evicts what the reference had cached: the reference's next call is slow."""

    def __init__(self) -> None:
        self.evicted = False

    def __call__(self) -> None:
        self.evicted = True


class Cacheable:
    """A reference that takes 20 ms when the model just run evicted it, and no time when warm."""

    def __init__(self, model: Evicting) -> None:
        self.model, self.calls = model, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.model.evicted:
            self.model.evicted = False
            time.sleep(0.02)


def test_each_reference_is_timed_warm_not_as_the_model_left_the_caches() -> None:
    """The reference's time says how fast the device runs, not how much of the caches the model used:
    it runs once untimed after each plain run, then is timed."""
    from edgebench.agent.numerics import SpeedReferences

    plain = Evicting()
    reference = Cacheable(plain)
    beside = SpeedReferences({"gemm": reference})
    _alternate(plain, Counted(), warmup=1, runs=4, beside=beside)
    assert len(beside.times["gemm"]) == 4 and reference.calls == 2 * 5
    assert max(beside.times["gemm"]) < 10.0, beside.times


def bare_ms(path: str, runs: int = 5) -> float:
    """The median of a plain InferenceSession.run loop over the model, one thread, random inputs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {
        i.name: np.random.default_rng(0).random([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
        for i in session.get_inputs()
    }
    session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def test_a_task_without_references_times_none() -> None:
    assert _speed_references({"runtime": "onnxruntime"}, []) is None


def test_each_runtime_gets_its_own_file_of_each_reference() -> None:
    onnx_files = speed_reference_files("onnxruntime")
    assert sorted(onnx_files) == sorted(sample_model(k)[0] for k in SPEED_REFERENCES)
    assert all(p.suffix == ".onnx" and p.is_file() for p in onnx_files.values())
    pytest.importorskip("MNN")
    mnn_files = speed_reference_files("mnn")
    assert sorted(mnn_files) == sorted(onnx_files)
    assert all(p.suffix == ".mnn" and p.is_file() for p in mnn_files.values())
