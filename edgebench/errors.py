"""Typed errors. Each carries what went wrong; the CLI turns them into one line and an exit code.

Exit codes (DESIGN.md): 1 a measured failure, 2 usage/config/input error, 3 lab failure.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence


class EdgebenchError(Exception):
    """Base class: an expected failure that the CLI prints as one line."""

    exit_code = 1


class UserError(EdgebenchError):
    """Bad input from the user: unknown device, malformed file, missing model."""

    exit_code = 2


class ConfigError(UserError):
    """A descriptor or suite file is wrong; the message names the file and key."""

    def __init__(self, path: object, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)


class ModelError(UserError):
    """A model file is missing, unreadable or corrupt."""


class MeasurementError(EdgebenchError):
    """The device ran the job but the measurement failed (e.g. the runtime rejected the model)."""

    def __init__(self, message: str, *, device: str = "", kind: str = "measurement") -> None:
        super().__init__(f"{device}: {message}" if device else message)
        self.device = device
        self.kind = kind


class LabError(EdgebenchError):
    """A device could not be reached or driven."""

    exit_code = 3


class TransportError(LabError):
    """A transport call failed (connection, transfer, protocol)."""

    def __init__(self, message: str, *, device: str = "") -> None:
        super().__init__(f"{device}: {message}" if device else message)
        self.device = device


class HostKeyError(TransportError):
    """An ssh host key is unknown or changed; never silently accepted."""


class CommandError(TransportError):
    """A remote command exited non-zero (or died); carries argv, exit code and output."""

    def __init__(
        self,
        argv: Sequence[str],
        returncode: int | None,
        stdout: str,
        stderr: str,
        *,
        device: str = "",
        message: str = "",
    ) -> None:
        tail = (stderr or stdout).strip().splitlines()
        detail = message or (tail[-1] if tail else "no output")
        what = exit_description(returncode)
        super().__init__(f"command {argv[0] if argv else '?'} {what}: {detail}", device=device)
        self.argv = list(argv)
        self.returncode = returncode
        self.signal = signal_of(returncode)
        self.stdout = stdout
        self.stderr = stderr


SIGNAL_BASE = 128


def signal_of(returncode: int | None) -> int | None:
    """The signal that ended a command, by the one convention every transport follows: a command killed by
    signal N reads returncode 128 + N, as sh and adbd report it (the local transport converts subprocess's
    -N). An exit status above 128 is therefore read as a signal death, as shells read it."""
    if returncode is None or not SIGNAL_BASE < returncode < SIGNAL_BASE + 65:
        return None
    return returncode - SIGNAL_BASE


def exit_description(returncode: int | None) -> str:
    """'exited 3', 'killed by signal 9 (SIGKILL)', or 'died without an exit status'."""
    if returncode is None:
        return "died without an exit status"
    number = signal_of(returncode)
    if number is None:
        return f"exited {returncode}"
    try:
        name = f" ({signal.Signals(number).name})"
    except ValueError:
        name = ""
    return f"killed by signal {number}{name}"


def seconds(value: float) -> str:
    """A time limit for a message: what is left of a 2 s budget reads "2", not "1.99999"."""
    return f"{round(value, 2):g}"


class CommandTimeout(TransportError):
    """A remote call did not finish within its timeout."""

    def __init__(
        self, argv: Sequence[str], timeout: float, *, device: str = "", output: str = "", detail: str = ""
    ) -> None:
        what = f"{argv[0] if argv else 'call'} timed out after {seconds(timeout)} s"
        super().__init__(f"{what} ({detail})" if detail else what, device=device)
        self.argv = list(argv)
        self.timeout = timeout
        self.output = output


class ConnectionLost(TransportError):
    """The link to the device dropped during a call (board died, cable pulled); carries argv and output."""

    def __init__(
        self, argv: Sequence[str], message: str, *, device: str = "", stdout: str = "", stderr: str = ""
    ) -> None:
        super().__init__(message, device=device)
        self.argv = list(argv)
        self.stdout = stdout
        self.stderr = stderr


class TransferError(TransportError):
    """A push or pull failed or delivered different bytes."""


def one_line(error: BaseException) -> str:
    """The error as a single line: what the CLI prints and what error records keep."""
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())
