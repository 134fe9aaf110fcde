"""The emulated phone's process table: one pid namespace for every command, as a phone has one.

A keeper (`bwrap --unshare-pid ... sleep infinity`, with bwrap's own reaper as the namespace's pid 1) holds
the namespace; each shell command's sandbox joins it (`bwrap --pidns FD`). So commands see each other in
`ps` and /proc, a command's orphans are re-parented to the namespace's init and keep running after their
shell is gone (as on a phone, where they are re-parented to init), and a later command can find and kill
them. Killing the keeper (the emulated adbd stopping, dying or rebooting) takes the whole namespace down,
as a power cycle would.

Freezing the phone stops every process of the namespace (SIGSTOP); thawing continues them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

KEEPER_START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class DeviceProcess:
    """One process of the phone: its pid on the phone, its pid on the host, its command line."""

    pid: int
    host_pid: int
    args: str


class DeviceProcesses:
    """The phone's pid namespace and what runs in it."""

    def __init__(self, bwrap: str = "bwrap") -> None:
        self.bwrap = bwrap
        self.stopped = False
        self._keeper: subprocess.Popen[bytes] | None = None
        self._init_pid = 0
        self._keeper_pids: set[int] = set()
        self._ns: str = ""
        self._ns_fd = -1
        self._watched: set[asyncio.Task[Any]] = set()

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Create the namespace (a fresh process table, as after a boot)."""
        read_end, write_end = os.pipe()
        try:
            self._keeper = subprocess.Popen(
                [self.bwrap, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/"]
                + ["--info-fd", str(write_end), "--", "sleep", "infinity"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(write_end,),
                start_new_session=True,
            )
        finally:
            os.close(write_end)
        try:
            info = _read_json(read_end)
        finally:
            os.close(read_end)
        if "child-pid" not in info:
            self.stop()
            raise RuntimeError("bubblewrap did not start the phone's process namespace")
        self._init_pid = int(info["child-pid"])
        self._ns_fd = os.open(f"/proc/{self._init_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self._ns = os.readlink(f"/proc/{self._init_pid}/ns/pid")
        self._keeper_pids = {self._init_pid, *self._keeper_child()}
        self.stopped = False

    def _keeper_child(self) -> list[int]:
        """The keeper's `sleep` (bwrap's init forks it just after reporting itself)."""
        deadline = time.monotonic() + KEEPER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            children = self._children_of(self._init_pid)
            if children:
                return children
            time.sleep(0.01)
        return []

    def stop(self) -> None:
        """End the namespace: the kernel kills every process in it when its init goes."""
        if self._keeper is not None:
            with contextlib.suppress(ProcessLookupError):
                self._keeper.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._keeper.wait(10)
            self._keeper = None
        if self._ns_fd >= 0:
            os.close(self._ns_fd)
            self._ns_fd = -1
        self.stopped = False

    def reset(self) -> None:
        """A reboot: every process dies, a new empty process table."""
        self.stop()
        self.start()

    @property
    def ns_fd(self) -> int:
        """An open fd of the namespace, for `bwrap --pidns`."""
        return self._ns_fd

    # ---- what runs ------------------------------------------------------------------------------------
    def host_pids(self) -> list[int]:
        """Host pids of the phone's processes (its init and the keeper left out)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self._keeper_pids:
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == self._ns and not _is_zombie(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
        return sorted(found)

    def listing(self) -> list[DeviceProcess]:
        """What `ps` on the phone shows (its init and the keeper left out)."""
        procs = []
        for host_pid in self.host_pids():
            try:
                with open(f"/proc/{host_pid}/cmdline", "rb") as fh:
                    args = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
                procs.append(DeviceProcess(_ns_pid(host_pid), host_pid, args))
            except OSError:
                continue
        return procs

    def __len__(self) -> int:
        return len(self.host_pids())

    def signal_all(self, sig: int) -> None:
        for pid in self.host_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def stop_all(self) -> None:
        self.stopped = True
        self.signal_all(signal.SIGSTOP)

    def continue_all(self) -> None:
        self.stopped = False
        self.signal_all(signal.SIGCONT)

    def started(self, host_pid: int | None) -> None:
        """A new command's shell is up: frozen with the rest if the phone is frozen."""
        if self.stopped and host_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(host_pid, signal.SIGSTOP)

    def watch(self, proc: asyncio.subprocess.Process) -> None:
        """Keep a command's sandbox referenced until it exits by itself (dropping an asyncio Process that
        still runs kills it, which a phone's adbd never does)."""
        if proc.returncode is not None:
            return
        task = asyncio.get_running_loop().create_task(proc.wait())
        self._watched.add(task)
        task.add_done_callback(self._watched.discard)

    @staticmethod
    def _children_of(pid: int) -> list[int]:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                return [int(p) for p in fh.read().split()]
        except OSError:
            return []


def _read_json(fd: int) -> dict[str, Any]:
    """The JSON document bwrap writes to its --info-fd (read until it parses or the pipe closes)."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        with contextlib.suppress(ValueError):
            return json.loads(data)
    with contextlib.suppress(ValueError):
        return json.loads(data)
    return {}


async def read_child_pid(fd: int) -> int | None:
    """The host pid of the command bwrap started (from its --info-fd), without blocking the loop."""
    info = await asyncio.get_running_loop().run_in_executor(None, _read_json, fd)
    pid = info.get("child-pid")
    return int(pid) if pid else None


def _ns_pid(host_pid: int) -> int:
    with open(f"/proc/{host_pid}/status") as fh:
        for line in fh:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return host_pid


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
