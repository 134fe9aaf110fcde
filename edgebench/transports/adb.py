"""AdbTransport: a phone through the adb server (adbutils for the server protocol), every call bounded.

The adb server is the descriptor's `adb_server` ("host:port"), else ANDROID_ADB_SERVER_PORT on
127.0.0.1, else 127.0.0.1:5037; it is never started implicitly (adbutils would otherwise spawn one).

Why not adbutils' own shell/sync helpers: plain `shell(timeout=...)` can block for its 600 s socket
default on a frozen device, `sync.*` has no timeout at all, and a device killed mid-command makes
plain `shell` return partial output as if it had finished. So this transport opens the service
itself and reads the wire protocol under a watchdog: each call has one deadline; a timer shuts the
socket down when it passes, so nothing blocks beyond it whatever the device does. Exit codes come
from shell protocol v2 when the device offers `shell_v2`, otherwise from a unique marker echoed
after the command (a missing marker means the connection was lost, not that the command finished).
Failures become typed errors carrying the device and argv: CommandTimeout, ConnectionLost,
TransferError, TransportError.

What a real adbd does when the host closes a shell stream (AOSP packages/modules/adb, daemon
shell_service.cpp): with the shell protocol it sends SIGHUP to the shell's pid only and closes the
shell's sockets; without it the shell runs on a PTY whose hangup signals the shell's session. Children
that do not die of that (forked by `sh -c`, ignoring SIGHUP, in another group) keep running. So commands
run under the guard of `base`: the command's stdin is /dev/null, the stream's stdin stays open as the
controller's lifeline, and when it closes (a timeout here, or this controller dying) the guard's watchdog
kills every process of the call on the phone. After a timeout the call's processes are also killed and
checked gone over a new stream before CommandTimeout is raised (or, if the phone does not answer, on the
next call that reaches it). A long call is watched by probes that want the device's answer (a `sync:`
stream it must accept) every `keepalive_interval` seconds; `keepalive_count_max` missed in a row end the
call with ConnectionLost instead of its own timeout. Pushes write a temporary name and rename it, so a
failed push never leaves a truncated file under the real name; command lines beyond what one service
request carries (64 KiB) are pushed as a script that removes itself.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import secrets
import socket
import stat
import struct
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from adbutils import AdbClient, AdbConnection
from adbutils.errors import AdbError

from ..descriptors import DeviceSpec
from ..errors import (
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    EdgebenchError,
    TransferError,
    TransportError,
    seconds,
)
from .base import (
    CLEAN_MARK,
    INLINE_COMMAND_MAX,
    REAP_TIMEOUT_S,
    CommandResult,
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
    validate_env,
)

DEFAULT_SERVER_PORT = 5037
SERVER_PORT_ENV = "ANDROID_ADB_SERVER_PORT"
SYNC_DATA_MAX = 64 * 1024
_SHELL_HEADER = struct.Struct("<BI")
_SYNC_HEADER = struct.Struct("<4sI")
_STDIN, _STDOUT, _STDERR, _EXIT = 0, 1, 2, 3
_WIRE_ERRORS = (AdbError, OSError, EOFError, ValueError, struct.error)


def server_address(spec: DeviceSpec, environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(host, port) of the adb server for this device: descriptor, then environment, then 5037."""
    environ = os.environ if environ is None else environ
    if spec.adb_server:
        host, sep, port_text = spec.adb_server.rpartition(":")
        if not sep:
            host, port_text = "127.0.0.1", spec.adb_server
        port = _port(port_text)
        if port is None:
            raise ConfigError(spec.source, f'adb_server: expected "host:port", got {spec.adb_server!r}')
        return host.strip("[]") or "127.0.0.1", port
    env_port = environ.get(SERVER_PORT_ENV)
    if env_port:
        port = _port(env_port)
        if port is None:
            raise TransportError(f"{SERVER_PORT_ENV}={env_port!r} is not a port number", device=spec.name)
        return "127.0.0.1", port
    return "127.0.0.1", DEFAULT_SERVER_PORT


def _port(text: str) -> int | None:
    try:
        port = int(text)
    except ValueError:
        return None
    return port if 0 < port < 65536 else None


class _NoSpawnConnection(AdbConnection):
    """An adb server connection that fails instead of running `adb start-server` (adbutils' default),
    and whose connect is bounded by the caller's deadline."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._address = (host, port)
        self._connect_timeout = timeout
        super().__init__(host, port)

    def _safe_connect(self) -> socket.socket:
        try:
            return socket.create_connection(self._address, timeout=self._connect_timeout)
        except OSError as exc:
            raise AdbError(_describe(exc)) from None

    def drop(self) -> None:
        """Close at once (adbutils' close() sleeps 10 ms after a half-close)."""
        with contextlib.suppress(AdbError, OSError):
            self.conn.close()


class _ServerClient(AdbClient):
    def make_connection(self, timeout: float | None = None) -> _NoSpawnConnection:
        conn = _NoSpawnConnection(self.host, self.port, timeout or 10.0)
        conn.conn.settimeout(timeout)
        return conn


class _Watchdog:
    """One deadline for a whole call: at the deadline the socket is shut down, so any blocked
    send/recv returns at once; `fired` then tells the caller it was a timeout, not a device fault."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.fired = False
        self.lost: str | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, timeout), self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        return max(0.001, self.deadline - time.monotonic())

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shutdown()
        sock.settimeout(self.remaining())

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shutdown()

    def lose(self, reason: str) -> None:
        """The device stopped answering (found by probes): end the call now as a lost connection."""
        with self._lock:
            self.lost = reason
            self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)


class _Output:
    """Bytes received so far, kept so a timeout or a lost device can report partial output."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()

    def text(self, which: bytearray) -> str:
        return bytes(which).decode("utf-8", errors="replace")


class _Liveness:
    """While a long call runs, ask the device for an answer every `keepalive_interval` seconds (as ssh's
    ServerAliveInterval does); `keepalive_count_max` unanswered in a row end the call as a lost connection.
    The adb server answers for a frozen device as if it were fine, so the probe opens a stream the device
    itself must accept. Calls too short to be worth probing run without it."""

    def __init__(self, transport: AdbTransport, wd: _Watchdog) -> None:
        self._transport = transport
        self._wd = wd
        self.interval = transport.spec.keepalive_interval_s
        self.count_max = transport.spec.keepalive_count_max
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Liveness:
        if self._wd.timeout > self.interval * self.count_max:
            self._thread = threading.Thread(target=self._loop, name="edgebench-adb-liveness", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _loop(self) -> None:
        missed, began = 0, time.monotonic()
        wait = self.interval
        while not self._stop.wait(wait):
            asked = time.monotonic()
            if self._transport.alive(timeout=self.interval):
                missed, began = 0, time.monotonic()
            else:
                missed += 1
            if self._stop.is_set():
                return
            if missed >= self.count_max:
                silent = seconds(round(time.monotonic() - began))
                self._wd.lose(f"the device answered no probe for {silent} s: it hung or its link is down")
                return
            wait = max(0.0, self.interval - (time.monotonic() - asked))


class AdbTransport:
    """Commands, pushes and pulls on one adb device (by serial), each bounded by its timeout."""

    def __init__(self, spec: DeviceSpec) -> None:
        if not spec.serial:
            raise ConfigError(spec.source, 'serial: required for transport = "adb"')
        self.device = spec.name
        self.spec = spec
        self.serial = spec.serial
        self.host, self.port = server_address(spec)
        self._client = _ServerClient(self.host, self.port)
        self._features: frozenset[str] | None = None
        self._leftovers = Leftovers()

    # ---- Transport protocol ---------------------------------------------------------------------
    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run argv on the device under the guard and return its real exit code."""
        check_timeout(timeout, self.device)
        argv_t = check_argv(argv)
        token = new_call_token()
        validate_env(env)
        script: str | None = None
        out = _Output()
        start = time.monotonic()
        try:
            with _Watchdog(timeout) as wd, self._failures(argv_t, wd, out), _Liveness(self, wd):
                self._clean_leftovers(min(REAP_TIMEOUT_S, wd.remaining() / 3))
                # The heartbeat needs the shell protocol's stdin packets (without it stdin is a terminal).
                beat = self.spec.keepalive_interval_s if "shell_v2" in self._device_features(wd) else 0.0
                line = guarded_command(argv_t, env, token, heartbeat_s(self.spec) if beat else 0.0)
                if len(line.encode()) > INLINE_COMMAND_MAX:
                    script = posixpath.join(self.spec.workdir, f".edgebench-cmd-{token}.sh")
                    line = self._as_script(line, script, wd)
                code = self._shell(line, wd, out, beat)
        except (CommandTimeout, ConnectionLost) as exc:
            # The call may live on on the device: kill it now if the device answers, else on the next call.
            self._leftovers.add(call=token, file=script)
            if isinstance(exc, CommandTimeout):
                self._clean_leftovers(reap_budget(timeout))
            raise
        return CommandResult(
            argv_t, code, out.text(out.stdout), out.text(out.stderr), time.monotonic() - start
        )

    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        """Send a host file to the device path (parents created), with the local file's mode. The bytes go
        to a temporary name renamed over `remote` once complete; a failed push leaves neither."""
        check_timeout(timeout, self.device)
        argv = ("push", str(local), remote)
        try:
            st = local.stat()
            source = local.open("rb")
        except OSError as exc:
            raise TransferError(f"push {local}: {exc.strerror}", device=self.device) from None
        tmp = f"{remote}.part-{new_call_token()}"
        try:
            with source, _Watchdog(timeout) as wd, self._failures(argv, wd, _Output(), transfer=True):
                self._clean_leftovers(min(REAP_TIMEOUT_S, wd.remaining() / 3))
                mode = stat.S_IFREG | stat.S_IMODE(st.st_mode)
                self._sync_send(source, tmp, mode, int(st.st_mtime), wd)
                code, _, err = self._exec_plain(["mv", "-f", tmp, remote], wd)
                if code != 0:
                    raise TransferError(
                        f"push {remote}: cannot rename the pushed file into place ({err.strip() or code})",
                        device=self.device,
                    )
        except EdgebenchError as exc:
            self._leftovers.add(file=tmp)
            if not isinstance(exc, ConnectionLost):
                self._clean_leftovers(reap_budget(timeout))
            raise

    def pull(self, remote: str, local: Path, *, timeout: float) -> None:
        """Fetch a device file to a host path; the host file appears only when complete."""
        check_timeout(timeout, self.device)
        partial = local.with_name(local.name + ".part")
        argv = ("pull", remote, str(local))
        try:
            with (
                partial.open("wb") as sink,
                _Watchdog(timeout) as wd,
                self._failures(argv, wd, _Output(), transfer=True),
            ):
                self._clean_leftovers(min(REAP_TIMEOUT_S, wd.remaining() / 3))
                with contextlib.closing(self._sync_recv(remote, wd)) as blocks:
                    for block in blocks:
                        sink.write(block)
            os.replace(partial, local)
        except OSError as exc:
            raise TransferError(f"pull {remote} -> {local}: {exc.strerror}", device=self.device) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()

    def read_text(self, remote: str, *, timeout: float) -> str:
        """A small device file as text (sysfs, /proc, results)."""
        check_timeout(timeout, self.device)
        argv = ("read", remote)
        data = bytearray()
        with _Watchdog(timeout) as wd, self._failures(argv, wd, _Output(), transfer=True):
            self._clean_leftovers(min(REAP_TIMEOUT_S, wd.remaining() / 3))
            with contextlib.closing(self._sync_recv(remote, wd)) as blocks:
                for block in blocks:
                    data += block
        return bytes(data).decode("utf-8", errors="replace")

    def close(self) -> None:
        """Every call opens (and closes) its own server connection; what failed calls left on the device
        is cleaned up now if it answers (within a second)."""
        self._clean_leftovers(reap_budget(REAP_TIMEOUT_S))

    # ---- device facts -----------------------------------------------------------------------------
    def features(self, *, timeout: float) -> frozenset[str]:
        """The features the device announced (shell_v2, stat_v2, ...), as the adb server reports them."""
        with _Watchdog(timeout) as wd, self._failures(("features",), wd, _Output()):
            return self._device_features(wd)

    def state(self, *, timeout: float) -> str:
        """device | offline | unauthorized | ... as the adb server sees this serial."""
        with _Watchdog(timeout) as wd, self._failures(("get-state",), wd, _Output()):
            return self._host_query(f"host-serial:{self.serial}:get-state", wd)

    def alive(self, *, timeout: float) -> bool:
        """True when the device itself answers now (it accepts a `sync:` stream within `timeout`)."""
        try:
            with _Watchdog(timeout) as wd:
                conn = self._open_service("sync:", wd)
                with contextlib.suppress(OSError):
                    conn.conn.sendall(_SYNC_HEADER.pack(b"QUIT", 0))
                conn.drop()
                return not wd.fired
        except (EdgebenchError, *_WIRE_ERRORS):
            return False

    # ---- plumbing ---------------------------------------------------------------------------------
    def _shell(self, line: str, wd: _Watchdog, out: _Output, heartbeat: float = 0.0) -> int:
        if "shell_v2" in self._device_features(wd):
            return self._shell_v2(line, wd, out, heartbeat)
        return self._shell_marker(line, wd, out)

    def _exec_plain(self, argv: Sequence[str], wd: _Watchdog) -> tuple[int, str, str]:
        """A short helper command (no guard) inside a call: (exit code, stdout, stderr)."""
        out = _Output()
        code = self._shell(command_line(argv), wd, out)
        return code, out.text(out.stdout), out.text(out.stderr)

    def _as_script(self, line: str, path: str, wd: _Watchdog) -> str:
        text, short = script_file_command(line, path)
        self._sync_send(io.BytesIO(text.encode()), path, stat.S_IFREG | 0o600, int(time.time()), wd)
        return short

    def _clean_leftovers(self, limit: float) -> None:
        """Kill the processes of earlier failed calls and remove their temporary files, within `limit`
        seconds; what cannot be cleaned now stays for the next call."""
        if not self._leftovers or limit <= 0.05:
            return
        calls, files = self._leftovers.take()
        try:
            with _Watchdog(limit) as wd:
                _, stdout, _ = self._exec_plain(cleanup_argv(calls, files), wd)
            if CLEAN_MARK in stdout:
                return
        except (EdgebenchError, *_WIRE_ERRORS):
            pass
        self._leftovers.give_back(calls, files)

    @contextlib.contextmanager
    def _failures(
        self, argv: Sequence[str], wd: _Watchdog, out: _Output, *, transfer: bool = False
    ) -> Iterator[None]:
        """Turn whatever a broken, frozen or vanished device causes into one typed error."""
        what = argv[0] if argv else "call"
        try:
            yield
        except EdgebenchError:
            if wd.lost:
                raise self._lost(argv, what, wd.lost, out) from None
            if wd.fired:
                raise CommandTimeout(
                    argv, wd.timeout, device=self.device, output=out.text(out.stdout)
                ) from None
            raise
        except _WIRE_ERRORS as exc:
            if wd.lost:
                raise self._lost(argv, what, wd.lost, out) from None
            if wd.fired or isinstance(exc, (socket.timeout, TimeoutError)):
                raise CommandTimeout(
                    argv, wd.timeout, device=self.device, output=out.text(out.stdout)
                ) from None
            detail = _describe(exc)
            if transfer:
                raise TransferError(
                    f"{argv[0]} {' '.join(argv[1:])}: connection to the device lost ({detail})",
                    device=self.device,
                ) from None
            raise self._lost(argv, what, detail, out) from None

    def _lost(self, argv: Sequence[str], what: str, detail: str, out: _Output) -> ConnectionLost:
        return ConnectionLost(
            argv,
            f"connection to the device lost during {what} ({detail})",
            device=self.device,
            stdout=out.text(out.stdout),
            stderr=out.text(out.stderr),
        )

    def _connect_server(self, wd: _Watchdog) -> _NoSpawnConnection:
        try:
            conn = self._client.make_connection(timeout=wd.remaining())
        except AdbError as exc:
            raise TransportError(
                f"adb server {self.host}:{self.port} is not reachable ({_describe(exc)})", device=self.device
            ) from None
        wd.attach(conn.conn)
        return conn

    def _host_query(self, request: str, wd: _Watchdog) -> str:
        conn = self._connect_server(wd)
        try:
            conn.send_command(request)
            self._check_okay(conn, request)
            return conn.read_string_block()
        finally:
            conn.drop()

    def _device_features(self, wd: _Watchdog) -> frozenset[str]:
        if self._features is None:
            text = self._host_query(f"host-serial:{self.serial}:features", wd)
            self._features = frozenset(f for f in text.strip().split(",") if f)
        return self._features

    def _open_service(self, service: str, wd: _Watchdog) -> _NoSpawnConnection:
        """A server connection switched to this device with `service` opened on it."""
        conn = self._connect_server(wd)
        try:
            conn.send_command(f"host:transport:{self.serial}")
            self._check_okay(conn, "transport")
            conn.send_command(service)
            self._check_okay(conn, service.split(":", 1)[0], opening=True)
        except BaseException:
            conn.drop()
            raise
        return conn

    def _check_okay(self, conn: AdbConnection, what: str, *, opening: bool = False) -> None:
        status = _recv_exact(conn.conn, 4)
        if status == b"OKAY":
            return
        if status == b"FAIL":
            message = conn.read_string_block().strip()
            if opening and message == "closed":
                # The device closed the stream it was asked to open: it went away (or refused).
                raise EOFError(f"the device closed the {what} service as it opened")
            raise TransportError(
                f"adb server {self.host}:{self.port} refused {what} for {self.serial}: {message}",
                device=self.device,
            )
        raise AdbError(f"unexpected adb server reply {status!r}")

    def _shell_v2(self, line: str, wd: _Watchdog, out: _Output, heartbeat: float = 0.0) -> int:
        conn = self._open_service(f"shell,v2,raw:{line}", wd)
        stop = threading.Event()
        try:
            sock = conn.conn
            if heartbeat > 0:
                # The controller's heartbeat, as stdin packets to the guard (see base.GUARD_SCRIPT).
                beat = _SHELL_HEADER.pack(_STDIN, 1) + b"\n"
                threading.Thread(target=_beat, args=(sock, beat, heartbeat, stop), daemon=True).start()
            while True:
                kind, length = _SHELL_HEADER.unpack(_recv_exact(sock, _SHELL_HEADER.size))
                data = _recv_exact(sock, length) if length else b""
                if kind == _STDOUT:
                    out.stdout += data
                elif kind == _STDERR:
                    out.stderr += data
                elif kind == _EXIT:
                    return data[0] if data else 255
        finally:
            stop.set()
            conn.drop()

    def _shell_marker(self, line: str, wd: _Watchdog, out: _Output) -> int:
        # No shell protocol: stdout and stderr arrive merged, and the exit status only through a
        # marker the device prints after the command. A random token cannot be forged by output.
        marker = f"__edgebench_rc_{secrets.token_hex(8)}__"
        conn = self._open_service(f"shell:{line}; echo {marker}$?", wd)
        try:
            while chunk := conn.conn.recv(65536):
                out.stdout += chunk
        finally:
            conn.drop()
        data = bytes(out.stdout)
        index = data.rfind(marker.encode())
        tail = data[index + len(marker) :].strip() if index >= 0 else b""
        if index < 0 or not tail.isdigit():
            raise EOFError("the command's output ended before its exit status")
        out.stdout[:] = data[:index]
        return int(tail)

    def _sync_send(self, source: BinaryIO, remote: str, mode: int, mtime: int, wd: _Watchdog) -> None:
        conn = self._open_service("sync:", wd)
        try:
            sock = conn.conn
            spec = f"{remote},{mode}".encode()
            try:
                sock.sendall(_SYNC_HEADER.pack(b"SEND", len(spec)) + spec)
                while block := source.read(SYNC_DATA_MAX):
                    sock.sendall(_SYNC_HEADER.pack(b"DATA", len(block)) + block)
                sock.sendall(_SYNC_HEADER.pack(b"DONE", mtime & 0xFFFFFFFF))
            except (BrokenPipeError, ConnectionResetError):
                # The device may have refused the file and closed: its FAIL reason is still readable.
                self._sync_reply(sock, remote, "push")
                raise
            self._sync_reply(sock, remote, "push")
            with contextlib.suppress(OSError):
                sock.sendall(_SYNC_HEADER.pack(b"QUIT", 0))
        finally:
            conn.drop()

    def _sync_reply(self, sock: socket.socket, remote: str, what: str) -> None:
        ident, length = _SYNC_HEADER.unpack(_recv_exact(sock, _SYNC_HEADER.size))
        if ident == b"OKAY":
            return
        if ident == b"FAIL":
            reason = _recv_exact(sock, length).decode(errors="replace")
            raise TransferError(f"{what} {remote}: {reason}", device=self.device)
        raise AdbError(f"unexpected sync reply {ident!r}")

    def _sync_recv(self, remote: str, wd: _Watchdog) -> Generator[bytes, None, None]:
        conn = self._open_service("sync:", wd)
        try:
            sock = conn.conn
            path = remote.encode()
            sock.sendall(_SYNC_HEADER.pack(b"RECV", len(path)) + path)
            while True:
                ident, length = _SYNC_HEADER.unpack(_recv_exact(sock, _SYNC_HEADER.size))
                if ident == b"DATA":
                    if length > SYNC_DATA_MAX:
                        raise AdbError(f"sync DATA block of {length} bytes exceeds {SYNC_DATA_MAX}")
                    yield _recv_exact(sock, length)
                elif ident == b"DONE":
                    break
                elif ident == b"FAIL":
                    reason = _recv_exact(sock, length).decode(errors="replace")
                    raise TransferError(f"pull {remote}: {reason}", device=self.device)
                else:
                    raise AdbError(f"unexpected sync reply {ident!r}")
            with contextlib.suppress(OSError):
                sock.sendall(_SYNC_HEADER.pack(b"QUIT", 0))
        finally:
            conn.drop()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _beat(sock: socket.socket, packet: bytes, interval: float, stop: threading.Event) -> None:
    """Send `packet` every `interval` seconds until `stop` (or the socket closes)."""
    while not stop.wait(interval):
        try:
            sock.sendall(packet)
        except OSError:
            return
