"""Task `contention`: the model's latency alone and beside a busy co-runner, and the co-runner's throughput
alone and beside the model.

The co-runner is N processes of this interpreter, each a pure-Python busy loop that reports its iteration
count with a monotonic time stamp every ~20 ms on a pipe (standard library only: it runs on any device that
runs the agent). For each N: the co-runners start, run alone for `corunner_seconds` (their throughput
alone), then the model is timed beside them (its latency, and their throughput in that same span); they are
stopped in `finally`, killed if they do not stop, and each one exits by itself if the agent dies.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from typing import Any

from .bench import pin
from .loading import model_inputs, open_timed
from .main import TaskError
from .timing import TimingPolicy, sample, time_once, warm_up

MARK = "edgebench-corunner"  # in every co-runner's argv, so a survivor can be found by name
CORUNNER = """
import os, sys, time
parent, n, last = os.getppid(), 0, time.monotonic()
while True:
    for _ in range(20000):
        n += 1
    now = time.monotonic()
    if now - last >= 0.02:
        sys.stdout.write(f"{now} {n}\\n")
        sys.stdout.flush()
        last = now
        if os.getppid() != parent:  # the agent died: do not outlive it
            break
"""


class CoRunner:
    """N busy processes and their (time, count) reports."""

    def __init__(self, count: int, token: str) -> None:
        self.count, self.token = count, token
        self.procs: list[subprocess.Popen[str]] = []
        self.reports: list[list[tuple[float, int]]] = []
        self.readers: list[threading.Thread] = []

    def start(self) -> CoRunner:
        for _ in range(self.count):
            proc = subprocess.Popen(
                [sys.executable, "-c", CORUNNER, MARK, self.token],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
            log: list[tuple[float, int]] = []
            reader = threading.Thread(target=_read, args=(proc, log), daemon=True)
            reader.start()
            self.procs.append(proc)
            self.reports.append(log)
            self.readers.append(reader)
        self._wait_running()
        return self

    def _wait_running(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while any(len(log) < 2 for log in self.reports):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise TaskError("crash", f"the co-runner did not start ({sys.executable})")
            time.sleep(0.01)

    def rate(self, start: float, end: float) -> float:
        """Iterations per second of all processes together between two monotonic times."""
        total = 0.0
        for log in self.reports:
            inside = [(t, n) for t, n in list(log) if start <= t <= end]
            if len(inside) < 2:
                raise TaskError("crash", "the co-runner reported too rarely to measure its throughput")
            (t0, n0), (t1, n1) = inside[0], inside[-1]
            total += (n1 - n0) / (t1 - t0)
        return total

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            if proc.stdout:
                proc.stdout.close()


def _read(proc: subprocess.Popen[str], log: list[tuple[float, int]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        t, _, n = line.partition(" ")
        try:
            log.append((float(t), int(n)))
        except ValueError:
            continue


def beside(step: Any, policy: TimingPolicy, count: int, alone_s: float, token: str) -> dict[str, Any]:
    """One co-runner size: its throughput alone, then the model timed beside it."""
    runner = CoRunner(count, token)
    try:
        runner.start()
        t0 = time.monotonic()
        time.sleep(alone_s)
        alone = runner.rate(t0, time.monotonic())
        t1 = time.monotonic()
        latencies, cut_short = sample(step, policy)
        t2 = time.monotonic()
        time.sleep(0.05)  # one more report lands after the model's span ends
        together = runner.rate(t1, t2)
    finally:
        runner.stop()
    return {
        "corunner_threads": count,
        "corunner_rate_alone": alone,
        "corunner_rate_beside": together,
        "latencies_ms": latencies,
        "cut_short": cut_short,
    }


def run(task: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    affinity = pin(task.get("affinity"))
    session, cost = open_timed(task)
    feeds = model_inputs(task, session, warnings)
    step = session.prepare(feeds)
    policy = TimingPolicy(
        **{
            k: task[k]
            for k in ("warmup", "warmup_seconds", "runs", "min_seconds", "max_seconds")
            if k in task
        }
    )
    token = secrets.token_hex(4)
    try:
        first_ms = time_once(step)
        warm_up(step, policy)
        alone, cut_alone = sample(step, policy)
        phases = [
            beside(step, policy, int(n), float(task.get("corunner_seconds", 1.0)), token)
            for n in task.get("corunner_threads") or [1]
        ]
        # alone again after the co-run phases: drifting machine load then weighs on both sides alike
        after, cut_after = sample(step, policy)
    except TaskError:
        raise
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"inference failed: {str(exc).strip().splitlines()[0]}") from None
    if cut_alone or cut_after or any(p["cut_short"] for p in phases):
        warnings.append(f"a phase stopped at max_seconds={policy.max_seconds:g} before {policy.runs} runs")
    return {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "threads": int(task.get("threads", 0)),
        "affinity": affinity,
        "cpus": os.cpu_count(),
        **cost,
        "first_inference_ms": first_ms,
        "latencies_alone_ms": alone,
        "latencies_alone_after_ms": after,
        "phases": phases,
        "token": token,
    }, warnings
