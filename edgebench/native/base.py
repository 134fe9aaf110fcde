"""What every runner adapter shares: options in, argv out, output parsed into a NativeResult."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol


class NativeToolError(Exception):
    """The tool ran and said it failed (model would not load, delegate could not be applied)."""

    def __init__(self, tool: str, message: str, kind: str = "model") -> None:
        super().__init__(f"{tool}: {message}")
        self.tool = tool
        self.kind = kind


@dataclass(frozen=True)
class NativeOptions:
    """edgebench's bench options, as far as a native tool can honour them."""

    threads: int = 0
    warmup: int = 1
    runs: int = 50
    min_seconds: float = 1.0
    max_seconds: float = 150.0
    delegate: str | None = (
        None  # tflite: xnnpack|nnapi|gpu|hexagon; ort: an execution provider (cpu, nnapi, qnn, ...)
    )
    precision: str | None = None  # fp32 | fp16 | low; None is fp32 (every tool is told so explicitly)
    profile: bool = False
    warmup_seconds: float = 0.5
    seed: int = 0  # of the tool's generated inputs, where it takes one
    model_name: str | None = None  # the file name a folder-taking tool prints on its result line
    profile_path: str | None = None  # where the tool writes its profile on the device (perf_test -p)
    require_backend: bool = False  # a run only partly on the asked delegate / EP / backend is an error
    input_types: tuple[tuple[str, str], ...] = ()  # (name, ONNX element type) of each input, read on the host
    # (name, dims) of each input as the model file declares it, read on the host, in the file's own axis
    # order (ncnn: w, h, [d,] c): for a tool that must be told every input's shape (benchncnn)
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass
class NativeResult:
    """One invocation's parsed output. `aggregates` are the tool's own statistics, in ms."""

    aggregates: dict[str, float] = field(default_factory=dict)
    count: int | None = None
    load_ms: float | None = None
    first_ms: float | None = None
    peak_memory_mb: float | None = None
    ops: list[tuple[str, str, float]] = field(default_factory=list)  # (node, op_type, avg ms)
    path: str = "cpu"  # which execution path ran (delegate / EP / backend), as the tool reports it
    applied: dict[str, Any] = field(default_factory=dict)  # identity of what ran: delegate, precision...
    notes: dict[str, Any] = field(default_factory=dict)  # descriptive: what was asked, coverage, method
    memory_growth_mb: float | None = None  # start-to-end footprint growth (not a peak)
    started_s: float | None = None  # device clock at the invocation's start, when stamped
    ended_s: float | None = None  # device clock at its end, when stamped on both sides
    warnings: list[str] = field(default_factory=list)
    warmup_count: int | None = None  # inferences the tool ran before the timed ones, by its own count
    resolution_ms: float | None = None  # the smallest step the tool prints a latency in
    unresolved: bool = False  # the printed latency is too few steps of resolution_ms to be a measurement

    @property
    def inferences(self) -> int | None:
        """Every inference the invocation ran (warm-up and timed), by the tool's own counts, or None."""
        if self.count is None or self.warmup_count is None:
            return None
        return self.count + self.warmup_count


class RunnerAdapter(Protocol):
    name: str
    runtime: str
    model_suffix: str
    needs_model_dir: bool
    profile_to_file: bool  # `profile` makes the tool write a file the host pulls (else it prints it, or none)

    def argv(self, binary: str, model: str, opts: NativeOptions) -> list[str]: ...

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult: ...


def number(pattern: str, text: str, flags: int = 0) -> float | None:
    """The first number captured by `pattern` in `text`, or None."""
    match = re.search(pattern, text, flags)
    return float(match.group(1)) if match else None


def first_error_line(text: str, markers: tuple[str, ...]) -> str | None:
    """The first line of `text` holding one of `markers`, stripped, or None."""
    for line in text.splitlines():
        stripped = line.strip()
        if any(m in stripped for m in markers):
            return stripped
    return None


def crash_reason(returncode: int) -> str | None:
    """A tool killed by a signal: the shell reports 128+N (139 = SIGSEGV), Python's subprocess -N."""
    names = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV"}
    signal = returncode - 128 if returncode > 128 else -returncode if returncode < 0 else 0
    return names.get(signal, f"signal {signal}") if signal else None


def killed_from_outside(returncode: int) -> str | None:
    """A tool SIGKILLed: no tool sends itself that, and a bad file does not cause it; something on the
    device did (a low-memory killer, a watchdog, the shell going away). None for any other ending."""
    if crash_reason(returncode) != "SIGKILL":
        return None
    return (
        f"killed (SIGKILL, exit {returncode}) from outside the tool: by the device (a low-memory killer, "
        "a watchdog, its shell going away), not by the model; run it again and look at the device's log"
    )


KILLED = "killed"  # NativeToolError kind: the device ended the tool; a measurement failure, not the model's


def failure_kind(returncode: int, otherwise: str) -> str:
    """KILLED for a tool SIGKILLed from outside, else the kind the tool's own output gave."""
    return KILLED if killed_from_outside(returncode) else otherwise
