"""What every runtime's session shares: the `Step` contract (see agent.runtimes), the declared inputs,
the errors a session raises, and how many threads it started."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from .placement import Placement


class ModelLoadError(Exception):
    """The runtime refused the model (corrupt file, unsupported op)."""


class RuntimeMissing(Exception):
    """The runtime is not installed on this device."""


class BackendError(Exception):
    """The runtime has no such backend, or cannot open it with the precision asked for."""


def thread_count() -> int | None:
    """Threads of this process now (Linux /proc), to see how many a runtime started."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def effective_threads(asked: int, before: int | None, after: int | None) -> int | None:
    """The intra-op threads a session runs with: the threads it started plus the caller's own.

    Only needed when `asked` is 0 (the runtime's default); None when the platform cannot tell.
    """
    if asked > 0:
        return asked
    if before is None or after is None:
        return None
    return max(1, after - before + 1)


class Step:
    """One prepared inference on fixed inputs; see the module docstring for the contract."""

    def __call__(self) -> Any:
        raise NotImplementedError

    def refresh(self) -> None:
        """Make the runtime's input buffers hold the given inputs again (no-op where they cannot change)."""

    def outputs(self) -> dict[str, Any]:
        """Copies of the outputs of the last run, by output name."""
        raise NotImplementedError


# An input's shape when the model does not declare even its rank (an ncnn Input layer without w/h/c):
# its shape must be given (--shape).
ANY_RANK: list = ["..."]


@dataclass
class InputInfo:
    name: str
    shape: list  # ints, or str/None for dynamic dimensions
    dtype: str  # numpy dtype name
    # False where the runtime holds no batch axis (ncnn): a shape given with a leading batch of 1 (as the
    # ONNX model it came from declares it) is the same tensor
    batch_axis: bool = True
    # The model was made for its declared shape alone (an ncnn graph pnnx converted at it): another is
    # refused, not run on weights laid out for this one
    fixed: bool = False
    # What the layers reading it take of it, from their weights, where the model declares no shape (an
    # ncnn graph): (axis, size, layer) with axis "channels" (a convolution's input channels) or
    # "features" (an inner product's inputs); a given shape that contradicts one is refused
    demands: tuple[tuple[str, int, str], ...] = ()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "unknown"


class Session(Protocol):
    """What the agent needs of an open model in any runtime: its declared inputs and outputs, a prepared
    step on fixed inputs, the outputs of one inference, the runtime's version."""

    version: str
    inputs: list[InputInfo]
    output_names: list[str]

    def prepare(self, feeds: dict[str, Any]) -> Step: ...

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]: ...

    def placement(self) -> Placement: ...
