"""The transport interface every device speaks, and the one place argv becomes a command string.

Remote commands (ssh and adb) run under a small POSIX sh guard, so that nothing a call starts outlives it:

- every process of the call carries `EDGEBENCH_CALL=<token>` in its environment (a fresh random token per
  call), so the call's processes can be found on the device whatever their process group or parent;
- the command's stdin is /dev/null (it sees EOF at once, as with the local transport), while the guard keeps
  the channel's stdin open as the controller's lifeline: when it reaches EOF (the controller timed out and
  closed the channel, or died and its connection closed) a watchdog kills every process of the call;
- when the command ends, whatever it left running in the background is killed too.

Exit statuses follow one convention on every transport: a command killed by signal N reads returncode
128 + N, as sh and adbd report it (`errors.exit_description` says "killed by signal 9 (SIGKILL)").
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import CommandError, UserError, signal_of

CALL_ENV = "EDGEBENCH_CALL"
# Linux refuses a single argument longer than MAX_ARG_STRLEN (32 pages) with E2BIG at exec.
MAX_ARG_BYTES = 131072
# Command lines longer than this go to the device as a script file (adb's service request carries at most
# 64 KiB; sshd hands the whole line to the login shell as one argument).
INLINE_COMMAND_MAX = 60000
CLEAN_MARK = "edgebench-clean"
_TOKEN = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class CommandResult:
    """What a remote command did: typed, never a bare string."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def signal(self) -> int | None:
        """The signal that killed the command (returncode 128 + N), or None."""
        return signal_of(self.returncode)

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
        validate_env(env)
        assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        return " ".join(["env", *assigns, shlex.join(parts)])
    return shlex.join(parts)


def validate_env(env: Mapping[str, str] | None) -> None:
    """Refuse an environment variable name a shell cannot set (one line naming it)."""
    for name in env or {}:
        if not _is_env_name(name):
            raise UserError(f"invalid environment variable name {name!r} (letters, digits and _ only)")


def _is_env_name(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] == "_") and all(c.isalnum() or c == "_" for c in name)


def check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """argv as strings; an argument no Linux exec accepts is refused here, naming the limit (not E2BIG)."""
    parts = tuple(str(a) for a in argv)
    if not parts:
        raise ValueError("empty argv")
    for index, arg in enumerate(parts):
        size = len(arg.encode("utf-8", errors="surrogateescape"))
        if size >= MAX_ARG_BYTES:
            raise UserError(
                f"argument {index} of {parts[0]} is {size} bytes; Linux accepts at most {MAX_ARG_BYTES - 1} "
                "bytes in one argument (MAX_ARG_STRLEN): pass large inputs in a file"
            )
    return parts


# ---- the guard ---------------------------------------------------------------------------------------
# Kills every process whose environment carries one of the tokens (stopped first so none can fork, then
# killed; repeated until none is left), sparing one pid (the caller), and removes the given files.
# argv: SPARE_PID TOKEN... [-- FILE...]. Prints CLEAN_MARK when nothing of those calls is left.
REAP_SCRIPT = (
    "spare=$1; shift; pat=\n"
    'while [ $# -gt 0 ] && [ "$1" != -- ]; do pat="$pat -e ' + CALL_ENV + '=$1"; shift; done\n'
    '[ "${1-}" = -- ] && shift\n'
    '[ $# -eq 0 ] || rm -f -- "$@"\n'
    '[ -n "$pat" ] || { echo ' + CLEAN_MARK + "; exit 0; }\n"
    "command -v grep >/dev/null 2>&1 || { echo 'edgebench-left: no grep'; exit 1; }\n"
    # environ is NUL-separated: grep -z where it exists (GNU, busybox, toybox), else one tr per process
    "z=; printf 'a\\0b\\0' | grep -q -z -x -F b 2>/dev/null && z=1\n"
    "scan() {\n"
    '  if [ -n "$z" ]; then grep -l -s -z -x -F $pat /proc/[0-9]*/environ 2>/dev/null; return; fi\n'
    "  for f in /proc/[0-9]*/environ; do\n"
    '    tr "\\000" "\\n" <"$f" 2>/dev/null | grep -q -x -F $pat && echo "$f"\n'
    "  done\n"
    "}\n"
    "n=0\n"
    "while [ $n -lt 20 ]; do\n"
    "  if [ $n -gt 1 ]; then sleep 0.1 2>/dev/null || sleep 1; fi\n"
    "  left=\n"
    "  for f in $(scan); do\n"
    '    p=${f#/proc/}; p=${p%/environ}; [ "$p" = "$spare" ] || left="$left $p"\n'
    "  done\n"
    '  if [ -z "$left" ]; then echo ' + CLEAN_MARK + "; exit 0; fi\n"
    "  kill -STOP $left 2>/dev/null; kill -KILL $left 2>/dev/null\n"
    "  n=$((n+1))\n"
    "done\n"
    'echo "edgebench-left:$left"; exit 1\n'
)

# argv: REAP_SCRIPT HEARTBEAT_S COMMAND... The command runs in the background with stdin at /dev/null; a
# watchdog reads the channel's stdin (kept on fd 3) and, at EOF, becomes the reaper of this call (its
# environment no longer carries the token, so it spares itself). With HEARTBEAT_S > 0 the controller also
# sends a line at least that often: each line restarts a dead man's timer, and a controller that stops
# sending (frozen, its host gone silent) is taken for dead after HEARTBEAT_S and its call reaped, so a
# controller that may have lost the device's lease cannot go on measuring (the old timer is killed with
# SIGKILL: mksh's background subshells outlive SIGTERM while they wait). When the command ends,
# leftovers and the watchdog are reaped (sparing the guard itself) and the command's status is passed on:
# 128 + N for signal N.
GUARD_SCRIPT = (
    "reap=$1; hb=$2; shift 2\n"
    "exec 3<&0\n"
    '"$@" </dev/null 3<&- &\n'
    "cmd=$!\n"
    '{ dm=; deadman() { [ -z "$dm" ] || kill -KILL "$dm" 2>/dev/null; [ "$hb" = 0 ] && return; '
    '{ sleep "$hb"; exec env ' + CALL_ENV + '= sh -c "$reap" sh 0 "$' + CALL_ENV + '"; } & dm=$!; }; '
    'deadman; while read -r _; do deadman; done; [ -z "$dm" ] || kill -KILL "$dm" 2>/dev/null; '
    "exec env " + CALL_ENV + '= sh -c "$reap" sh 0 "$' + CALL_ENV + '"; } '
    "<&3 >/dev/null 2>&1 &\n"
    "watch=$!\n"
    "exec 3<&-\n"
    'wait "$cmd" 2>/dev/null; rc=$?\n'
    'kill -KILL "$watch" 2>/dev/null\n'
    "env " + CALL_ENV + '= sh -c "$reap" sh "$$" "$' + CALL_ENV + '" >/dev/null 2>&1\n'
    'exit "$rc"\n'
)


REAP_TIMEOUT_S = 2.0


def reap_budget(timeout: float) -> float:
    """How long a transport may spend, after a call timed out, killing what the call left on the device
    before it reports the timeout: half the call's own timeout, between 0.5 and REAP_TIMEOUT_S seconds (on
    a frozen or unplugged device that time is lost, and the kill is retried on the next working call)."""
    return min(REAP_TIMEOUT_S, max(0.5, timeout / 2))


def new_call_token() -> str:
    """A fresh tag for one remote call (16 hex digits)."""
    return secrets.token_hex(8)


def guarded_command(
    argv: Sequence[str], env: Mapping[str, str] | None, token: str, heartbeat_s: float = 0.0
) -> str:
    """The command line that runs argv (with env) under the guard, its processes tagged with `token`.
    With `heartbeat_s` > 0 the caller must send a line on the command's stdin at least that often."""
    _check_token(token)
    validate_env(env)
    beat = f"{heartbeat_s:.3f}".rstrip("0").rstrip(".") if heartbeat_s > 0 else "0"
    guard = ["sh", "-c", GUARD_SCRIPT, "sh", REAP_SCRIPT, beat, *argv]
    return command_line(guard, {**(env or {}), CALL_ENV: token})


def heartbeat_s(spec: Any) -> float:
    """How long a guarded call outlives a silent controller: the descriptor's keepalive interval times its
    count (the same rule that finds a silent device), 0 without keepalives. Lease periods must be longer."""
    interval = float(getattr(spec, "keepalive_interval_s", 0.0) or 0.0)
    return interval * int(getattr(spec, "keepalive_count_max", 0) or 0)


class Heartbeat:
    """Sends the guard a line every `interval` seconds (from the call's own reading loop)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = time.monotonic() + interval if interval > 0 else float("inf")

    def send_when_due(self, send: Callable[[bytes], object]) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.interval
        try:
            send(b"\n")
        except (OSError, EOFError):
            pass  # a closed channel ends the call anyway; its reading loop reports it


def script_file_command(line: str, path: str) -> tuple[str, str]:
    """For a command line too long to send inline: (the script's text, the short line that runs it).
    The script removes itself first, so it never outlives the call that ran it."""
    return 'rm -f -- "$0"\n' + line + "\n", command_line(["sh", path])


def cleanup_argv(tokens: Sequence[str], files: Sequence[str] = (), spare: int = 0) -> list[str]:
    """argv that kills every process of the tagged calls and removes `files`; prints CLEAN_MARK if done."""
    for token in tokens:
        _check_token(token)
    return ["sh", "-c", REAP_SCRIPT, "sh", str(spare), *tokens, "--", *files]


def _check_token(token: str) -> None:
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"not a call token: {token!r}")


class Leftovers:
    """What failed calls may have left on a device (calls to kill, by token; temporary files to remove),
    kept until a working connection can clean them up. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: set[str] = set()
        self._files: set[str] = set()

    def add(self, *, call: str | None = None, file: str | None = None) -> None:
        with self._lock:
            if call:
                self._calls.add(call)
            if file:
                self._files.add(file)

    def take(self) -> tuple[list[str], list[str]]:
        """Everything pending (and forget it: give it back if the cleanup fails)."""
        with self._lock:
            calls, files = sorted(self._calls), sorted(self._files)
            self._calls.clear()
            self._files.clear()
        return calls, files

    def give_back(self, calls: Sequence[str], files: Sequence[str]) -> None:
        with self._lock:
            self._calls.update(calls)
            self._files.update(files)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._calls or self._files)
