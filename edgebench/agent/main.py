"""Agent entry point: one task in (JSON in argv), one JSON document out on a clean channel.

`import MNN` and native runtimes print to fd 1 from C, so fd 1 is pointed at stderr for the whole
run and the JSON goes to a private duplicate of the original stdout.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from . import disturbance
from .protocol import PROTOCOL, ProtocolError, parse_task

# kind -> module in this package exposing run(task) -> (result dict, warnings list)
TASKS = {
    "info": "info",
    "bench": "bench",
    "outputs": "numerics",
    "profile": "numerics",
    "sensitivity": "numerics",
    "thermal": "sustained",
    "power": "sustained",
    "idle": "sustained",
    "sample": "sustained",
    "matmul": "matmul",
    "bandwidth": "bandwidth",
    "stream": "stream",
    "soak": "soak",
    "contention": "contention",
    "decode": "decode",
    "doctor": "doctor",
}


class TaskError(Exception):
    """A failure the agent explains: the host turns `type` into its own error class."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _open_json_channel() -> int:
    channel = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def _emit(channel: int, document: dict) -> None:
    data = (json.dumps(document, separators=(",", ":"), allow_nan=True) + "\n").encode()
    view = memoryview(data)
    while view:
        written = os.write(channel, view)
        view = view[written:]


def run_task(document: dict) -> dict:
    try:
        task = parse_task(document)
    except ProtocolError as exc:
        raise TaskError("usage", str(exc)) from None
    module = importlib.import_module(f"{__package__}.{TASKS[task.KIND]}")
    threads = disturbance.task_threads(task.to_dict())  # read before the task's module sees its dict
    start = disturbance.snapshot()
    result, warnings = module.run(task.to_dict())
    return {
        "ok": True,
        "protocol": PROTOCOL,
        "kind": task.KIND,
        "result": result,
        "warnings": warnings,
        "disturbance": disturbance.delta(start, disturbance.snapshot(), threads),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    channel = _open_json_channel()
    try:
        if len(argv) == 2 and argv[0] == "--task":
            task = json.loads(argv[1])
        elif len(argv) == 2 and argv[0] == "--task-file":
            with open(argv[1]) as fh:
                task = json.load(fh)
        else:
            raise TaskError("usage", "usage: agent --task JSON | --task-file PATH")
        document = run_task(task)
        code = 0
    except TaskError as exc:
        document = {"ok": False, "protocol": PROTOCOL, "error": {"type": exc.kind, "message": str(exc)}}
        code = 3
    except Exception as exc:  # noqa: BLE001 - everything becomes data for the host
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}"
        document = {"ok": False, "protocol": PROTOCOL, "error": {"type": "crash", "message": message}}
        code = 3
    _emit(channel, document)
    return code
