"""The agent protocol: the task the host sends and the document the agent prints, typed and versioned.

Standard library only: the agent runs on devices that have nothing else, and the host imports these same
definitions to build tasks and read replies, so both sides agree by construction. A task travels as JSON
(`Task.to_json`); the agent checks it against its dataclass (`parse_task`): an unknown kind, an unknown or
missing field, or a value of the wrong type is a usage error naming the field. The reply carries
`PROTOCOL`; the host refuses a reply of another version (a stale or foreign agent) with one line.

Versions:
  1 — tasks and replies as untyped JSON; timing knobs named warmup_runs, warmup_s, min_s, max_s.
  2 — typed tasks (unknown fields refused); the timing knobs named as everywhere else: warmup,
      warmup_seconds, runs, min_seconds, max_seconds.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

PROTOCOL = 2


class ProtocolError(ValueError):
    """A task that does not match its declaration."""


@dataclass(frozen=True)
class Task:
    """Base of every task. `KIND` is the value of the `kind` field on the wire."""

    KIND: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.KIND, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


# ---- model tasks ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelTask(Task):
    """What every task that runs a model carries."""

    model: str = ""
    runtime: str = "onnxruntime"
    threads: int = 0
    shapes: dict[str, list[int]] = field(default_factory=dict)
    seed: int = 0
    inputs: str | None = None
    affinity: list[int] | None = None
    # The backend the runtime runs the model on, as the runtime names it (cpu, vulkan, openvino, gpu...),
    # its precision mode (None: the backend's default, recorded as it ran; fp32; fp16) and whether a model
    # not wholly on that backend is an error (agent.placement)
    backend: str = "cpu"
    precision: str | None = None
    require_backend: bool = False


@dataclass(frozen=True)
class BenchTask(ModelTask):
    KIND = "bench"
    warmup: int = 1
    warmup_seconds: float = 0.5
    runs: int = 100
    min_seconds: float = 1.0
    max_seconds: float = 60.0
    values: dict[str, float] = field(default_factory=dict)  # inputs filled with one value (sr = 16000)
    cold_load: bool = False  # also load once with the model file evicted from the page cache


@dataclass(frozen=True)
class StreamTask(BenchTask):
    """A stateful model fed frame by frame: outputs named in `state` feed the inputs they map to."""

    KIND = "stream"
    state: dict[str, str] = field(default_factory=dict)  # output name -> input name
    frame_seconds: float = 0.032
    frames: int | None = None  # exactly this many timed frames (default: runs and min_seconds)
    check_frames: int = 16  # frames re-run with the state reset each frame, to show the state matters


@dataclass(frozen=True)
class SoakTask(ModelTask):
    """Inferences for `duration_s` (back to back, or at `rate_hz`), RSS and latency sampled over time."""

    KIND = "soak"
    duration_s: float = 60.0
    rate_hz: float = 0.0
    period_s: float = 1.0
    warmup: int = 1
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ContentionTask(BenchTask):
    """The model alone, the model beside `corunner_threads` busy co-runner processes, the co-runner alone."""

    KIND = "contention"
    corunner_threads: list[int] = field(default_factory=lambda: [1])
    corunner_seconds: float = 1.0  # how long the co-runner's own throughput is measured alone


@dataclass(frozen=True)
class OutputsTask(ModelTask):
    KIND = "outputs"
    out: str = ""
    inputs_out: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    per_op: bool = False  # save every tensor by the runtime's own means (an ncnn graph's blobs)


@dataclass(frozen=True)
class ProfileTask(ModelTask):
    KIND = "profile"
    runs: int = 20
    warmup: int = 3
    min_seconds: float = 0.0  # and more runs until the measured ones have lasted this long
    profile_dir: str = ""
    calibration_model: str | None = None
    speed_references: list[str] = field(default_factory=list)  # fixed models timed around the plain runs
    token: str = ""


@dataclass(frozen=True)
class SensitivityTask(ModelTask):
    KIND = "sensitivity"
    weights: str = ""
    layers: list[list[str]] = field(default_factory=list)  # [weight key, input name] per layer


@dataclass(frozen=True)
class SustainedTask(ModelTask):
    """A model run for `duration_s` (back to back, or at `rate_hz`) while the sensors are sampled."""

    duration_s: float = 60.0
    rate_hz: float = 0.0
    warmup: int = 1
    warmup_seconds: float = 0.5
    sensors: dict[str, Any] = field(default_factory=dict)
    dumpsys: bool = True


@dataclass(frozen=True)
class ThermalTask(SustainedTask):
    KIND = "thermal"


@dataclass(frozen=True)
class PowerTask(SustainedTask):
    KIND = "power"
    idle_s: float = 10.0
    idle_after_s: float = 10.0
    monitor: bool = False


@dataclass(frozen=True)
class DecodeTask(ModelTask):
    """An LLM decode loop: prefill `prompt_tokens`, then `new_tokens` greedy steps with the KV cache fed
    back; warm-up rounds by count and time, then rounds until `rounds` and `min_seconds`."""

    KIND = "decode"
    prompt_tokens: int = 128
    new_tokens: int = 64
    rounds: int = 3
    warmup: int = 1
    warmup_seconds: float = 0.5
    min_seconds: float = 0.0
    max_seconds: float = 600.0
    verify: bool = True


# ---- device tasks --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InfoTask(Task):
    KIND = "info"


@dataclass(frozen=True)
class IdleTask(Task):
    KIND = "idle"
    sensors: dict[str, Any] = field(default_factory=dict)
    margin_c: float = 2.0
    timeout_s: float = 600.0
    period_s: float = 1.0
    min_observe_s: float = 10.0
    idle_c: dict[str, float] | float | None = None


@dataclass(frozen=True)
class SampleTask(Task):
    KIND = "sample"
    sensors: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    dumpsys: bool = False


@dataclass(frozen=True)
class MatmulTask(Task):
    KIND = "matmul"
    backend: str = "numpy"
    dtypes: list[str] = field(default_factory=list)
    ops: list[str] | None = None
    threads: list[int] = field(default_factory=list)
    affinity: list[int] | None = None
    sizes: list[int] | None = None
    skinny: list[list[int]] | None = None
    skip_square: bool = False
    seed: int = 0
    budget_s: float = 600.0
    trials: int | None = None
    start: int | None = None
    min_top: int | None = None
    max_size: int | None = None
    warmup_seconds: float | None = None
    min_trial_seconds: float | None = None


@dataclass(frozen=True)
class BandwidthTask(Task):
    KIND = "bandwidth"
    kernels: list[str] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    affinity: list[int] | None = None
    trials: int = 10
    budget_s: float = 600.0
    llc_bytes: int | None = None
    array_bytes: int | None = None
    block_bytes: int | None = None
    triad_path: str = "auto"  # compiled, blas, numpy or the first the device has (agent/bandwidth.py)
    sweep: list[int] | None = None  # working-set sizes (bytes) of a memory-hierarchy sweep instead


@dataclass(frozen=True)
class DoctorTask(Task):
    """The harness against bare loops on the device (agent/doctor.py)."""

    KIND = "doctor"
    models: dict[str, str] = field(default_factory=dict)  # runtime -> model path on the device
    shapes: dict[str, list[int]] = field(default_factory=dict)
    threads: int = 1
    affinity: list[int] | None = None
    rounds: int = 5
    runs: int = 50
    warmup_seconds: float = 0.2
    matmul_n: int = 512
    bandwidth_bytes: int = 64 * 2**20
    sensors: dict[str, Any] = field(default_factory=dict)


TASKS: dict[str, type[Task]] = {
    t.KIND: t
    for t in (
        InfoTask, BenchTask, OutputsTask, ProfileTask, SensitivityTask, ThermalTask, PowerTask, IdleTask,
        SampleTask, MatmulTask, BandwidthTask, StreamTask, SoakTask, ContentionTask, DecodeTask,
        DoctorTask,
    )
}  # fmt: skip


def parse_task(document: Any) -> Task:
    """The typed task a JSON document describes; anything off is a ProtocolError naming the field."""
    if not isinstance(document, dict):
        raise ProtocolError("a task is a JSON object")
    kind = document.get("kind")
    cls = TASKS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown task kind {kind!r} (known: {', '.join(sorted(TASKS))})")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in document.items() if k != "kind"}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ProtocolError(f"task {kind}: unknown field '{unknown[0]}' (protocol {PROTOCOL})")
    for name, value in values.items():
        if not _matches(value, hints[name]):
            raise ProtocolError(f"task {kind}: field '{name}' has the wrong type ({type(value).__name__})")
    return cls(**values)


def _matches(value: Any, hint: Any) -> bool:
    """A shallow runtime check of a JSON value against a field's annotation."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, hint)
