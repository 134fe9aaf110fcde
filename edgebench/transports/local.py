"""LocalTransport: the host itself, through subprocess with argv (no shell).

Every call is bounded, file calls included: a copy or read runs in a worker thread that checks the deadline
between chunks, and the caller gets CommandTimeout at the deadline even if the worker is stuck in the
kernel (a FIFO without a writer, a hung network file system). A push writes a temporary name and renames
it only when complete and in time, so a timed-out or failed push leaves no file behind; a sealed file
(edgebench.files: a built-in or converted model) is hard-linked instead of copied, on one file system. A
command killed by signal N reads returncode 128 + N, as on the other transports.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from ..errors import SIGNAL_BASE, CommandTimeout, TransferError, TransportError, UserError
from ..files import link_sealed
from .base import CommandResult, check_argv, check_timeout, new_call_token, validate_env

CHUNK = 1 << 20
T = TypeVar("T")


class LocalTransport:
    """Runs commands on this host. Paths are host paths; `~` is expanded."""

    def __init__(self, device: str = "local") -> None:
        self.device = device

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        check_timeout(timeout, self.device)
        argv = check_argv(argv)
        validate_env(env)
        full_env = {**os.environ, **env} if env else None
        start = time.monotonic()
        try:
            # A new session so a timeout can kill the whole process group, not just the leader; and the
            # child dies with this process, so a killed controller leaves no agent measuring behind it.
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, "", f"{argv[0]}: not found", time.monotonic() - start)
        except PermissionError:
            return CommandResult(argv, 126, "", f"{argv[0]}: permission denied", time.monotonic() - start)
        except OSError as exc:
            if exc.errno == errno.E2BIG:
                raise UserError(f"{self.device}: the command line of {argv[0]} is too long to run") from None
            raise TransportError(f"cannot start {argv[0]}: {exc.strerror}", device=self.device) from None
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise CommandTimeout(argv, timeout, device=self.device, output=_text(out)) from None
        code = SIGNAL_BASE - proc.returncode if proc.returncode < 0 else proc.returncode
        return CommandResult(argv, code, _text(out), _text(err), time.monotonic() - start)

    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        check_timeout(timeout, self.device)
        local = Path(local)
        dest = Path(os.path.expanduser(remote))
        if not local.is_file():
            raise TransferError(f"push {local}: no such local file", device=self.device)
        tmp = dest.with_name(f"{dest.name}.part-{new_call_token()}")

        def copy(job: _Job) -> None:
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not link_sealed(local, tmp):  # a file edgebench never changes is shared, not copied
                    _copy(local, tmp, job)
                job.commit(lambda: os.replace(tmp, dest))
            finally:
                tmp.unlink(missing_ok=True)

        self._bounded(("push", str(local), remote), timeout, copy, f"push {local} -> {remote}")

    def pull(self, remote: str, local: Path, *, timeout: float) -> None:
        check_timeout(timeout, self.device)
        source = Path(os.path.expanduser(remote))
        local = Path(local)
        tmp = local.with_name(f"{local.name}.part-{new_call_token()}")

        def copy(job: _Job) -> None:
            try:
                _copy(source, tmp, job)
                job.commit(lambda: os.replace(tmp, local))
            finally:
                tmp.unlink(missing_ok=True)

        self._bounded(("pull", remote, str(local)), timeout, copy, f"pull {remote}")

    def read_text(self, remote: str, *, timeout: float) -> str:
        check_timeout(timeout, self.device)
        path = Path(os.path.expanduser(remote))
        return self._bounded(
            ("read", remote), timeout, lambda job: path.read_text(errors="replace"), f"read {remote}"
        )

    def close(self) -> None:
        pass

    def _bounded(self, argv: tuple[str, ...], timeout: float, work: Callable[[_Job], T], what: str) -> T:
        """Run a file operation in a worker; at the deadline it is cancelled and CommandTimeout raised."""
        job = _Job()
        name = f"edgebench-local-{argv[0]}"
        threading.Thread(target=job.run, args=(work,), name=name, daemon=True).start()
        if not job.done.wait(max(timeout, 0.0)) and job.cancel():
            raise CommandTimeout(argv, timeout, device=self.device)
        job.done.wait()  # it committed just in time: its outcome stands
        if isinstance(job.error, OSError):
            reason = job.error.strerror or type(job.error).__name__
            raise TransferError(f"{what} failed: {reason}", device=self.device) from None
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]


class _Cancelled(Exception):
    """The caller gave up on this file operation (its deadline passed)."""


class _Job:
    """One file operation in a worker thread: cancelled at the deadline unless it committed first."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._cancelled = False
        self._committed = False

    def run(self, work: Callable[[_Job], object]) -> None:
        try:
            self.result = work(self)
        except _Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc
        finally:
            self.done.set()

    def check(self) -> None:
        if self._cancelled:
            raise _Cancelled

    def commit(self, action: Callable[[], object]) -> None:
        """Do the final, visible step (the rename) only if the caller has not given up."""
        with self._lock:
            self.check()
            self._committed = True
            action()

    def cancel(self) -> bool:
        """Give up; False if the work already committed (then its outcome stands)."""
        with self._lock:
            if self._committed:
                return False
            self._cancelled = True
            return True


def _copy(source: Path, dest: Path, job: _Job) -> None:
    with open(source, "rb") as src, open(dest, "wb") as out:
        while True:
            job.check()
            block = src.read(CHUNK)
            if not block:
                return
            out.write(block)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent goes away (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")
