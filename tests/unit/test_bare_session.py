"""Bare reference loops run where the agent runs: in a session of their own (edgebench.testing.bare)."""

from __future__ import annotations

import os

from edgebench.testing.bare import OwnSession


def test_the_bare_side_runs_in_a_session_of_its_own_and_keeps_its_process() -> None:
    with OwnSession() as session:
        first, again = session.call(os.getpid), session.call(os.getpid)
        assert session.call(os.getsid, 0) == first != os.getsid(0)
    assert first == again != os.getpid()  # one process for every call: the runtime is imported once
