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
"""

from __future__ import annotations

import contextlib
import os
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

from ..errors import (
    CommandTimeout,
    ConfigError,
    ConnectionLost,
    EdgebenchError,
    TransferError,
    TransportError,
)
from ..lab.descriptors import DeviceSpec
from .base import CommandResult, check_timeout, command_line

DEFAULT_SERVER_PORT = 5037
SERVER_PORT_ENV = "ANDROID_ADB_SERVER_PORT"
SYNC_DATA_MAX = 64 * 1024
_SHELL_HEADER = struct.Struct("<BI")
_SYNC_HEADER = struct.Struct("<4sI")
_STDOUT, _STDERR, _EXIT = 1, 2, 3


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


class AdbTransport:
    """Commands, pushes and pulls on one adb device (by serial), each bounded by its timeout."""

    def __init__(self, spec: DeviceSpec) -> None:
        if not spec.serial:
            raise ConfigError(spec.source, 'serial: required for transport = "adb"')
        self.device = spec.name
        self.serial = spec.serial
        self.host, self.port = server_address(spec)
        self._client = _ServerClient(self.host, self.port)
        self._features: frozenset[str] | None = None

    # ---- Transport protocol ---------------------------------------------------------------------
    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run argv on the device (quoted by command_line) and return its real exit code."""
        check_timeout(timeout, self.device)
        argv_t = tuple(str(a) for a in argv)
        line = command_line(argv_t, env)
        out = _Output()
        start = time.monotonic()
        with _Watchdog(timeout) as wd, self._failures(argv_t, wd, out):
            if "shell_v2" in self._device_features(wd):
                code = self._shell_v2(line, wd, out)
            else:
                code = self._shell_marker(line, wd, out)
        return CommandResult(
            argv_t, code, out.text(out.stdout), out.text(out.stderr), time.monotonic() - start
        )

    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        """Send a host file to the device path (parents created), with the local file's mode."""
        check_timeout(timeout, self.device)
        argv = ("push", str(local), remote)
        try:
            st = local.stat()
            source = local.open("rb")
        except OSError as exc:
            raise TransferError(f"push {local}: {exc.strerror}", device=self.device) from None
        with source, _Watchdog(timeout) as wd, self._failures(argv, wd, _Output(), transfer=True):
            self._sync_send(source, remote, stat.S_IFREG | stat.S_IMODE(st.st_mode), int(st.st_mtime), wd)

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
            with contextlib.closing(self._sync_recv(remote, wd)) as blocks:
                for block in blocks:
                    data += block
        return bytes(data).decode("utf-8", errors="replace")

    def close(self) -> None:
        """Nothing to release: every call opens (and closes) its own server connection."""

    # ---- device facts -----------------------------------------------------------------------------
    def features(self, *, timeout: float) -> frozenset[str]:
        """The features the device announced (shell_v2, stat_v2, ...), as the adb server reports them."""
        with _Watchdog(timeout) as wd, self._failures(("features",), wd, _Output()):
            return self._device_features(wd)

    def state(self, *, timeout: float) -> str:
        """device | offline | unauthorized | ... as the adb server sees this serial."""
        with _Watchdog(timeout) as wd, self._failures(("get-state",), wd, _Output()):
            return self._host_query(f"host-serial:{self.serial}:get-state", wd)

    # ---- plumbing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _failures(
        self, argv: Sequence[str], wd: _Watchdog, out: _Output, *, transfer: bool = False
    ) -> Iterator[None]:
        """Turn whatever a broken, frozen or vanished device causes into one typed error."""
        try:
            yield
        except EdgebenchError:
            if wd.fired:
                raise CommandTimeout(
                    argv, wd.timeout, device=self.device, output=out.text(out.stdout)
                ) from None
            raise
        except (AdbError, OSError, EOFError, ValueError, struct.error) as exc:
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
            what = argv[0] if argv else "call"
            raise ConnectionLost(
                argv,
                f"connection to the device lost during {what} ({detail})",
                device=self.device,
                stdout=out.text(out.stdout),
                stderr=out.text(out.stderr),
            ) from None

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

    def _shell_v2(self, line: str, wd: _Watchdog, out: _Output) -> int:
        conn = self._open_service(f"shell,v2,raw:{line}", wd)
        try:
            sock = conn.conn
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
