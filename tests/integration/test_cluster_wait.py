"""The controller waits on many devices' tasks at once through one Dask client, on a real cluster.

Device threads share the client's gather: a wait that timed out in one thread used to cancel the
fetch under another, and distributed's sync() surfaced that as UnboundLocalError ("cannot access local
variable 'result'"), which failed a board's job in a resumed run. Here four device threads poll every
5 ms while tasks finish at random moments, the pattern that hit it hundreds of times in three seconds.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from edgebench.execution.cluster import ClusterExecutor, resource_name
from edgebench.execution.suite import RunPolicy

pytestmark = pytest.mark.integration

DEVICES = ("phone", "board", "local", "pi")
TASKS_PER_DEVICE = 120


def payload(seconds: float, size: int, tag: int) -> bytes:
    time.sleep(seconds)
    return tag.to_bytes(4, "little") * (size // 4)


def test_device_threads_waiting_at_once_each_get_their_own_result() -> None:
    distributed = pytest.importorskip("distributed")
    resources = {resource_name(d): 100 for d in DEVICES}
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None, resources=resources
    ) as cluster:
        ex = ClusterExecutor(cluster.scheduler_address, "run-wait", RunPolicy(), poll_s=0.005)
        failures: list[str] = []
        wrong: list[str] = []

        def device_thread(device: str, seed: int) -> None:
            rng = random.Random(seed)
            for i in range(TASKS_PER_DEVICE):
                tag = seed * 1000 + i
                future = ex.submit(payload, device, rng.uniform(0.0, 0.02), 1 << 20, tag)
                try:
                    got = ex.wait(future, device)
                except Exception as exc:  # noqa: BLE001 - every failure is the finding
                    failures.append(f"{device} task {i}: {type(exc).__name__}: {exc}")
                    continue
                if got[:4] != tag.to_bytes(4, "little") or len(got) != 1 << 20:
                    wrong.append(f"{device} task {i}")

        try:
            threads = [threading.Thread(target=device_thread, args=(d, n)) for n, d in enumerate(DEVICES)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not any(t.is_alive() for t in threads), "a device thread hung waiting on its task"
        finally:
            ex.close()
    assert not failures, f"{len(failures)} waits failed, first: {failures[:3]}"
    assert not wrong, f"results crossed between tasks: {wrong[:3]}"
