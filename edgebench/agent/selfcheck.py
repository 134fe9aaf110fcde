"""The agent checks its own work: after the timed runs, the outputs of the last timed inference must equal
those of a fresh inference on the same inputs, and the inputs must be what they were.

A runtime that reuses its input buffer (MNN's session does, for activations) and a harness that copied the
inputs in only once time inferences on leftover data; their latency is not the model's. Such a run is an
error naming the runtime (a measured failure), never a latency.
"""

from __future__ import annotations

from typing import Any

from .main import TaskError

# Same inputs, same kernels: runtimes give the same bits run after run. The tolerance only absorbs a
# reduction order that changes with thread scheduling; leftover-input runs miss it by orders of magnitude.
RELATIVE_TOLERANCE = 1e-3


def pristine_copy(feeds: dict[str, Any]) -> dict[str, Any]:
    """Copies of the inputs, taken before any run: what every run should have computed on."""
    import numpy as np

    return {name: np.array(array, copy=True) for name, array in feeds.items()}


def check_outputs(
    runtime: str, session: Any, step: Any, feeds: dict[str, Any], pristine: dict[str, Any]
) -> str:
    """The last timed run (`step.outputs()`) against a fresh inference on `pristine`; raise on a mismatch.

    Returns the one-line verdict the records carry.
    """
    last = step.outputs()
    changed = _changed_inputs(feeds, pristine)
    if changed:
        raise TaskError(
            "measurement",
            f"{runtime}: the timed runs changed the input '{changed}' the harness gave it: "
            "the runtime wrote into its inputs, so the runs after the first did not compute on them",
        )
    try:
        fresh = session.outputs(pristine)
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"{runtime}: the check inference failed: {_first_line(exc)}") from None
    worst = 0.0
    for name, want in fresh.items():
        got = last.get(name)
        diff, scale = _difference(got, want)
        if diff > RELATIVE_TOLERANCE * scale:
            raise TaskError(
                "measurement",
                f"{runtime}: the last timed inference's output '{name}' differs from a fresh inference on "
                f"the same inputs (max abs difference {diff:.3g}, output scale {scale:.3g}): the timed runs "
                "did not compute on the given inputs, so their latency is not reported",
            )
        worst = max(worst, diff)
    return (
        f"the last timed run matches a fresh inference on the same inputs "
        f"({len(fresh)} output{'s' if len(fresh) != 1 else ''}, max abs difference {worst:.3g})"
    )


def _changed_inputs(feeds: dict[str, Any], pristine: dict[str, Any]) -> str | None:
    import numpy as np

    for name, array in pristine.items():
        if not np.array_equal(np.asarray(feeds[name]), array, equal_nan=array.dtype.kind == "f"):
            return name
    return None


def _difference(got: Any, want: Any) -> tuple[float, float]:
    """(max abs difference, scale of the reference); a missing or reshaped output is infinitely off."""
    import numpy as np

    want = np.asarray(want)
    if got is None or np.shape(got) != want.shape:
        return float("inf"), 1.0
    a, b = np.asarray(got, dtype=np.float64).ravel(), want.astype(np.float64).ravel()
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return float("inf"), 1.0
    a, b = a[~np.isnan(b)], b[~np.isnan(b)]
    if not np.array_equal(np.where(np.isinf(a), a, 0.0), np.where(np.isinf(b), b, 0.0)):
        return float("inf"), 1.0
    finite = np.isfinite(b)
    if not finite.any():
        return 0.0, 1.0
    diff = float(np.max(np.abs(a[finite] - b[finite])))
    scale = float(np.max(np.abs(b[finite])))
    return diff, max(scale, 1e-12)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
