"""SshTransport: Linux boards over ssh (paramiko), key auth only, host keys always verified.

What this module guarantees (each point is a way paramiko setups have hurt labs):

- Host keys are checked against the descriptor's `known_hosts` (default `~/.ssh/known_hosts`), read as
  OpenSSH reads it (`hostkeys`): an unknown key is refused (saying which host, key and file), a changed key
  is always refused, a key marked `@revoked` is refused (even with trust-on-first-use), `@cert-authority`
  lines are accepted in the file and not used. Trust-on-first-use happens only with
  `trust_on_first_use = true` in the descriptor, and then the key is appended to that file.
- Key auth only: the descriptor's `key` (an optional passphrase comes from the environment variable
  EDGEBENCH_SSH_PASSPHRASE), or, without `key`, the ssh-agent and the default ~/.ssh keys. No password auth.
  No key material or passphrase ever appears in an error message.
- Every call has one deadline that holds whatever the board does: connect, banner and auth by
  `connect_timeout`; the session open, the exec and subsystem replies (paramiko waits for those without a
  limit: here the channel is closed at the deadline), the output and every SFTP operation by the call's
  `timeout`. stdout and stderr are drained together (a full window on either stream would stall the
  remote process).
- Nothing is left running on the board: commands run under the guard of `base` (tagged processes, stdin
  lifeline). A timed-out command's channel is closed and its processes are killed and checked gone over a
  new session before CommandTimeout is raised; if the board cannot be reached for that (frozen, cable
  pulled), the kill is retried on the next working connection, and the guard's watchdog kills it on the
  board as soon as sshd hears the channel or connection close. A controller that dies closes its
  connection, which ends its commands the same way (within a second on a reachable board).
- A frozen board or a dead link is found by keepalives that expect replies (OpenSSH's ServerAliveInterval
  and ServerAliveCountMax: the descriptor's `keepalive_interval`, default 10 s, and `keepalive_count_max`,
  default 3): the connection is closed and every call on it ends with ConnectionLost, well within a minute
  and not only at the command timeout.
- Failed pushes leave no temporary file: it is removed at once, or on the next working connection.
- The connection is opened when the transport is made (so errors surface early) and reopened lazily when it
  dropped between calls.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import select
import socket
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from ..descriptors import DeviceSpec
from ..errors import (
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    EdgebenchError,
    HostKeyError,
    TransferError,
    TransportError,
    one_line,
    seconds,
)
from .base import (
    CLEAN_MARK,
    INLINE_COMMAND_MAX,
    REAP_TIMEOUT_S,
    CommandResult,
    Heartbeat,
    Leftovers,
    check_argv,
    check_timeout,
    cleanup_argv,
    command_line,
    guarded_command,
    heartbeat_s,
    new_call_token,
    reap_budget,
    script_file_command,
)
from .hostkeys import KnownHosts, fingerprint, host_entry, known_hosts_line, read_known_hosts

__all__ = ["SshTransport", "fingerprint", "known_hosts_line", "PASSPHRASE_ENV"]

# paramiko logs handshake failures with tracebacks from its transport thread; without a handler they
# would reach stderr through logging's last resort. Our callers get one typed line instead; an
# application that configures logging still receives paramiko's records.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

PASSPHRASE_ENV = "EDGEBENCH_SSH_PASSPHRASE"
KEEPALIVE_REQUEST = "keepalive@openssh.com"  # what OpenSSH's client sends; sshd answers it (with failure)
POLL_S = 0.2
CHUNK = 1 << 16
# A call still stuck this long after its channel was closed at the deadline (a write blocked on a dead
# link) closes the whole connection.
EXPIRY_GRACE_S = 1.0

T = TypeVar("T")


class SshTransport:
    """A board reached over ssh. See the module docstring for what every call guarantees."""

    def __init__(self, spec: DeviceSpec) -> None:
        if not spec.host:
            raise ConfigError(spec.source, 'host: required for transport = "ssh"')
        self.device = spec.name
        self.spec = spec
        self._lock = threading.RLock()
        self._client: Any = None  # paramiko.SSHClient
        self._sftp: Any = None
        self._pkey: Any = None
        self._known: KnownHosts | None = None
        self._keepalive: _Keepalive | None = None
        self._silent: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._leftovers = Leftovers()
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
                self._keepalive = _Keepalive(
                    self._client.get_transport(),
                    self.spec.keepalive_interval_s,
                    self.spec.keepalive_count_max,
                    self._keepalive_lost,
                )

    def _alive(self) -> bool:
        transport = self._client.get_transport() if self._client is not None else None
        return bool(transport is not None and transport.is_active())

    def _transport(self, timeout: float) -> Any:
        """The live paramiko Transport, reconnecting if the connection dropped since the last call."""
        self.connect(timeout)
        return self._client.get_transport()

    def _keepalive_lost(self, transport: Any, silent_s: float) -> None:
        """Keepalives went unanswered: close that connection, so every call on it ends now, and say why."""
        self._silent[transport] = (
            f"no answer to keepalives for {seconds(round(silent_s))} s: the board hung or the link is down"
        )
        try:
            transport.close()
        except Exception:  # noqa: BLE001 - closing a dead link may fail; it is closed either way
            pass

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
            self.refuse_revoked(exc.key)
            raise HostKeyError(
                f"host key for {host_entry(spec.host, spec.port)} CHANGED: the board offers "
                f"{exc.key.get_name()} {fingerprint(exc.key)} but {self.known_hosts_path} pins "
                f"{fingerprint(exc.expected_key)}; refusing to connect (if the board was reinstalled, "
                f"remove its old line from that file)",
                device=self.device,
            ) from None
        except BaseException as exc:  # noqa: BLE001 - every failure becomes one typed line
            client.close()
            raise self._connect_error(exc, limit, started) from None
        return client

    def _load_known_hosts(self, client: Any) -> None:
        path = self.known_hosts_path
        if not path.exists():
            if self.spec.trust_on_first_use:
                self._known = KnownHosts(path)
                return
            raise HostKeyError(
                f"known_hosts file {path} does not exist, so the host key of {self.address} cannot be "
                f"verified (pin it there, or set trust_on_first_use = true in {self.spec.source})",
                device=self.device,
            )
        try:
            self._known = read_known_hosts(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise HostKeyError(
                f"cannot read known_hosts file {path}: {_reason(exc)}", device=self.device
            ) from None
        self._known.install(client.get_host_keys())

    def refuse_revoked(self, key: Any) -> None:
        """HostKeyError if the known_hosts file marks this key @revoked."""
        entry = self._known.revocation(key) if self._known is not None else None
        if entry is not None:
            raise HostKeyError(
                f"host key of {self.address} ({key.get_name()} {fingerprint(key)}) is marked @revoked in "
                f"{self.known_hosts_path} line {entry.line}; refusing to connect",
                device=self.device,
            )

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
        if self._keepalive is not None:
            self._keepalive.stop()
            self._keepalive = None
        for thing in (self._sftp, self._client):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # noqa: BLE001 - closing a dead connection may fail; nothing to do
                    pass
        self._sftp = None
        self._client = None

    def close(self) -> None:
        """Disconnect; first, if the board answers, kill what failed calls left behind."""
        with self._lock:
            if self._leftovers and self._alive():
                self._clean_leftovers(time.monotonic() + REAP_TIMEOUT_S)
            self._close_quietly()

    # ---- leftovers ------------------------------------------------------------------------------
    def _clean_leftovers(self, deadline: float) -> None:
        """Kill the processes of earlier failed calls and remove their temp files, within a short bound
        (taken from the call's own budget); what cannot be cleaned now is kept for the next connection."""
        if not self._leftovers or not self._alive():
            return
        calls, files = self._leftovers.take()
        limit = min(REAP_TIMEOUT_S, (deadline - time.monotonic()) / 3)
        try:
            if limit > 0.05:
                argv = tuple(cleanup_argv(calls, files))
                res = self._run_command(argv, command_line(argv), time.monotonic() + limit, limit, None)
                if CLEAN_MARK in res.stdout:
                    return
        except EdgebenchError:
            pass
        self._leftovers.give_back(calls, files)

    # ---- commands -------------------------------------------------------------------------------
    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run argv on the board under the guard; stdout and stderr drained together; bounded by `timeout`."""
        argv_t = check_argv(argv)
        check_timeout(timeout, self.device)
        start = time.monotonic()
        deadline = start + timeout
        self.connect(deadline - start)
        self._clean_leftovers(deadline)
        token = new_call_token()
        line = guarded_command(argv_t, env, token, heartbeat_s(self.spec))
        if len(line.encode()) <= INLINE_COMMAND_MAX:
            return self._run_command(argv_t, line, deadline, timeout, token, start)
        # Too long to send inline: a script on the board that removes itself when it starts.
        script = posixpath.join(self.spec.workdir, f".edgebench-cmd-{token}.sh")
        text, short = script_file_command(line, script)
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "cmd.sh").write_text(text)
            self.push(Path(folder) / "cmd.sh", script, timeout=max(deadline - time.monotonic(), 0.1))
        try:
            return self._run_command(argv_t, short, deadline, timeout, token, start)
        except TransportError:
            self._leftovers.add(file=script)  # it may never have started (and removed itself)
            raise

    def _run_command(
        self,
        argv: tuple[str, ...],
        command: str,
        deadline: float,
        timeout: float,
        token: str | None,
        start: float | None = None,
    ) -> CommandResult:
        start = time.monotonic() if start is None else start
        channel = self._open_channel(argv, deadline, timeout)
        out, err = bytearray(), bytearray()
        try:
            self._exec(channel, argv, command, deadline, timeout, token)
            status = self._drain(channel, argv, deadline, out, err, timeout, token)
        finally:
            channel.close()
        return CommandResult(argv, status, _text(out), _text(err), time.monotonic() - start)

    def _open_channel(self, argv: Sequence[str], deadline: float, timeout: float) -> Any:
        """A new session channel before `deadline`; one reconnect if the link died since the last call."""
        for attempt in (1, 2):
            transport = self._transport(deadline - time.monotonic())
            limit = max(deadline - time.monotonic(), 0.1)
            try:
                return transport.open_session(timeout=limit)
            except Exception as exc:  # noqa: BLE001
                if transport.is_active() and time.monotonic() >= deadline - 0.05:
                    raise CommandTimeout(
                        argv, timeout, device=self.device, detail="the board did not open a session"
                    ) from None
                # The connection may have died just now; nothing ran yet, so one reconnect is safe.
                if attempt == 2 or transport.is_active():
                    raise TransportError(
                        f"cannot open a session for {argv[0]}: {self._why_lost(transport) or _reason(exc)}",
                        device=self.device,
                    ) from None
        raise AssertionError("unreachable")

    def _exec(
        self,
        channel: Any,
        argv: tuple[str, ...],
        command: str,
        deadline: float,
        timeout: float,
        token: str | None,
    ) -> None:
        """Send the exec request and wait for its reply, no longer than the deadline."""
        with _Expiry(deadline, channel, grace_close=channel.get_transport()) as expiry:
            try:
                channel.exec_command(command)
                return
            except Exception as exc:  # noqa: BLE001 - becomes one typed error below
                failure = exc
        channel.close()
        if token:
            # Unanswered or lost: the board may still start the command once it catches up.
            self._leftovers.add(call=token)
        if expiry.fired:
            if token:
                self._clean_leftovers(time.monotonic() + 3 * reap_budget(timeout))
            raise CommandTimeout(
                argv, timeout, device=self.device, detail="the board did not answer the exec request"
            )
        if not self._alive():
            raise self._lost(argv, bytearray(), bytearray(), channel)
        raise TransportError(
            f"the board refused to run {argv[0]} ({_reason(failure)})", device=self.device
        ) from None

    def _drain(
        self,
        channel: Any,
        argv: tuple[str, ...],
        deadline: float,
        out: bytearray,
        err: bytearray,
        timeout: float,
        token: str | None,
    ) -> int:
        """Read both streams until the command exits; raise typed errors on timeout or a lost link.

        OpenSSH sends data, EOF, exit-status, CLOSE; exit-status can come before the last data, so a
        command is finished only once EOF has arrived too. Meanwhile a line goes to the guard every
        keepalive interval: the controller's heartbeat (see `base.GUARD_SCRIPT`).
        """
        beat = Heartbeat(self.spec.keepalive_interval_s)
        while True:
            beat.send_when_due(channel.sendall)
            _read_available(channel, out, err)
            if channel.eof_received and channel.exit_status_ready():
                _read_available(channel, out, err)
                if channel.exit_status == -1:  # no exit-status: the session itself was killed
                    if token:
                        self._leftovers.add(call=token)
                    if not self._alive():
                        raise self._lost(argv, out, err, channel)
                    raise ConnectionLost(
                        argv,
                        f"the session running {argv[0]} ended without an exit status (killed on the board)",
                        device=self.device,
                        stdout=_text(out),
                        stderr=_text(err),
                    )
                return int(channel.exit_status)
            if channel.closed or not self._alive():
                _read_available(channel, out, err)
                if channel.exit_status != -1:
                    return int(channel.exit_status)
                if token:
                    self._leftovers.add(call=token)  # the link may be down with the command still running
                raise self._lost(argv, out, err, channel)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                channel.close()  # the guard's lifeline: the board kills the call as soon as it hears this
                if token:
                    self._leftovers.add(call=token)
                    self._clean_leftovers(time.monotonic() + 3 * reap_budget(timeout))
                raise CommandTimeout(argv, timeout, device=self.device, output=_text(out)[-2000:])
            if channel.eof_received:
                channel.status_event.wait(min(POLL_S, remaining))  # only the exit status is still due
            else:
                select.select([channel], [], [], min(POLL_S, remaining))

    def _why_lost(self, transport: Any) -> str | None:
        return self._silent.get(transport) if transport is not None else None

    def _lost(self, argv: tuple[str, ...], out: bytearray, err: bytearray, channel: Any) -> ConnectionLost:
        why = self._why_lost(channel.get_transport())
        return ConnectionLost(
            argv,
            f"connection to {self.address} lost while running {argv[0]}" + (f" ({why})" if why else ""),
            device=self.device,
            stdout=_text(out),
            stderr=_text(err),
        )

    # ---- files ----------------------------------------------------------------------------------
    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        """Upload to a temporary name, then rename over `remote`: a half-written file never has the name,
        and a failed upload's temporary file is removed (now, or by the next working connection)."""
        local = Path(local)
        if not local.is_file():
            raise TransferError(f"push {local}: no such local file", device=self.device)
        tmp = f"{remote}.part-{new_call_token()}"

        def upload(sftp: Any) -> None:
            _sftp_makedirs(sftp, posixpath.dirname(remote))
            try:
                with open(local, "rb") as fh:
                    sftp.putfo(fh, tmp, file_size=local.stat().st_size, confirm=True)
                _sftp_replace(sftp, tmp, remote)
            except BaseException:
                if not _sftp_remove(sftp, tmp):
                    self._leftovers.add(file=tmp)
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

    def _sftp_client(self, argv: tuple[str, ...], deadline: float, timeout: float) -> Any:
        """The SFTP session (opened once per connection); the subsystem reply is awaited no longer than
        the deadline."""
        with self._lock:
            if self._sftp is not None and self._alive() and not self._sftp.get_channel().closed:
                return self._sftp
            self._sftp = None
            channel = self._open_channel(argv, deadline, timeout)
            with _Expiry(deadline, channel) as expiry:
                try:
                    channel.settimeout(max(deadline - time.monotonic(), 0.1))
                    channel.invoke_subsystem("sftp")
                    self._sftp = paramiko.SFTPClient(channel)
                    return self._sftp
                except Exception as exc:  # noqa: BLE001 - becomes one typed error below
                    failure = exc
            channel.close()
            if expiry.fired or isinstance(failure, socket.timeout | TimeoutError):
                raise CommandTimeout(
                    argv, timeout, device=self.device, detail="the board did not answer the SFTP request"
                )
            if not self._alive():
                raise self._lost(argv, bytearray(), bytearray(), channel)
            raise TransferError(
                f"{argv[1]} failed: no SFTP session ({_reason(failure)}; does the board's "
                "sshd have `Subsystem sftp`?)",
                device=self.device,
            )

    def _sftp_call(self, what: str, timeout: float, fn: Callable[[Any], T]) -> T:
        """Run one SFTP operation before its deadline: at the deadline its channel is closed (blocked
        paramiko reads and writes then fail at once; the connection goes too if that is not enough)."""
        argv = (what.split()[0], what)
        check_timeout(timeout, self.device)
        deadline = time.monotonic() + timeout
        self.connect(timeout)
        self._clean_leftovers(deadline)
        sftp = self._sftp_client(argv, deadline, timeout)
        channel = sftp.get_channel()
        channel.settimeout(max(deadline - time.monotonic(), 0.1))
        expiry = _Expiry(deadline, channel, grace_close=channel.get_transport())
        try:
            with expiry:
                return fn(sftp)
        except FileNotFoundError:
            raise TransferError(f"{what} failed: no such file", device=self.device) from None
        except PermissionError:
            raise TransferError(f"{what} failed: permission denied", device=self.device) from None
        except Exception as exc:  # noqa: BLE001 - every other failure becomes a typed transfer error
            if expiry.fired or isinstance(exc, socket.timeout | TimeoutError):
                raise CommandTimeout(argv, timeout, device=self.device) from None
            if not self._alive():
                why = self._why_lost(channel.get_transport())
                raise ConnectionLost(
                    argv,
                    f"{what} failed: connection to {self.address} lost" + (f" ({why})" if why else ""),
                    device=self.device,
                ) from None
            raise TransferError(f"{what} failed: {_reason(exc)}", device=self.device) from None
        finally:
            if expiry.fired:
                with self._lock:
                    if self._sftp is sftp:
                        self._sftp = None


class _Expiry:
    """A deadline over paramiko waits that have none (exec and subsystem replies, SFTP transfers): at the
    deadline the channel is closed, which wakes whatever waits on it; if the call is still stuck a grace
    period later (a write blocked on a dead link), `grace_close` (the connection) is closed as well."""

    def __init__(self, deadline: float, channel: Any, grace_close: Any = None) -> None:
        self._channel = channel
        self._grace_close = grace_close
        self._done = threading.Event()
        self._fired = threading.Event()
        delay = max(0.0, deadline - time.monotonic())
        self._timers = [threading.Timer(delay, self._expire)]
        if grace_close is not None:
            self._timers.append(threading.Timer(delay + EXPIRY_GRACE_S, self._give_up))
        for timer in self._timers:
            timer.daemon = True

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def __enter__(self) -> _Expiry:
        for timer in self._timers:
            timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for timer in self._timers:
            timer.cancel()

    def _expire(self) -> None:
        if self._done.is_set():
            return
        self._fired.set()
        try:
            self._channel.close()
        except Exception:  # noqa: BLE001 - a channel on a dead link may fail to close cleanly
            pass

    def _give_up(self) -> None:
        if not self._done.is_set():
            try:
                self._grace_close.close()
            except Exception:  # noqa: BLE001
                pass


class _Keepalive:
    """OpenSSH's ServerAliveInterval / ServerAliveCountMax: every `interval` seconds a request that wants a
    reply; one left unanswered for `count_max` intervals calls `lost(transport, silent_s)`.

    One request is outstanding at a time (paramiko's global_request waits on one shared event), each in a
    short-lived daemon thread that returns when the reply comes or the connection closes."""

    def __init__(
        self, transport: Any, interval: float, count_max: int, lost: Callable[[Any, float], None]
    ) -> None:
        self._transport = transport
        self.interval = interval
        self.count_max = count_max
        self._lost = lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edgebench-ssh-keepalive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        answered: threading.Event | None = None
        sent = 0.0
        while not self._stop.wait(self.interval):
            if not self._transport.is_active():
                return
            now = time.monotonic()
            if answered is None or answered.is_set():
                answered, sent = self._ask(), now
            elif now - sent >= self.interval * self.count_max - 1e-3:
                self._lost(self._transport, now - sent)
                return

    def _ask(self) -> threading.Event:
        answered = threading.Event()

        def ask() -> None:
            try:
                self._transport.global_request(KEEPALIVE_REQUEST, wait=True)
            except Exception:  # noqa: BLE001 - a failing connection is found by the loop
                pass
            answered.set()

        threading.Thread(target=ask, name="edgebench-ssh-keepalive-ask", daemon=True).start()
        return answered


# ---- host keys ---------------------------------------------------------------------------------------
class _RejectUnknown(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, with a one-line error that says what to check and where to pin it."""

    def __init__(self, transport: SshTransport) -> None:
        self._t = transport

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        self._t.refuse_revoked(key)
        spec = self._t.spec
        known = self._t._known
        note = (
            " (its @cert-authority lines are not used: edgebench pins host keys)"
            if known is not None and known.cert_authority_lines
            else ""
        )
        raise HostKeyError(
            f"host key for {hostname} ({key.get_name()} {fingerprint(key)}) is not in "
            f"{self._t.known_hosts_path}{note}; refusing to connect (verify it and add the line "
            f"'{known_hosts_line(spec.host or hostname, spec.port, key)}', "
            f"or set trust_on_first_use = true in {spec.source})",
            device=self._t.device,
        )


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Descriptor opt-in: accept an unknown key once and append it to the known_hosts file.
    A *changed* key never reaches this policy: paramiko raises BadHostKeyException first; a revoked key is
    refused here."""

    def __init__(self, transport: SshTransport) -> None:
        self._t = transport

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        from filelock import FileLock

        self._t.refuse_revoked(key)
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


# ---- helpers ------------------------------------------------------------------------------------------
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
        _sftp_remove(sftp, remote)
        sftp.rename(tmp, remote)


def _sftp_remove(sftp: Any, path: str) -> bool:
    """Remove a file; True when it is gone (or was never there), False when the link could not tell."""
    try:
        sftp.remove(path)
    except FileNotFoundError:
        return True
    except Exception:  # noqa: BLE001 - cleanup of a temp file on a possibly dead link
        return False
    return True


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
