"""Jobs (device x model x probe x params) and their outcomes: the unit a run stores and resumes; and the
ModelRef a job names. Vocabulary every layer shares, so it sits beside the records."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records import Record, Samples


@dataclass(frozen=True)
class ModelRef:
    """A model as the harness knows it: its identity in the store and the file that holds it."""

    name: str
    path: Path

    @property
    def format(self) -> str:
        return {".mnn": "mnn", ".tflite": "tflite", ".param": "ncnn", ".gguf": "gguf"}.get(
            self.path.suffix.lower(), "onnx"
        )

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file the model is: its path, and an ncnn graph's weights beside it."""
        return (self.path, ncnn_weights_of(self.path)) if self.format == "ncnn" else (self.path,)


def ncnn_weights_of(param: Path) -> Path:
    """The weights file of an ncnn graph: `net.param` -> `net.bin` (`net.ncnn.param` -> `net.ncnn.bin`)."""
    return param.with_suffix(".bin")


@dataclass(frozen=True)
class Job:
    """One measurement to make on one device."""

    device: str
    probe: str
    model: ModelRef | None = None
    runtime: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    # What stands for a file in the job's identity, by role ("model", or a path param's name): "sha256:<hex>"
    # of its content, or "path:<suite-relative path>" when it is missing. Set by the planner, so the key
    # follows what is measured, not where the checkout lives, and a changed model is a new job. Entries that
    # name no param and are not "model" tell apart jobs that are otherwise the same (a `gate --confirm`
    # run measures one model several times: "confirm" = "baseline/3").
    identity: dict[str, str] = field(default_factory=dict)
    # Which of the configuration's independent invocations this job is (1..repeats; 0: not repeated). Each
    # is its own job (a fresh agent process), so the gate can judge on invocation-level statistics.
    invocation: int = 0

    @property
    def key(self) -> str:
        """Stable across processes and checkouts: a resumed run recognises the jobs it already finished."""
        ident: dict[str, Any] = {
            "device": self.device,
            "probe": self.probe,
            "model": self.model.name if self.model else None,
            "runtime": self.runtime,
            "params": {k: self.identity.get(k, v) for k, v in self.params.items()},
        }
        if "model" in self.identity:
            ident["model_content"] = self.identity["model"]
        if self.invocation:
            ident["invocation"] = self.invocation
        extra = {k: v for k, v in self.identity.items() if k != "model" and k not in self.params}
        if extra:  # only such jobs: every other job keeps the key it always had
            ident["distinct"] = extra
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return f"{self.device}/{self.probe}/{self.model.name if self.model else '-'}/{digest}"


@dataclass
class JobOutcome:
    """What one job produced: records and samples when ok, an error message when not."""

    job: Job
    status: str  # "ok" | "error"
    records: list[Record] = field(default_factory=list)
    samples: list[Samples] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None
    started: str = ""
    finished: str = ""
    wall_s: float = 0.0
    device_s: float = 0.0  # time the agent itself measured, to compute orchestration overhead
    # Set when the device must not be used again in this run (its lease was lost, it stopped answering):
    # why. The fleet runner then ends the device's series at once instead of failing job after job.
    stop_device: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def error_dict(self) -> dict[str, Any]:
        j = self.job
        return {
            "device": j.device,
            "probe": j.probe,
            "model": j.model.name if j.model else None,
            "runtime": j.runtime,
            "params": j.params,
            "job": j.key,
            "kind": self.error_kind,
            "error": self.error,
        }
