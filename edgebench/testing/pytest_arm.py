"""Pytest fixtures for the aarch64 board (an arm64 Debian rootfs under qemu-user behind a real sshd, see
`edgebench.testing.arm_board`) and the aarch64 phone (`edgebench.testing.arm_phone`).

Enable them in a conftest.py with one line (the fixtures depend on each other by name, so all of them):

    from edgebench.testing.pytest_arm import *  # noqa: F401,F403

- `arm_board` (session scope): the started `ArmBoard`, used like `ssh_board` (`board.lab_dir` holds its
  descriptor, `board.write_descriptor(tmp_path, ...)` writes variants); its commands run on aarch64.
- `arm_lab_session` (session scope): the same board with how it was set up (`ArmLab`: qemu's version,
  whether the rootfs was built or unpacked from the cache, and the seconds each part took).
- `arm_emulation_session` (session scope): qemu-aarch64 registered with binfmt_misc (`ArmEmulation`), the
  one registration of the session that the board and the phones share (its name is the process's).
- `arm_phone_userland` (session scope): the aarch64 phone's userland (`arm_phone.PhoneUserland`: toybox,
  mksh and the aarch64 C library, no Python), made once per cache.
- `arm_phone_factory` (function scope): make(name="armphone", lab_dir=None, **options) -> `AdbPhoneLab`
  of an emulated phone on the session's adb server whose shell is that aarch64 userland (PATH
  /system/bin, ro.product.cpu.abi arm64-v8a); stopped after the test. It needs pytest_adb's fixtures
  (`adb_server`) enabled too.

The first session on a machine builds the rootfs (about 5 minutes on 2 cores) and caches it; later
sessions unpack it in seconds (the phone's userland, made from it and two .debs, is then used as cached).
Where the machine cannot run it (not root, binfmt_misc cannot be mounted,
a host tool missing, no cache and no network to the Debian mirror) the fixtures skip the test saying
why, and fail it when CI is set: CI must run them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from .adblab import AdbServer
from .arm_board import ArmBoard, ArmEmulation, ArmLab, ArmLabUnavailable, Topology, arm_emulation, arm_lab
from .arm_phone import PHONE_PATH, PhoneUserland, phone_userland
from .pytest_adb import AdbPhoneLab, phone_maker

T = TypeVar("T")

__all__ = [
    "arm_board",
    "arm_emulation_session",
    "arm_lab_session",
    "arm_phone_factory",
    "arm_phone_userland",
    "require_arm_lab",
]


def require_arm_lab(why: str) -> None:
    """Skip (or, under CI, fail) a test the arm lab cannot run here, saying why."""
    message = f"aarch64 board unavailable: {why}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@contextlib.contextmanager
def _entered(made: contextlib.AbstractContextManager[T]) -> Iterator[T]:
    """`made` entered, or the test skipped (failed under CI) saying why the arm lab cannot run here; only
    the set-up is guarded, never the test's own errors."""
    stack = contextlib.ExitStack()
    try:
        value = stack.enter_context(made)
    except ArmLabUnavailable as exc:
        stack.close()
        require_arm_lab(str(exc))
        raise  # not reached: require_arm_lab always raises
    with stack:
        yield value


@pytest.fixture(scope="session")
def arm_emulation_session() -> Iterator[ArmEmulation]:
    """qemu-aarch64 registered with binfmt_misc for the session (board and phones share it); unregistered
    afterwards."""
    with _entered(arm_emulation()) as emulation:
        yield emulation


@pytest.fixture(scope="session")
def arm_lab_session(
    arm_emulation_session: ArmEmulation, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ArmLab]:
    """The aarch64 board and its set-up report; the board stopped afterwards."""
    folder = tmp_path_factory.mktemp("arm-board")
    topology = Topology.little_big(os.cpu_count() or 1)
    with _entered(arm_lab(folder, topology=topology, emulation=arm_emulation_session)) as lab:
        yield lab


@pytest.fixture(scope="session")
def arm_phone_userland(arm_emulation_session: ArmEmulation) -> PhoneUserland:
    """The aarch64 phone's userland (made once per cache; its making skips or fails like the board's)."""
    try:
        return phone_userland(arm_emulation_session)
    except ArmLabUnavailable as exc:
        require_arm_lab(str(exc))
        raise  # not reached: require_arm_lab always raises


@pytest.fixture
def arm_phone_factory(
    adb_server: AdbServer, arm_phone_userland: PhoneUserland, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., AdbPhoneLab]]:
    """make(name="armphone", lab_dir=None, **options) -> AdbPhoneLab: an emulated phone whose shell is the
    aarch64 userland (options as adb_phone_factory's, props added to the arm64 ones); stopped after the
    test."""

    def defaults(options: dict[str, Any]) -> None:
        options["props"] = {**arm_phone_userland.props, **(options.get("props") or {})}
        options["env"] = {**arm_phone_userland.env, **(options.get("env") or {})}
        options.setdefault("path", PHONE_PATH)
        options.setdefault("python", "python3")  # what a phone's descriptor says; this phone has none
        options["userland"] = arm_phone_userland.root

    with phone_maker(adb_server, tmp_path_factory.mktemp("arm-phones"), "armphone", defaults) as make:
        yield make


@pytest.fixture(scope="session")
def arm_board(arm_lab_session: ArmLab) -> ArmBoard:
    """A shared aarch64 board (qemu-user, real sshd) for non-destructive tests."""
    return arm_lab_session.board
