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
