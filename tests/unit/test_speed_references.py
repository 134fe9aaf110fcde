"""The speed references of a profile: fixed kernels timed once per measured round beside the plain runs,
never during the warm-up, opened in the task's runtime at its threads."""

from __future__ import annotations

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
    # the cached GEMM does 2 * 256^3 FLOPs, the GEMV streams 16 MiB: neither can take under 10 us
    assert all(min(t) > 0.01 for t in beside.times.values())


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
