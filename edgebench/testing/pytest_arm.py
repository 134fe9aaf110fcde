"""Pytest fixtures for the aarch64 board (an arm64 Debian rootfs under qemu-user behind a real sshd, see
`edgebench.testing.arm_board`).

Enable them in a conftest.py with one line:

    from edgebench.testing.pytest_arm import arm_board, arm_lab_session  # noqa: F401

- `arm_board` (session scope): the started `ArmBoard`, used like `ssh_board` (`board.lab_dir` holds its
  descriptor, `board.write_descriptor(tmp_path, ...)` writes variants); its commands run on aarch64.
- `arm_lab_session` (session scope): the same board with how it was set up (`ArmLab`: qemu's version,
  whether the rootfs was built or unpacked from the cache, and the seconds each part took).

The first session on a machine builds the rootfs (about 5 minutes on 2 cores) and caches it; later
sessions unpack it in seconds. Where the machine cannot run it (not root, binfmt_misc cannot be mounted,
a host tool missing, no cache and no network to the Debian mirror) the fixtures skip the test saying
why, and fail it when CI is set: CI must run them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from .arm_board import ArmBoard, ArmLab, ArmLabUnavailable, Topology, arm_lab

__all__ = ["arm_board", "arm_lab_session", "require_arm_lab"]


def require_arm_lab(why: str) -> None:
    """Skip (or, under CI, fail) a test the arm lab cannot run here, saying why."""
    message = f"aarch64 board unavailable: {why}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def arm_lab_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArmLab]:
    """The aarch64 board and its set-up report; the board stopped, qemu unregistered afterwards."""
    stack = contextlib.ExitStack()
    try:
        lab = stack.enter_context(
            arm_lab(tmp_path_factory.mktemp("arm-board"), topology=Topology.little_big(os.cpu_count() or 1))
        )
    except ArmLabUnavailable as exc:
        stack.close()
        require_arm_lab(str(exc))
        raise  # not reached: require_arm_lab always raises
    with stack:
        yield lab


@pytest.fixture(scope="session")
def arm_board(arm_lab_session: ArmLab) -> ArmBoard:
    """A shared aarch64 board (qemu-user, real sshd) for non-destructive tests."""
    return arm_lab_session.board
