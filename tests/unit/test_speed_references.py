"""The speed references of a profile: fixed kernels timed in a block before and one after the model's
rounds, never between them, opened in the task's runtime at its threads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgebench.agent.numerics import _speed_references
from edgebench.agent.timing import alternate as _alternate
from edgebench.models.kernel_samples import sample_model
from edgebench.probes.profile import SPEED_REFERENCES, speed_reference_files


class Counted:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_each_reference_is_timed_in_a_block_and_agrees_with_a_bare_loop() -> None:
    pytest.importorskip("onnxruntime")
    paths = [str(sample_model(key)[1]) for key in SPEED_REFERENCES]
    beside = _speed_references({"runtime": "onnxruntime", "threads": 1, "speed_references": paths}, [])
    assert beside is not None
    beside.block(5)
    assert sorted(beside.times) == sorted(paths)
    assert all(len(t) == 5 and min(t) > 0 for t in beside.times.values())
    # each reference's time agrees with a bare onnxruntime loop over the same file (a generous ratio band),
    # the fastest of each side: other work only adds time, and beside two busy loops on two cores a run is
    # now and then descheduled for a whole time slice (0.6 ms runs read 4.7-5.2 ms, three of five)
    for path, times in beside.times.items():
        bare = bare_ms(path)
        assert 0.2 <= min(times) / bare <= 5.0, (path, times, bare)


class Evicting:
    """A reference whose first call after another step's takes 20 ms (that step evicted it), then none."""

    def __init__(self) -> None:
        self.calls, self.cold = 0, True

    def __call__(self) -> None:
        self.calls += 1
        if self.cold:
            self.cold = False
            time.sleep(0.02)


def test_a_reference_is_timed_warm_not_as_the_model_left_the_caches() -> None:
    """The reference's time says how fast the device runs, not how much of the caches the model used: each
    timed call follows an untimed one."""
    from edgebench.agent.numerics import SpeedReferences

    reference = Evicting()
    beside = SpeedReferences({"gemm": reference})
    for _ in range(4):
        reference.cold = True  # the model ran
        beside()
    assert len(beside.times["gemm"]) == 4 and reference.calls == 8
    assert max(beside.times["gemm"]) < 10.0, beside.times


class Logged:
    """A step that notes each call in a shared log, keeping the step's own refresh."""

    def __init__(self, step: Any, log: list[str], name: str) -> None:
        self.step, self.log, self.name = step, log, name
        self.refresh = getattr(step, "refresh", None)

    def __call__(self) -> object:
        self.log.append(self.name)
        return self.step()


def test_the_references_never_run_between_the_models_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile's plain p50 is a back-to-back inference's: the references run in one block before and one
    after its rounds (between them, the 16 MiB GEMV evicted a 0.046 ms model's weights and it read 0.12
    ms). Checked exactly, on the order of the calls: every reference call comes before the model's first
    run or after its last; each reference is timed 2 x REFERENCE_ROUNDS times, however many rounds the
    model took."""
    pytest.importorskip("onnxruntime")
    from edgebench.agent import session_onnxruntime
    from edgebench.agent.numerics import REFERENCE_ROUNDS, SpeedReferences, run_profile
    from edgebench.models.builtin import builtin_model

    log: list[str] = []
    alternate = session_onnxruntime.alternate

    def logged_alternate(plain: Any, instrumented: Any, *args: Any) -> list[float]:
        return alternate(Logged(plain, log, "model"), Logged(instrumented, log, "model"), *args)

    def logged_references(self: SpeedReferences) -> None:
        self.steps = {path: Logged(step, log, "reference") for path, step in self.steps.items()}
        self.times = {path: [] for path in self.steps}

    monkeypatch.setattr(session_onnxruntime, "alternate", logged_alternate)
    init = SpeedReferences.__init__

    def logged_init(self: SpeedReferences, steps: dict[str, Any]) -> None:
        init(self, steps)
        logged_references(self)

    monkeypatch.setattr(SpeedReferences, "__init__", logged_init)
    refs = [str(sample_model(key)[1]) for key in SPEED_REFERENCES]
    task = {
        "kind": "profile",
        "model": str(builtin_model("tinymlp")),
        "threads": 1,
        "runs": 50,
        "warmup": 5,
        "min_seconds": 0.05,
        "profile_dir": str(tmp_path),
        "speed_references": refs,
    }
    result, _ = run_profile(task)
    assert all(len(result["speed_references_ms"][r]) == 2 * REFERENCE_ROUNDS for r in refs)
    assert result["runs"] == len(result["latencies_ms"]) >= 50
    first, last = log.index("model"), len(log) - 1 - log[::-1].index("model")
    assert "reference" not in log[first : last + 1], "a reference ran between the model's runs"
    # each reference is called twice a round (once untimed, once timed), before and after
    per_block = 2 * REFERENCE_ROUNDS * len(refs)
    assert log[:first] == ["reference"] * per_block and log[last + 1 :] == ["reference"] * per_block
    assert log.count("model") == 2 * (5 + result["runs"])  # warm-up and rounds, plain and instrumented


def test_a_profile_runs_until_its_rounds_have_lasted_min_seconds() -> None:
    """More rounds than `runs` until `min_seconds` have passed, never more than MAX_ROUNDS."""
    from edgebench.agent.timing import MAX_ROUNDS

    def step() -> None:
        time.sleep(0.002)

    start = time.perf_counter()
    latencies = _alternate(step, Counted(), warmup=0, runs=3, min_seconds=0.1)
    assert time.perf_counter() - start >= 0.1 and 3 < len(latencies) <= 0.1 / 0.002 + 1
    assert len(_alternate(Counted(), Counted(), warmup=0, runs=3, min_seconds=60.0)) == MAX_ROUNDS
    assert len(_alternate(Counted(), Counted(), warmup=0, runs=5)) == 5


def bare_ms(path: str, runs: int = 5) -> float:
    """The fastest run of a plain InferenceSession.run loop over the model, one thread, random inputs."""
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
    return min(times)


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
