"""SshTransport: Linux boards over ssh (paramiko), key auth only, host keys always verified.

What this module guarantees (each point is a way paramiko setups have hurt labs):

- Host keys are checked against the descriptor's `known_hosts` (default `~/.ssh/known_hosts`). An unknown
  key is refused (a RejectPolicy that says which host, key and file), a changed key is always refused.
  Trust-on-first-use happens only with `trust_on_first_use = true` in the descriptor, and then the key is
  appended to that known_hosts file so the next connection is pinned.
- Key auth only: the descriptor's `key` (an optional passphrase comes from the environment variable
  EDGEBENCH_SSH_PASSPHRASE), or, without `key`, the ssh-agent and the default ~/.ssh keys. No password auth.
  No key material or passphrase ever appears in an error message.
- Every call is bounded: connect, banner and auth by `connect_timeout`; commands, transfers and reads by
  their own `timeout`. stdout and stderr are drained together (a full window on either stream would
  otherwise stall the remote process and paramiko's exit status forever). On timeout the channel is closed,
  the remote process tree is killed and CommandTimeout is raised. A connection that dies mid-command raises
  TransportError (carrying device and argv) as soon as paramiko notices, well within the timeout.
- Commands are made only by `command_line(argv, env)`; a tiny fixed `sh -c` wrapper reports the remote pid
  (so a timed-out command can be killed) and then `exec`s the argv unchanged.
- The connection is opened when the transport is made (so errors surface early) and reopened lazily when it
  dropped between calls.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import os
import posixpath
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from ..errors import (
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    HostKeyError,
    TransferError,
    TransportError,
    one_line,
    seconds,
)
from ..lab.descriptors import DeviceSpec
from .base import CommandResult, check_timeout, command_line

# paramiko logs handshake failures with tracebacks from its transport thread; without a handler they
# would reach stderr through logging's last resort. Our callers get one typed line instead; an
# application that configures logging still receives paramiko's records.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

PASSPHRASE_ENV = "EDGEBENCH_SSH_PASSPHRASE"
KEEPALIVE_S = 15
POLL_S = 0.2
KILL_TIMEOUT_S = 5.0
CHUNK = 1 << 16
PID_MARKER = "@edgebench-pid "

# Prints the shell's pid on stderr, then becomes the command (same pid), so a timed-out command can be
# found and killed. "$@" keeps every argument exactly as quoted by command_line.
WRAPPER = "printf '" + PID_MARKER + '%s\\n\' "$$" >&2; exec "$@"'

# Kills a process and all its descendants (found through /proc, parents first so nothing re-forks).
KILL_TREE = (
    "all=$1; new=$1\n"
    'while [ -n "$new" ]; do\n'
    '  next=""\n'
    "  for s in /proc/[0-9]*/stat; do\n"
    '    { read -r l < "$s"; } 2>/dev/null || continue\n'
    "    set -- ${l##*) }\n"
    "    for p in $new; do\n"
    '      if [ "$2" = "$p" ]; then c=${s#/proc/}; next="$next ${c%/stat}"; fi\n'
    "    done\n"
    "  done\n"
    '  all="$all$next"; new=$next\n'
    "done\n"
    "kill -KILL $all 2>/dev/null; true\n"
)

T = TypeVar("T")


class SshTransport:
    """A board reached over ssh. See the module docstring for what every call guarantees."""

    def __init__(self, spec: DeviceSpec) -> None:
        if not spec.host:
            raise ConfigError(spec.source, 'host: required for transport = "ssh"')
        self.device = spec.name
        self.spec = spec
        self._lock = threading.RLock()
        self._client: Any = None  # paramiko.SSHClient, imported lazily
        self._sftp: Any = None
        self._pkey: Any = None
        self.connect()

    # ---- connection -----------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """host:port as a human reads it."""
        return f"{self.spec.host}:{self.spec.port}"

    @property
    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.spec.known_hosts))

    def connect(self, timeout: float | None = None) -> None:
        """Open the connection now (it is also reopened lazily when it dropped), bounded by the
        descriptor's connect_timeout and, inside a call, by what is left of the call's timeout."""
        limit = self.spec.connect_timeout_s if timeout is None else min(self.spec.connect_timeout_s, timeout)
        with self._lock:
            if not self._alive():
                self._close_quietly()
                self._client = self._open_client(max(limit, 0.1))

    def _alive(self) -> bool:
        transport = self._client.get_transport() if self._client is not None else None
        return bool(transport is not None and transport.is_active())

    def _transport(self, timeout: float) -> Any:
        """The live paramiko Transport, reconnecting if the connection dropped since the last call."""
        self.connect(timeout)
        return self._client.get_transport()

    def _open_client(self, limit: float) -> Any:
        spec = self.spec
        client = paramiko.SSHClient()
        self._load_known_hosts(client)
        client.set_missing_host_key_policy(
            _TrustOnFirstUse(self) if spec.trust_on_first_use else _RejectUnknown(self)
        )
        pkey = self._private_key()
        started = time.monotonic()
        try:
            client.connect(
                spec.host,
                port=spec.port,
                username=spec.user or _local_user(),
                pkey=pkey,
                allow_agent=pkey is None,
                look_for_keys=pkey is None,
                timeout=limit,
                banner_timeout=limit,
                auth_timeout=limit,
                channel_timeout=limit,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"host key for {_host_entry(spec.host, spec.port)} CHANGED: the board offers "
                f"{exc.key.get_name()} {fingerprint(exc.key)} but {self.known_hosts_path} pins "
                f"{fingerprint(exc.expected_key)}; refusing to connect (if the board was reinstalled, "
                f"remove its old line from that file)",
                device=self.device,
            ) from None
        except BaseException as exc:  # noqa: BLE001 - every failure becomes one typed line
            client.close()
            raise self._connect_error(exc, limit, started) from None
        transport = client.get_transport()
        transport.set_keepalive(KEEPALIVE_S)
        return client

    def _load_known_hosts(self, client: Any) -> None:
        path = self.known_hosts_path
        if not path.exists():
            if self.spec.trust_on_first_use:
                return
            raise HostKeyError(
                f"known_hosts file {path} does not exist, so the host key of {self.address} cannot be "
                f"verified (pin it there, or set trust_on_first_use = true in {self.spec.source})",
                device=self.device,
            )
        try:
            client.load_host_keys(str(path))
        except (OSError, UnicodeDecodeError) as exc:
            raise HostKeyError(
                f"cannot read known_hosts file {path}: {_reason(exc)}", device=self.device
            ) from None
        except Exception as exc:  # noqa: BLE001 - paramiko raises various errors on malformed lines
            raise HostKeyError(
                f"known_hosts file {path} is malformed: {type(exc).__name__}", device=self.device
            ) from None

    def _private_key(self) -> Any:
        """The descriptor's key, loaded once; error messages name the descriptor, never key contents."""
        if self.spec.key is None:
            return None
        if self._pkey is not None:
            return self._pkey
        path = Path(os.path.expanduser(self.spec.key))
        if not path.is_file():
            raise ConfigError(self.spec.source, f"key: file {path} not found")
        passphrase = os.environ.get(PASSPHRASE_ENV) or None
        try:
            self._pkey = paramiko.PKey.from_path(path, passphrase.encode() if passphrase else None)
        except PermissionError:
            raise ConfigError(self.spec.source, f"key: file {path} is not readable") from None
        except Exception as exc:  # noqa: BLE001 - never echo the exception: some carry the key bytes
            if passphrase is None and isinstance(exc, TypeError):
                # cryptography: "Key is password-protected, but password was not provided."
                raise ConfigError(
                    self.spec.source,
                    f"key: {path} is encrypted; set {PASSPHRASE_ENV} or use an unencrypted lab key",
                ) from None
            hint = " (or the passphrase is wrong)" if passphrase else ""
            raise ConfigError(
                self.spec.source, f"key: {path} is not a private key edgebench can read{hint}"
            ) from None
        return self._pkey

    def _connect_error(self, exc: BaseException, limit: float, started: float) -> TransportError:
        where = f"{self.spec.user or _local_user()}@{self.address}"
        if isinstance(exc, paramiko.PasswordRequiredException):
            why = f"the key is encrypted; set {PASSPHRASE_ENV}"
        elif isinstance(exc, paramiko.AuthenticationException):
            which = f"the key from {self.spec.source}" if self.spec.key else "the ssh-agent and default keys"
            why = f"authentication failed with {which}"
        elif isinstance(exc, socket.timeout | TimeoutError):
            why = f"connect timed out after {seconds(limit)} s"
        elif isinstance(exc, socket.gaierror):
            why = f"unknown host ({exc.strerror or exc})"
        elif isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            why = _unreachable_reason(exc)
        elif isinstance(exc, OSError):
            why = _reason(exc)
        elif isinstance(exc, paramiko.SSHException | EOFError) and (
            "banner" in str(exc).lower() or time.monotonic() - started >= limit * 0.95
        ):
            why = f"no ssh answer within {seconds(limit)} s (is the board hung, or is that port not sshd?)"
        elif isinstance(exc, paramiko.SSHException | EOFError):
            why = f"ssh handshake failed: {one_line(exc) if str(exc) else type(exc).__name__}"
        elif isinstance(exc, KeyboardInterrupt):
            raise exc
        else:
            why = f"{type(exc).__name__}: {one_line(exc)}"
        return TransportError(f"cannot connect to {where}: {why}", device=self.device)

    def _close_quietly(self) -> None:
        for thing in (self._sftp, self._client):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # noqa: BLE001, S110 - closing a dead connection may fail; nothing to do
                    pass
        self._sftp = None
        self._client = None

    def close(self) -> None:
        with self._lock:
            self._close_quietly()

    # ---- commands -------------------------------------------------------------------------------
    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run argv on the board; stdout and stderr drained together; bounded by `timeout`."""
        check_timeout(timeout, self.device)
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise ValueError("empty argv")
        command = command_line(["sh", "-c", WRAPPER, "sh", *argv], env)
        start = time.monotonic()
        deadline = start + timeout
        channel = self._open_channel(argv, deadline, timeout)
        out, err = bytearray(), bytearray()
        try:
            channel.exec_command(command)
            channel.shutdown_write()  # stdin at EOF, as for the local transport
            status = self._drain(channel, argv, deadline, out, err, timeout)
        finally:
            channel.close()
        stderr, _ = split_pid_marker(_text(err))
        return CommandResult(argv, status, _text(out), stderr, time.monotonic() - start)

    def _open_channel(self, argv: Sequence[str], deadline: float, timeout: float) -> Any:
        """A new session channel before `deadline`; one reconnect if the link died since the last call."""
        for attempt in (1, 2):
            transport = self._transport(deadline - time.monotonic())
            limit = max(deadline - time.monotonic(), 0.1)
            try:
                return transport.open_session(timeout=limit)
            except Exception as exc:  # noqa: BLE001
                if transport.is_active() and time.monotonic() >= deadline - 0.05:
                    raise CommandTimeout(argv, timeout, device=self.device) from None  # board not answering
                # The connection may have died just now; nothing ran yet, so one reconnect is safe.
                if attempt == 2 or transport.is_active():
                    raise TransportError(
                        f"cannot open a session for {argv[0]}: {_reason(exc)}", device=self.device
                    ) from None
        raise AssertionError("unreachable")

    def _drain(
        self,
        channel: Any,
        argv: tuple[str, ...],
        deadline: float,
        out: bytearray,
        err: bytearray,
        timeout: float,
    ) -> int:
        """Read both streams until the command exits; raise typed errors on timeout or a lost link.

        OpenSSH sends data, EOF, exit-status (or exit-signal), CLOSE; exit-status can come before the last
        data, so a command is finished only once EOF has arrived too. A process killed by a signal has no
        exit status: paramiko reports -1, like a negative returncode locally.
        """
        while True:
            _read_available(channel, out, err)
            if channel.eof_received and channel.exit_status_ready():
                _read_available(channel, out, err)
                if channel.exit_status == -1 and not self._alive():
                    raise self._lost(argv, out, err)
                return int(channel.exit_status)
            if channel.closed or not self._alive():
                _read_available(channel, out, err)
                if channel.exit_status != -1:
                    return int(channel.exit_status)
                raise self._lost(argv, out, err)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill_remote(channel, err)
                raise CommandTimeout(argv, timeout, device=self.device, output=_text(out)[-2000:])
            if channel.eof_received:
                channel.status_event.wait(min(POLL_S, remaining))  # only the exit status is still due
            else:
                select.select([channel], [], [], min(POLL_S, remaining))

    def _lost(self, argv: tuple[str, ...], out: bytearray, err: bytearray) -> ConnectionLost:
        return ConnectionLost(
            argv,
            f"connection to {self.address} lost while running {argv[0]}",
            device=self.device,
            stdout=_text(out),
            stderr=split_pid_marker(_text(err))[0],
        )

    def _kill_remote(self, channel: Any, err: bytearray) -> None:
        """Close the channel and, in the background (the caller hears of the timeout at once), kill the
        timed-out command's process tree on the board. Best effort, bounded by KILL_TIMEOUT_S."""
        channel.close()
        _, pid = split_pid_marker(_text(err))
        transport = self._client.get_transport() if self._client is not None else None
        if pid is None or transport is None or not transport.is_active():
            return
        threading.Thread(
            target=_kill_tree, args=(transport, pid), name=f"ssh-kill-{self.device}-{pid}", daemon=True
        ).start()

    # ---- files ----------------------------------------------------------------------------------
    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        """Upload to a temporary name, then rename over `remote`: a half-written file never has the name."""
        local = Path(local)
        if not local.is_file():
            raise TransferError(f"push {local}: no such local file", device=self.device)
        tmp = f"{remote}.part-{os.getpid()}-{threading.get_ident() % 100000}"

        def upload(sftp: Any) -> None:
            _sftp_makedirs(sftp, posixpath.dirname(remote))
            try:
                with open(local, "rb") as fh:
                    sftp.putfo(fh, tmp, file_size=local.stat().st_size, confirm=True)
                _sftp_replace(sftp, tmp, remote)
            except BaseException:
                _sftp_remove_quietly(sftp, tmp)
                raise

        self._sftp_call(f"push {local.name} -> {remote}", timeout, upload)

    def pull(self, remote: str, local: Path, *, timeout: float) -> None:
        local = Path(local)
        tmp = local.with_name(local.name + ".part")

        def download(sftp: Any) -> None:
            try:
                sftp.get(remote, str(tmp))
                os.replace(tmp, local)
            finally:
                tmp.unlink(missing_ok=True)

        self._sftp_call(f"pull {remote}", timeout, download)

    def read_text(self, remote: str, *, timeout: float) -> str:
        def read(sftp: Any) -> str:
            with sftp.open(remote, "rb") as fh:
                data = fh.read()
            return data.decode("utf-8", errors="replace")

        return self._sftp_call(f"read {remote}", timeout, read)

    def _sftp_client(self, what: str, deadline: float, timeout: float) -> Any:
        with self._lock:
            if self._sftp is None or not self._alive() or self._sftp.get_channel().closed:
                self._sftp = None
                channel = self._open_channel([what.split()[0], what], deadline, timeout)
                try:
                    channel.settimeout(max(deadline - time.monotonic(), 0.1))
                    channel.invoke_subsystem("sftp")
                    self._sftp = paramiko.SFTPClient(channel)
                except Exception as exc:  # noqa: BLE001
                    channel.close()
                    if time.monotonic() >= deadline - 0.05:
                        raise CommandTimeout([what.split()[0], what], timeout, device=self.device) from None
                    raise TransferError(
                        f"{what} failed: no SFTP session ({_reason(exc)}; does the board's "
                        "sshd have `Subsystem sftp`?)",
                        device=self.device,
                    ) from None
            return self._sftp

    def _sftp_call(self, what: str, timeout: float, fn: Callable[[Any], T]) -> T:
        """Run one SFTP operation under a watchdog: past the deadline the connection is torn down
        (blocked paramiko reads then fail at once) and CommandTimeout is raised."""
        check_timeout(timeout, self.device)
        deadline = time.monotonic() + timeout
        sftp = self._sftp_client(what, deadline, timeout)
        remaining = max(deadline - time.monotonic(), 0.1)
        sftp.get_channel().settimeout(remaining)
        client = self._client
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110
                pass

        watchdog = threading.Timer(remaining, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            return fn(sftp)
        except FileNotFoundError:
            raise TransferError(f"{what} failed: no such file", device=self.device) from None
        except PermissionError:
            raise TransferError(f"{what} failed: permission denied", device=self.device) from None
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            if fired.is_set() or isinstance(exc, socket.timeout | TimeoutError):
                self.close()
                raise CommandTimeout([what.split()[0], what], timeout, device=self.device) from None
            if not self._alive():
                self.close()
                raise ConnectionLost(
                    [what.split()[0], what],
                    f"{what} failed: connection to {self.address} lost",
                    device=self.device,
                ) from None
            raise TransferError(f"{what} failed: {_reason(exc)}", device=self.device) from None
        finally:
            watchdog.cancel()
            if fired.is_set():
                with self._lock:
                    self._sftp = None


# ---- host keys ---------------------------------------------------------------------------------------
class _RejectUnknown(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, with a one-line error that says what to check and where to pin it."""

    def __init__(self, transport: SshTransport) -> None:
        self._t = transport

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        spec = self._t.spec
        raise HostKeyError(
            f"host key for {hostname} ({key.get_name()} {fingerprint(key)}) is not in "
            f"{self._t.known_hosts_path}; refusing to connect (verify it and add the line "
            f"'{known_hosts_line(spec.host or hostname, spec.port, key)}', "
            f"or set trust_on_first_use = true in {spec.source})",
            device=self._t.device,
        )


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Descriptor opt-in: accept an unknown key once and append it to the known_hosts file.
    A *changed* key never reaches this policy: paramiko raises BadHostKeyException first."""

    def __init__(self, transport: SshTransport) -> None:
        self._t = transport

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        from filelock import FileLock

        path = self._t.known_hosts_path
        line = known_hosts_line(self._t.spec.host or hostname, self._t.spec.port, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with FileLock(str(path) + ".lock", timeout=10):
                existing = path.read_text() if path.exists() else ""
                if line not in existing.splitlines():
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    with os.fdopen(fd, "a") as fh:
                        if existing and not existing.endswith("\n"):
                            fh.write("\n")
                        fh.write(line + "\n")
        except OSError as exc:
            raise HostKeyError(
                f"trust_on_first_use: cannot record the host key of {hostname} in {path}: {_reason(exc)}",
                device=self._t.device,
            ) from None
        client.get_host_keys().add(hostname, key.get_name(), key)


def _host_entry(host: str | None, port: int) -> str:
    return f"{host}" if port == 22 else f"[{host}]:{port}"


def known_hosts_line(host: str, port: int, key: Any) -> str:
    """The OpenSSH known_hosts line pinning `key` for host:port (`[host]:port` when port != 22)."""
    return f"{_host_entry(host, port)} {key.get_name()} {key.get_base64()}"


def fingerprint(key: Any) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key (what `ssh-keygen -lf` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# ---- helpers ------------------------------------------------------------------------------------------
def split_pid_marker(stderr: str) -> tuple[str, int | None]:
    """Remove the wrapper's pid line from stderr; return (stderr, pid).

    The line is usually first, but a login shell's rc files (sshd runs the user's shell) may print
    before it, so the first line carrying the marker is taken wherever it is.
    """
    start = 0 if stderr.startswith(PID_MARKER) else stderr.find("\n" + PID_MARKER) + 1
    if start == 0 and not stderr.startswith(PID_MARKER):
        return stderr, None
    end = stderr.find("\n", start)
    line = stderr[start:] if end < 0 else stderr[start:end]
    try:
        pid = int(line[len(PID_MARKER) :].strip())
    except ValueError:
        return stderr, None
    return stderr[:start] + ("" if end < 0 else stderr[end + 1 :]), pid


def _kill_tree(transport: Any, pid: int) -> None:
    try:
        kill = transport.open_session(timeout=KILL_TIMEOUT_S)
        kill.exec_command(command_line(["sh", "-c", KILL_TREE, "sh", str(pid)]))
        kill.status_event.wait(KILL_TIMEOUT_S)
        kill.close()
    except Exception:  # noqa: BLE001, S110 - the timeout is what the caller needs to hear about
        pass


def _read_available(channel: Any, out: bytearray, err: bytearray) -> None:
    while channel.recv_ready():
        out += channel.recv(CHUNK)
    while channel.recv_stderr_ready():
        err += channel.recv_stderr(CHUNK)


def _sftp_makedirs(sftp: Any, folder: str) -> None:
    if not folder or folder in ("/", "."):
        return
    try:
        if stat.S_ISDIR(sftp.stat(folder).st_mode):
            return
    except FileNotFoundError:
        pass
    _sftp_makedirs(sftp, posixpath.dirname(folder.rstrip("/")))
    try:
        sftp.mkdir(folder)
    except OSError:
        if not stat.S_ISDIR(sftp.stat(folder).st_mode):  # lost a race with another pusher: fine if a dir
            raise


def _sftp_replace(sftp: Any, tmp: str, remote: str) -> None:
    try:
        sftp.posix_rename(tmp, remote)  # OpenSSH extension: atomic replace
    except OSError:
        _sftp_remove_quietly(sftp, remote)
        sftp.rename(tmp, remote)


def _sftp_remove_quietly(sftp: Any, path: str) -> None:
    try:
        sftp.remove(path)
    except Exception:  # noqa: BLE001, S110 - cleanup of a temp file on a possibly dead link
        pass


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def _unreachable_reason(exc: Any) -> str:
    """paramiko folds every failed socket connect into one error; say which one it was."""
    codes = {getattr(e, "errno", None) for e in exc.errors.values()}
    if codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        return "no route to host (is the board powered, cabled and on this network?)"
    if codes <= {errno.ECONNREFUSED}:
        return "connection refused (is sshd running on that port?)"
    return "; ".join(sorted({_reason(e) for e in exc.errors.values()}))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return one_line(exc) if str(exc) else type(exc).__name__


def _text(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")
