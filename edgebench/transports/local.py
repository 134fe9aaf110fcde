"""LocalTransport: the host itself, through subprocess with argv (no shell)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import CommandTimeout, TransferError
from .base import CommandResult, check_timeout


class LocalTransport:
    """Runs commands on this host. Paths are host paths; `~` is expanded."""

    def __init__(self, device: str = "local") -> None:
        self.device = device

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        check_timeout(timeout, self.device)
        argv = tuple(str(a) for a in argv)
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
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise CommandTimeout(argv, timeout, device=self.device, output=_text(out)) from None
        return CommandResult(argv, proc.returncode, _text(out), _text(err), time.monotonic() - start)

    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        check_timeout(timeout, self.device)
        dest = Path(os.path.expanduser(remote))
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
        except OSError as exc:
            raise TransferError(f"push {local} -> {remote} failed: {exc}", device=self.device) from None

    def pull(self, remote: str, local: Path, *, timeout: float) -> None:
        check_timeout(timeout, self.device)
        try:
            shutil.copyfile(os.path.expanduser(remote), local)
        except OSError as exc:
            raise TransferError(f"pull {remote} failed: {exc}", device=self.device) from None

    def read_text(self, remote: str, *, timeout: float) -> str:
        check_timeout(timeout, self.device)
        try:
            return Path(os.path.expanduser(remote)).read_text(errors="replace")
        except OSError as exc:
            raise TransferError(f"read {remote} failed: {exc.strerror}", device=self.device) from None

    def close(self) -> None:
        pass


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
