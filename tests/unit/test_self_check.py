"""The agent checks its own work: a runtime that reuses its input buffer (as MNN's session does for
activations) is an error naming the runtime, never a latency; the timing loop refreshes inputs before every
run, outside the timed region."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgebench.agent.bench import measure
from edgebench.agent.main import TaskError
from edgebench.agent.session import Step
from edgebench.agent.timing import TimingPolicy

FAST = TimingPolicy(warmup=3, warmup_seconds=0.0, runs=5, min_seconds=0.0)


class BufferStep(Step):
    """Runs y = 0.5 * x + 1 on its own input buffer and then leaves the result in it, like MNN's session.

    `honest` steps put the given inputs back in `refresh`; the defective one copied them in once.
    """

    def __init__(self, feeds: dict[str, np.ndarray], honest: bool) -> None:
        self.feeds, self.honest = feeds, honest
        self.buffer = np.array(feeds["x"], copy=True)
        self.out = np.zeros_like(self.buffer)
        self.refreshes = 0

    def __call__(self) -> None:
        np.multiply(self.buffer, 0.5, out=self.out)
        self.out += 1.0
        self.buffer[...] = self.out  # the input buffer reused for an activation

    def refresh(self) -> None:
        self.refreshes += 1
        if self.honest:
            self.buffer[...] = self.feeds["x"]

    def outputs(self) -> dict[str, Any]:
        return {"y": self.out.copy()}


class FakeSession:
    runtime = "fake"
    version = "0"

    def __init__(self, honest: bool) -> None:
        self.honest = honest
        self.steps: list[BufferStep] = []

    def prepare(self, feeds: dict[str, np.ndarray]) -> BufferStep:
        step = BufferStep(feeds, self.honest)
        self.steps.append(step)
        return step

    def outputs(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        step = self.prepare(feeds)
        step()
        return step.outputs()


def feeds() -> dict[str, np.ndarray]:
    return {"x": np.linspace(-3.0, 5.0, 64, dtype=np.float32)}


def test_a_session_reusing_its_input_buffer_is_an_error_naming_the_runtime() -> None:
    with pytest.raises(TaskError) as err:
        measure(FakeSession(honest=False), feeds(), FAST)
    assert err.value.kind == "measurement"
    message = str(err.value)
    assert message.startswith("fake:") and "output 'y'" in message and "not reported" in message


def test_an_honest_session_passes_and_is_refreshed_before_every_run() -> None:
    session = FakeSession(honest=True)
    result = measure(session, feeds(), FAST)
    timed = session.steps[0]
    # first inference + warm-up + samples, each preceded by a refresh
    assert timed.refreshes == 1 + result["warmup"] + len(result["latencies_ms"])
    assert "matches a fresh inference" in result["self_check"]


def test_a_runtime_writing_into_the_callers_inputs_is_caught() -> None:
    class Writer(FakeSession):
        def prepare(self, feeds: dict[str, np.ndarray]) -> BufferStep:
            step = super().prepare(feeds)
            step.buffer = feeds["x"]  # bound to the caller's array, which it then overwrites
            return step

    with pytest.raises(TaskError, match="changed the input 'x'"):
        measure(Writer(honest=False), feeds(), FAST)
