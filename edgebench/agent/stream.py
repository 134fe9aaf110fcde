"""Task `stream`: a stateful model fed frame by frame, each call's named outputs feeding the next call.

Every frame is one `session.outputs(feeds)`: the inputs copied in, one inference, the outputs copied out
(the state must come out to go back in), which is what a streaming application pays per frame. The state
inputs start at zeros (or at the arrays of the task's .npz); the other inputs are the task's inputs.
Warm-up frames carry the state too; the state is reset to its start before the timed frames. An array of
the .npz with one more leading axis than its input declares is a sequence of frames (a recording): frame i
gets its entry i (modulo its length), set before the frame's timer starts.

After the timed frames the first `check_frames` are run again with the state reset before each one: if the
non-state outputs do not change, the pairing has no effect (a wrong pairing, or a stateless model) and a
warning says so. The outputs of the first frames are returned, so the host can check them against a run of
its own.
"""

from __future__ import annotations

import time
from typing import Any

from .bench import pin
from .loading import model_inputs, open_timed
from .main import TaskError
from .timing import TimingPolicy, peak_rss_mb

HEAD_FRAMES = 32  # frames whose small outputs are returned
HEAD_MAX_VALUES = 16  # outputs larger than this are not returned


def check_pairs(session: Any, state: dict[str, str]) -> None:
    """Every pairing names an output and an input of the model."""
    inputs = [i.name for i in session.inputs]
    for out, inp in state.items():
        if out not in session.output_names:
            raise TaskError(
                "input",
                f"--state {out}={inp}: the model has no output '{out}' (outputs: "
                f"{', '.join(session.output_names)})",
            )
        if inp not in inputs:
            raise TaskError(
                "input", f"--state {out}={inp}: the model has no input '{inp}' (inputs: {', '.join(inputs)})"
            )


def initial_state(task: dict, feeds: dict[str, Any], state: dict[str, str]) -> dict[str, Any]:
    """Zeros shaped as the state inputs, unless the task's .npz gives them."""
    import numpy as np

    if task.get("inputs"):
        return {inp: feeds[inp] for inp in state.values()}
    return {inp: np.zeros_like(feeds[inp]) for inp in state.values()}


def split_sequences(session: Any, feeds: dict[str, Any], state: dict[str, str]) -> dict[str, Any]:
    """Inputs given as a sequence of frames (one more leading axis than declared), taken out of `feeds`."""
    ranks = {i.name: len(i.shape) for i in session.inputs}
    sequences = {}
    for name, array in list(feeds.items()):
        if name not in state.values() and array.ndim == ranks[name] + 1 and array.shape[0] > 0:
            sequences[name] = array
            feeds[name] = array[0]
    return sequences


class Stream:
    """Frames through one session, the state carried from each call to the next."""

    def __init__(
        self,
        session: Any,
        feeds: dict[str, Any],
        state: dict[str, str],
        start: dict[str, Any],
        sequences: dict[str, Any] | None = None,
    ):
        self.session, self.state, self.start = session, state, start
        self.feeds = {**feeds, **start}
        self.sequences = sequences or {}
        self.index = 0
        self.checked = False

    def reset(self) -> None:
        self.feeds.update(self.start)
        self.index = 0

    def frame(self) -> tuple[float, dict[str, Any]]:
        """One timed frame; its outputs' state goes into the next frame's inputs."""
        for name, frames in self.sequences.items():
            self.feeds[name] = frames[self.index % len(frames)]
        self.index += 1
        clock = time.perf_counter_ns
        t0 = clock()
        outputs = self.session.outputs(self.feeds)
        elapsed = (clock() - t0) / 1e6
        if not self.checked:
            self._check_shapes(outputs)
        for out, inp in self.state.items():
            self.feeds[inp] = outputs[out].astype(self.start[inp].dtype, copy=False)
        return elapsed, outputs

    def _check_shapes(self, outputs: dict[str, Any]) -> None:
        for name, value in outputs.items():
            if value.size == 0:
                raise TaskError(
                    "model",
                    f"the runtime produced an empty output '{name}': it could not run the model on these "
                    "inputs (see its messages on stderr)",
                )
        for out, inp in self.state.items():
            got, want = tuple(outputs[out].shape), tuple(self.start[inp].shape)
            if got != want:
                raise TaskError(
                    "input",
                    f"--state {out}={inp}: output '{out}' has shape {list(got)} but input '{inp}' takes "
                    f"{list(want)} (set --shape {inp}=... to match)",
                )
        self.checked = True


def small_outputs(outputs: dict[str, Any], state: dict[str, str]) -> dict[str, list[float]]:
    """The non-state outputs small enough to return, flattened."""
    return {
        name: [float(v) for v in value.ravel()]
        for name, value in outputs.items()
        if name not in state and value.size <= HEAD_MAX_VALUES and value.dtype.kind in "fiub"
    }


def frame_count_reached(n: int, elapsed_s: float, policy: TimingPolicy, frames: int | None) -> bool:
    if frames is not None:
        return n >= frames
    return n >= policy.runs and elapsed_s >= policy.min_seconds


def run_frames(stream: Stream, policy: TimingPolicy, frames: int | None) -> tuple[list[float], list, bool]:
    """Timed frames from the start state: (latencies ms, small outputs of the first frames, cut short)."""
    stream.reset()
    latencies: list[float] = []
    head: list[dict[str, list[float]]] = []
    start = time.perf_counter()
    while True:
        ms, outputs = stream.frame()
        latencies.append(ms)
        if len(head) < HEAD_FRAMES:
            head.append(small_outputs(outputs, stream.state))
        elapsed = time.perf_counter() - start
        if frame_count_reached(len(latencies), elapsed, policy, frames):
            return latencies, head, False
        if elapsed >= policy.max_seconds:
            return latencies, head, True


def warm_up(stream: Stream, policy: TimingPolicy) -> tuple[int, float, float]:
    """Warm-up frames (state carried): (frames, seconds, the first frame's ms)."""
    start = time.perf_counter()
    first_ms, calls = stream.frame()[0], 1
    while calls < policy.warmup or time.perf_counter() - start < policy.warmup_seconds:
        stream.frame()
        calls += 1
        if time.perf_counter() - start > policy.max_seconds:
            break
    return calls, time.perf_counter() - start, first_ms


def state_effect(stream: Stream, head: list[dict[str, list[float]]], frames: int) -> float | None:
    """Largest change of a small output between the carried run and a run reset before every frame."""
    frames = min(frames, len(head))
    if frames < 2 or not head[0]:
        return None
    worst = 0.0
    for i in range(frames):
        stream.reset()
        stream.index = i
        reset = small_outputs(stream.frame()[1], stream.state)
        for name, values in head[i].items():
            worst = max(worst, max(abs(a - b) for a, b in zip(values, reset[name], strict=True)))
    return worst


def run(task: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    affinity = pin(task.get("affinity"))
    session, cost = open_timed(task)
    feeds = model_inputs(task, session, warnings)
    state = dict(task.get("state") or {})
    check_pairs(session, state)
    sequences = split_sequences(session, feeds, state)
    stream = Stream(session, feeds, state, initial_state(task, feeds, state), sequences)
    policy = TimingPolicy(
        **{
            k: task[k]
            for k in ("warmup", "warmup_seconds", "runs", "min_seconds", "max_seconds")
            if k in task
        }
    )
    try:
        warm_calls, warm_s, first_ms = warm_up(stream, policy)
        latencies, head, cut_short = run_frames(stream, policy, task.get("frames"))
        effect = state_effect(stream, head, int(task.get("check_frames", 16)))
    except TaskError:
        raise
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"inference failed: {str(exc).strip().splitlines()[0]}") from None
    if cut_short:
        warnings.append(f"stopped at max_seconds={policy.max_seconds:g} after {len(latencies)} frames")
    if state and effect == 0.0:
        warnings.append(
            "the outputs are the same with the state reset every frame: the --state pairing has no effect"
        )
    return {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "threads": int(task.get("threads", 0)),
        "affinity": affinity,
        **cost,
        "first_inference_ms": first_ms,
        "warmup": warm_calls,
        "warmup_seconds": warm_s,
        "frame_seconds": float(task["frame_seconds"]),
        "frame_latencies_ms": latencies,
        "state": state,
        "state_shapes": {inp: list(stream.start[inp].shape) for inp in state.values()},
        "outputs_head": head,
        "state_effect_max_abs": effect,
        "peak_rss_mb": peak_rss_mb(),
        "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()},
        "sequences": {k: len(v) for k, v in sequences.items()},
    }, warnings
