"""Pytest fixtures for real ssh boards (OpenSSH sshd on loopback, see `edgebench.testing.sshd`).

Enable them in a conftest.py with one line:

    from edgebench.testing.pytest_ssh import fresh_ssh_board, slow_ssh_board, ssh_board  # noqa: F401

- `ssh_board` (session scope): one board shared by the whole session. Use it for anything that does not
  break it. `board.lab_dir` is a lab folder holding its descriptor `board.name + ".toml"` (pass it as
  `--lab`), `board.spec()` is its DeviceSpec, `board.workdir` its device workdir, `board.port` its port.
  Need your own descriptor variant? `board.write_descriptor(tmp_path, name="x", known_hosts=...)`.
- `fresh_ssh_board` (function scope): a board of your own, for destructive tests (`kill()`, `stop()`,
  `restart()`, `rotate_host_key()`); stopped after the test.
- `slow_ssh_board` (session scope): a board whose sshd and sessions share a cgroup v1 CPU quota of half a
  CPU (a slower chip than `ssh_board`), by cgroup v1 `cpu.cfs_quota_us` or v2 `cpu.max`; skipped where
  neither can be written.
- `net_ssh_board` (function scope): a board in its own network namespace, at its own address on port 22,
  whose cable the test may pull (`unplug()` / `replug()`); skipped where network namespaces cannot be made.

Without /usr/sbin/sshd the fixtures skip the test (and fail it when CI is set: CI must run them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .netns import netns_supported
from .sshd import SshBoard, cpu_quota_supported, sshd_available

__all__ = ["ssh_board", "fresh_ssh_board", "slow_ssh_board", "net_ssh_board", "require_sshd"]


def require_sshd() -> None:
    """Skip (or, under CI, fail) when OpenSSH's server is not installed."""
    if sshd_available():
        return
    message = "/usr/sbin/sshd not installed (Debian package openssh-server)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def ssh_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBoard]:
    """A shared real ssh board for non-destructive tests."""
    require_sshd()
    board = SshBoard(tmp_path_factory.mktemp("ssh-board"), "board").start()
    try:
        yield board
    finally:
        board.stop()


@pytest.fixture
def fresh_ssh_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBoard]:
    """A real ssh board of this test's own, for tests that kill, stop or re-key it."""
    require_sshd()
    board = SshBoard(tmp_path_factory.mktemp("ssh-fresh"), "fresh").start()
    try:
        yield board
    finally:
        board.stop()


@pytest.fixture(scope="session")
def slow_ssh_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBoard]:
    """A real ssh board limited to half a CPU by a cgroup quota (v1 cfs, or v2 cpu.max): a slower chip in
    the same lab."""
    require_sshd()
    if not cpu_quota_supported():
        pytest.skip("no writable cgroup cpu controller here (v1 cpu.cfs_quota_us, or v2 cpu.max delegable)")
    board = SshBoard(tmp_path_factory.mktemp("ssh-slow"), "slowboard", cpu_quota=0.5).start()
    try:
        yield board
    finally:
        board.stop()


@pytest.fixture
def net_ssh_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBoard]:
    """A real ssh board behind its own network namespace and veth cable, for tests that unplug it."""
    require_sshd()
    if not netns_supported():
        pytest.skip("network namespaces cannot be made here (needs root and iproute2)")
    board = SshBoard(tmp_path_factory.mktemp("ssh-net"), "netboard", network=True).start()
    try:
        yield board
    finally:
        board.close()
