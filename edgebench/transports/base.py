"""The transport interface every device speaks, and the one place argv becomes a command string."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..errors import CommandError, UserError


@dataclass(frozen=True)
class CommandResult:
    """What a remote command did: typed, never a bare string."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float

    def check(self, device: str = "") -> CommandResult:
        """Raise CommandError unless the command exited 0."""
        if self.returncode != 0:
            raise CommandError(self.argv, self.returncode, self.stdout, self.stderr, device=device)
        return self


@runtime_checkable
class Transport(Protocol):
    """run argv with a timeout, push, pull, read_text, close. Every call is bounded."""

    device: str

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult: ...

    def push(self, local: Path, remote: str, *, timeout: float) -> None: ...

    def pull(self, remote: str, local: Path, *, timeout: float) -> None: ...

    def read_text(self, remote: str, *, timeout: float) -> str: ...

    def close(self) -> None: ...


def check_timeout(timeout: float, device: str) -> float:
    """Every call is bounded: a nan or infinite limit would never expire (a nan deadline compares false
    with every clock reading) and a negative one makes no sense, so both are refused before anything runs."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
        raise UserError(f"{device}: timeout must be a finite number of seconds, got {timeout!r}")
    if timeout < 0:
        raise UserError(f"{device}: timeout must not be negative, got {timeout!r}")
    return timeout


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The only way a remote command string is made: argv (and env) quoted with shlex."""
    if not argv:
        raise ValueError("empty argv")
    parts = [str(a) for a in argv]
    if env:
        assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if _is_env_name(k)]
        return " ".join(["env", *assigns, shlex.join(parts)])
    return shlex.join(parts)


def _is_env_name(name: str) -> bool:
    if not name or not (name[0].isalpha() or name[0] == "_"):
        raise ValueError(f"invalid environment variable name {name!r}")
    if not all(c.isalnum() or c == "_" for c in name):
        raise ValueError(f"invalid environment variable name {name!r}")
    return True
