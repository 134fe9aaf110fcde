"""The controller's Dask client loop: orphaned gather waits end quietly, real errors still reach the log."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from distributed.client import AllExit

from edgebench.execution.cluster import quiet_orphaned_gather_waits


def orphan_a_task_that_raises(exc: Exception) -> None:
    """A task ends in `exc` and is dropped unread, as distributed's gather drops its per-key waits."""

    async def fail() -> None:
        raise exc

    async def main() -> None:
        task = asyncio.ensure_future(fail())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert task.done()
        del task
        gc.collect()  # the unread exception is reported when the task is collected

    loop = asyncio.new_event_loop()
    try:
        quiet_orphaned_gather_waits(loop)
        loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("exc", "logged"),
    [(AllExit(), False), (ValueError("a real failure"), True)],
    ids=["gather-wait", "real-error"],
)
def test_only_orphaned_gather_waits_are_quiet(
    exc: Exception, logged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        orphan_a_task_that_raises(exc)
    never_retrieved = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert bool(never_retrieved) is logged


def test_a_handler_the_loop_had_still_gets_the_rest() -> None:
    seen: list[object] = []
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(lambda _loop, context: seen.append(context.get("exception")))
        quiet_orphaned_gather_waits(loop)
        error = ValueError("x")
        loop.call_exception_handler({"message": "m", "exception": AllExit()})
        loop.call_exception_handler({"message": "m", "exception": error})
    finally:
        loop.close()
    assert seen == [error]


class FakeExecutor:
    """The controller's view of the cluster, faked: every submit answers the next reply in turn."""

    def __init__(self, replies: list[dict]) -> None:
        self.replies = list(replies)
        self.submitted = 0

    def await_holder(self, device: str) -> None:
        return None

    def holders(self, device: str) -> list[str]:
        return ["w1", "w2"]

    def submit(self, fn, device, *args, workers=None):  # type: ignore[no-untyped-def]
        self.submitted += 1
        return None

    def wait(self, future, device, workers):  # type: ignore[no-untyped-def]
        return self.replies.pop(0)


def test_a_worker_lost_while_its_files_ship_is_a_lost_task_not_a_failed_job() -> None:
    """A worker that asked for files and went away before they reached it (the scatter's stream closed)
    is a lost task: the job goes to a worker still there, as after any lost worker; only when that keeps
    happening does the job fail, as lost."""
    from distributed.comm.core import CommClosedError

    from edgebench.execution.cluster import MAX_LOSSES, ClusterSession, TaskLost

    need = {"status": "need", "worker": "w1", "missing": ["m.onnx"]}
    ok = {"status": "ok", "worker": "w2"}
    lost: list[int] = []

    def ship(reply: dict) -> None:
        raise CommClosedError("in <TCP (closed) ConnectionPool.scatter>: Stream is closed")

    def task():  # type: ignore[no-untyped-def]
        return (lambda: None), (), None

    executor = FakeExecutor([need, ok])
    session = ClusterSession(executor, "local")  # type: ignore[arg-type]
    assert session._until_done(task, lambda s, d: None, ship, lambda: lost.append(1)) == ok
    assert lost == [1] and executor.submitted == 2

    executor = FakeExecutor([need] * (MAX_LOSSES + 1))
    session = ClusterSession(executor, "local")  # type: ignore[arg-type]
    with pytest.raises(TaskLost, match="files could not reach a worker"):
        session._until_done(task, lambda s, d: None, ship, lambda: None)
