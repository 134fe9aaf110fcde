"""The agent protocol is typed and versioned: the agent refuses a task that does not match its declaration,
and the host refuses an agent that speaks another protocol, with one line saying which versions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgebench.agent.protocol import PROTOCOL, BenchTask, ProtocolError, parse_task
from edgebench.descriptors import builtin_local
from edgebench.errors import LabError
from edgebench.lab.device import Device
from edgebench.transports.base import CommandResult


def test_tasks_round_trip_through_json() -> None:
    task = BenchTask(model="m.onnx", threads=2, shapes={"x": [1, 4]}, runs=50, min_seconds=0.5)
    assert parse_task(json.loads(task.to_json())) == task


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"kind": "bench", "model": "m", "min_s": 1.0}, "unknown field 'min_s'"),
        ({"kind": "bench", "model": "m", "threads": "2"}, "field 'threads' has the wrong type"),
        ({"kind": "bench", "model": "m", "runs": True}, "field 'runs' has the wrong type"),
        ({"kind": "teleport"}, "unknown task kind 'teleport'"),
        (["bench"], "a task is a JSON object"),
    ],
)
def test_the_agent_refuses_a_task_that_does_not_match(document: Any, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        parse_task(document)


def test_the_agent_answers_a_bad_task_with_a_usage_error(tmp_path: Path) -> None:
    from edgebench.lab.agentpack import build_agent

    agent = build_agent(tmp_path)
    task = json.dumps({"kind": "bench", "model": "m.onnx", "runz": 5})
    res = subprocess.run(
        [sys.executable, str(agent), "--task", task], capture_output=True, text=True, timeout=60
    )
    document = json.loads(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 3 and document["protocol"] == PROTOCOL
    assert document["error"]["type"] == "usage" and "runz" in document["error"]["message"]


class AgentOfAnotherVersion:
    """A transport whose device answers every agent call as an agent of protocol 1 would."""

    device = "old-phone"

    def run(self, argv: list[str], *, timeout: float, env: dict[str, str] | None = None) -> CommandResult:
        if argv[0] == "sha256sum":
            return CommandResult(tuple(argv), 0, "", "", 0.0)
        if argv[:2] == ["mkdir", "-p"]:
            return CommandResult(tuple(argv), 0, "", "", 0.0)
        reply = {"ok": True, "protocol": 1, "kind": "info", "result": {}, "warnings": []}
        return CommandResult(tuple(argv), 0, json.dumps(reply) + "\n", "", 0.0)

    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        pass

    def pull(self, remote: str, local: Path, *, timeout: float) -> None:
        pass

    def read_text(self, remote: str, *, timeout: float) -> str:
        return ""

    def close(self) -> None:
        pass


def test_the_host_refuses_an_agent_of_another_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    device = Device(builtin_local(), transport=AgentOfAnotherVersion())  # type: ignore[arg-type]
    monkeypatch.setattr(device, "agent_path", lambda timeout: "/data/local/tmp/edgebench/agent.pyz")
    with pytest.raises(LabError) as info:
        device.fingerprint(timeout=5)
    message = str(info.value)
    assert "protocol 1" in message and f"speaks {PROTOCOL}" in message and "\n" not in message
