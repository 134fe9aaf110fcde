"""An emulated Android device: the device side of the ADB transport protocol over TCP.

    python -m edgebench.testing.adbd --port P --root DIR --serial S [--prop k=v ...] [--path PATH]
        [--userland DIR --env K=V ...]

The real adb server takes it with `adb connect 127.0.0.1:P` (its adb serial is then `127.0.0.1:P`;
S is the device's own `ro.serialno`). Ports 5555-5585 are refused: the adb server treats them as
local emulators. `--port 0` picks a free port.

What it speaks: the CNXN handshake (protocol 0x01000001, checksums always computed, verified for
older peers) with a `device::` banner and the features it implements (shell_v2, stat_v2,
fixed_push_mkdir; never sendrecv_v2 or delayed_ack); OPEN/OKAY/WRTE/CLSE streams with ADB flow
control; services `shell:` (no PTY; stdout+stderr on one stream), `shell,v2,...:` (shell protocol
v2: stdout, stderr and exit-code packets), `exec:`, `sync:` (STAT, LIST, SEND, RECV, DATA, DONE,
QUIT, plus STA2/LST2 while stat_v2 is advertised), `reboot:` and `reconnect`. `getprop` is a shell
command reading DIR/system/build.prop, seeded from defaults and `--prop`.

File system: device paths /data, /sdcard, /system and /sys are DIR/data, DIR/sdcard, ...; every
other absolute path is the host's, read-only (so the host's Python and runtimes can serve as the
device's interpreter); with `--userland U`, U's instead (another machine's C library, mksh and toybox:
/system/bin/sh is U's mksh and toybox's applets are links in /system/bin, as on Android, and the host's
userland, its Python included, is out of reach). Commands run in bubblewrap with that view, all in one
pid namespace (the phone's process table: `ps` shows them all, orphans live on under its init), and die
with this process.

When the host closes a shell stream the device does what a real adbd does and no more: SIGHUP to the
shell (shell protocol) or to its process group (no shell protocol, where adbd uses a PTY), its pipes
closed. Children that survive that keep running, as they do on a phone.

Faults, for tests (see `edgebench.testing.adblab.EmulatedPhone` for the Python handle):
  drop     close every adb connection at once (the phone vanished from USB): every stream ends, and
           its shell is hung up as above
  freeze   stop answering: no packet is read or written and every process of the phone is
           SIGSTOPped, while the TCP connections stay open
  thaw     undo freeze
  reboot D drop, kill every process, refuse connections for D seconds (default --reboot-delay),
           then listen again; files under DIR survive
  ps       list the phone's processes (pid on the phone, pid on the host, command line)
Send them as one line (`drop`, `freeze`, `thaw`, `reboot 1.5`, `status`, `ps`) to the control port
(`--control-port`, reported in the ready line), which answers one JSON line; or by signal:
SIGUSR1 = drop, SIGUSR2 = freeze/thaw toggle, SIGHUP = reboot. Killing the process (SIGKILL)
closes every socket and, through bubblewrap's --die-with-parent, every command: to the host it is
a phone pulled off USB. SIGTERM/SIGINT stop it cleanly.

Once listening it prints one JSON line on stdout:
  {"event": "ready", "port": P, "control_port": C, "pid": ..., "serial": S, "root": DIR}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import adbd_proto as P
from .adbd_device import DEFAULT_PATH, DeviceFs, DeviceLayout, default_props
from .adbd_processes import DeviceProcesses
from .adbd_services import ShellService, SyncService, parse_shell_service
from .adbd_stream import Service, Stream, StreamClosed

IMPLEMENTED_FEATURES = ("shell_v2", "stat_v2", "fixed_push_mkdir")
EMULATOR_PORTS = range(5555, 5586)
DEFAULT_REBOOT_DELAY_S = 2.0


@dataclass(frozen=True)
class AdbdConfig:
    """Everything the emulated device is started with."""

    root: Path
    serial: str | None = None  # default emu-PORT
    port: int = 0
    host: str = "127.0.0.1"
    props: dict[str, str] = field(default_factory=dict)
    path: str = DEFAULT_PATH
    features: tuple[str, ...] = IMPLEMENTED_FEATURES
    control_port: int = 0
    reboot_delay_s: float = DEFAULT_REBOOT_DELAY_S
    bwrap: str = "bwrap"
    userland: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


class Connection:
    """One TCP connection from an adb server: packets in, packets out, streams by local id."""

    def __init__(self, daemon: Daemon, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.daemon = daemon
        self.reader = reader
        self.writer = writer
        self.max_payload = P.MAX_PAYLOAD_V1
        self.verify_checksum = True
        self.online = False
        self.closed = False
        self.streams: dict[int, Stream] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._next_id = 1
        self._send_lock = asyncio.Lock()

    # ---- PacketSink ------------------------------------------------------------------------------
    async def send(self, packet: P.Packet) -> None:
        if self.closed:
            raise StreamClosed("connection closed")
        await self.daemon.thawed.wait()  # a frozen device writes nothing
        async with self._send_lock:
            if self.closed:
                raise StreamClosed("connection closed")
            try:
                self.writer.write(P.encode(packet))
                await self.writer.drain()
            except (ConnectionError, OSError) as exc:
                self.abort()
                raise StreamClosed(str(exc)) from None

    def forget(self, local_id: int) -> None:
        self.streams.pop(local_id, None)

    # ---- lifecycle --------------------------------------------------------------------------------
    async def serve(self) -> None:
        try:
            while not self.closed:
                packet = await self._read_packet()
                await self.daemon.thawed.wait()  # a frozen device reads but never answers
                if self.closed:
                    break
                await self._dispatch(packet)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, P.ProtocolError, StreamClosed):
            pass
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the connection now: every stream ends and its commands are killed."""
        if self.closed:
            return
        self.closed = True
        for stream in list(self.streams.values()):
            stream.on_close()
        self.streams.clear()
        for task in list(self.tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            self.writer.transport.abort()

    async def _read_packet(self) -> P.Packet:
        header = await self.reader.readexactly(P.HEADER.size)
        command, arg0, arg1, length, check = P.decode_header(header, P.MAX_PAYLOAD)
        data = await self.reader.readexactly(length) if length else b""
        if self.verify_checksum and self.online and P.checksum(data) != check:
            raise P.ProtocolError("bad payload checksum")
        return P.Packet(command, arg0, arg1, data)

    async def _dispatch(self, packet: P.Packet) -> None:
        if packet.command == P.A_CNXN:
            await self._connect(packet)
        elif not self.online:
            return  # adbd ignores everything before the handshake
        elif packet.command == P.A_OPEN:
            await self._open(packet)
        elif packet.command == P.A_OKAY:
            stream = self.streams.get(packet.arg1)
            if stream and stream.remote_id == packet.arg0:
                stream.on_okay()
        elif packet.command == P.A_WRTE:
            stream = self.streams.get(packet.arg1)
            if stream and stream.remote_id == packet.arg0:
                stream.on_write(packet.data)
        elif packet.command == P.A_CLSE:
            stream = self.streams.pop(packet.arg1, None)
            if stream and packet.arg0 in (0, stream.remote_id):
                stream.on_close()

    async def _connect(self, packet: P.Packet) -> None:
        for stream in list(self.streams.values()):  # a new handshake resets the transport
            stream.on_close()
        self.streams.clear()
        version = min(packet.arg0, P.A_VERSION_SKIP_CHECKSUM)
        ours = P.MAX_PAYLOAD if version >= P.A_VERSION_SKIP_CHECKSUM else P.MAX_PAYLOAD_V1
        self.max_payload = max(1, min(packet.arg1, ours))
        self.verify_checksum = version < P.A_VERSION_SKIP_CHECKSUM
        self.online = True
        banner = P.device_banner(self.daemon.props, list(self.daemon.config.features))
        await self.send(P.Packet(P.A_CNXN, version, ours, banner))

    async def _open(self, packet: P.Packet) -> None:
        remote_id = packet.arg0
        if remote_id == 0:
            return
        destination = packet.data.split(b"\0", 1)[0].decode("utf-8", errors="surrogateescape")
        service = self.daemon.service_for(destination)
        if service is None:
            await self.send(P.Packet(P.A_CLSE, 0, remote_id))
            return
        local_id = self._next_id
        self._next_id += 1
        stream = Stream(self, local_id, remote_id)
        self.streams[local_id] = stream
        await self.send(P.Packet(P.A_OKAY, local_id, remote_id))
        task = asyncio.create_task(self._run_service(service, stream))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_service(self, service: Service, stream: Stream) -> None:
        try:
            await service(stream)
        except StreamClosed:
            pass
        finally:
            if not stream.closed:
                with contextlib.suppress(StreamClosed):
                    await stream.close()
            self.forget(stream.local_id)


class Daemon:
    """The device: listens for adb servers, runs services, injects faults."""

    def __init__(self, config: AdbdConfig) -> None:
        self.config = config
        self.serial = config.serial or ""
        self.props: dict[str, str] = {}
        self.layout = self._layout()
        self.fs = DeviceFs(config.root, config.userland)
        self.procs = DeviceProcesses(config.bwrap)
        self.thawed = asyncio.Event()
        self.thawed.set()
        self.connections: set[Connection] = set()
        self.commands: deque[str] = deque(maxlen=100)
        self.port = config.port
        self.rebooting = False
        self._server: asyncio.Server | None = None
        self._control: asyncio.Server | None = None
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- services ---------------------------------------------------------------------------------
    def service_for(self, destination: str) -> Service | None:
        """The service behind an OPEN destination, or None (the host gets CLSE)."""
        if destination.startswith("shell"):
            rest = destination[len("shell") :]
            if rest and rest[0] not in ",:":
                return None
            v2, command = parse_shell_service(rest)
            if v2 and "shell_v2" not in self.config.features:
                return None
            self.commands.append(command)
            return ShellService(self.layout, self.procs, command, v2=v2)
        if destination.startswith("exec:"):
            command = destination[len("exec:") :]
            self.commands.append(command)
            return ShellService(self.layout, self.procs, command, v2=False)
        if destination.startswith("sync:"):
            return SyncService(self.fs, stat_v2="stat_v2" in self.config.features)
        if destination.startswith("reboot:"):
            return self._reboot_service
        if destination == "reconnect":
            return self._reconnect_service
        return None

    async def _reboot_service(self, stream: Stream) -> None:
        await stream.close()
        self._spawn(self.reboot(self.config.reboot_delay_s))

    async def _reconnect_service(self, stream: Stream) -> None:
        with contextlib.suppress(StreamClosed):
            await stream.write(b"done")
        await stream.close()
        self.drop()

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        await self._listen()
        self.serial = self.config.serial or f"emu-{self.port}"
        self.props = {**default_props(self.serial), **self.config.props}
        self.layout = self._layout()
        self.layout.prepare()
        self.procs.start()
        self._control = await asyncio.start_server(self._on_control, "127.0.0.1", self.config.control_port)

    def _layout(self) -> DeviceLayout:
        c = self.config
        return DeviceLayout(c.root, self.serial, self.props, c.path, c.bwrap, c.userland, c.env)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._on_client, self.config.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.rebooting:
            writer.transport.abort()
            return
        conn = Connection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    @property
    def control_port(self) -> int:
        assert self._control is not None
        return self._control.sockets[0].getsockname()[1]

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def stop(self) -> None:
        self.drop()
        for server in (self._server, self._control):
            if server is not None:
                server.close()
        self.procs.stop()
        self._stopped.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- faults -----------------------------------------------------------------------------------
    def drop(self) -> None:
        """Every connection closes at once (the cable was pulled): each stream's shell is hung up."""
        for conn in list(self.connections):
            conn.abort()

    def freeze(self) -> None:
        self.thawed.clear()
        self.procs.stop_all()

    def thaw(self) -> None:
        self.procs.continue_all()
        self.thawed.set()

    async def reboot(self, delay_s: float) -> None:
        """Drop, refuse connections for delay_s, come back on the same port with DIR intact."""
        if self.rebooting:
            return
        self.rebooting = True
        self.thaw()
        if self._server is not None:
            self._server.close()
            self._server = None
        self.drop()
        self.procs.reset()  # a reboot ends every process
        await asyncio.sleep(max(0.0, delay_s))
        try:
            await self._listen()
        except OSError as exc:
            print(f"adbd: could not listen again on port {self.port} after reboot: {exc}", file=sys.stderr)
        finally:
            self.rebooting = False

    def status(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "serial": self.serial,
            "root": str(self.config.root),
            "pid": os.getpid(),
            "frozen": not self.thawed.is_set(),
            "rebooting": self.rebooting,
            "connections": len(self.connections),
            "online": sum(1 for c in self.connections if c.online),
            "processes": len(self.procs),
            "features": list(self.config.features),
            "commands": list(self.commands),
        }

    async def control(self, line: str) -> dict[str, Any]:
        """One control command: drop | freeze | thaw | reboot [SECONDS] | status | ps."""
        words = line.split()
        verb = words[0].lower() if words else "status"
        if verb == "drop":
            self.drop()
        elif verb == "freeze":
            self.freeze()
        elif verb == "thaw":
            self.thaw()
        elif verb == "reboot":
            delay = float(words[1]) if len(words) > 1 else self.config.reboot_delay_s
            self._spawn(self.reboot(delay))
            await asyncio.sleep(0)  # let the reboot close the listener before answering
        elif verb == "ps":
            return {"ok": True, "processes": [asdict(p) for p in self.procs.listing()]}
        elif verb != "status":
            return {"ok": False, "error": f"unknown control command {verb!r}"}
        return {"ok": True, **self.status()}

    async def _on_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    reply = await self.control(line.decode(errors="replace").strip())
                except ValueError as exc:
                    reply = {"ok": False, "error": str(exc)}
                writer.write((json.dumps(reply) + "\n").encode())
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


def parse_args(argv: list[str] | None) -> AdbdConfig:
    ap = argparse.ArgumentParser(
        prog="python -m edgebench.testing.adbd",
        description="Emulated adb device (device side of the ADB protocol over TCP).",
    )
    ap.add_argument("--port", type=int, default=0, help="TCP port (0 = pick a free one; not 5555-5585)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--root", required=True, type=Path, help="folder holding data/, sdcard/, system/, sys/")
    ap.add_argument("--serial", default=None, help="the device's ro.serialno (default emu-PORT)")
    ap.add_argument(
        "--prop",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a system property (repeatable), e.g. ro.product.model=Pixel 8",
    )
    ap.add_argument("--path", default=DEFAULT_PATH, help=f"PATH of device shells (default {DEFAULT_PATH})")
    ap.add_argument(
        "--userland",
        type=Path,
        default=None,
        help="folder whose top level the shell sees in place of the host's (its C library, "
        "system/bin/mksh, system/bin/toybox, system/toybox-applets)",
    )
    ap.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="added to every shell's environment"
    )
    ap.add_argument(
        "--features",
        default=",".join(IMPLEMENTED_FEATURES),
        help="features to advertise, a subset of " + ",".join(IMPLEMENTED_FEATURES),
    )
    ap.add_argument("--control-port", type=int, default=0, help="fault-control port on 127.0.0.1 (0 = free)")
    ap.add_argument(
        "--reboot-delay",
        type=float,
        default=DEFAULT_REBOOT_DELAY_S,
        help="seconds a reboot keeps the device away",
    )
    args = ap.parse_args(argv)
    if args.port in EMULATOR_PORTS:
        ap.error("ports 5555-5585 belong to the adb server's emulator scan; pick another --port")
    props: dict[str, str] = {}
    env: dict[str, str] = {}
    for option, items, into in (("--prop", args.prop, props), ("--env", args.env, env)):
        for item in items:
            key, eq, value = item.partition("=")
            if not eq or not key:
                ap.error(f"{option} {item!r}: expected KEY=VALUE")
            into[key] = value
    features = tuple(f for f in args.features.split(",") if f)
    unknown = [f for f in features if f not in IMPLEMENTED_FEATURES]
    if unknown:
        ap.error(f"--features: not implemented here: {', '.join(unknown)}")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        ap.error("bubblewrap (`bwrap`) runs the device's commands: install the Debian package bubblewrap")
    return AdbdConfig(
        root=args.root.resolve(),
        serial=args.serial,
        port=args.port,
        host=args.host,
        props=props,
        path=args.path,
        features=features,
        control_port=args.control_port,
        reboot_delay_s=args.reboot_delay,
        bwrap=bwrap,
        userland=args.userland.resolve() if args.userland else None,
        env=env,
    )


async def serve(config: AdbdConfig) -> None:
    """Run the device until SIGTERM/SIGINT."""
    daemon = Daemon(config)
    await daemon.start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, daemon.stop)
    loop.add_signal_handler(signal.SIGINT, daemon.stop)
    loop.add_signal_handler(signal.SIGUSR1, daemon.drop)
    loop.add_signal_handler(
        signal.SIGUSR2,
        lambda: daemon.thaw() if daemon.procs.stopped or not daemon.thawed.is_set() else daemon.freeze(),
    )
    loop.add_signal_handler(signal.SIGHUP, lambda: daemon._spawn(daemon.reboot(config.reboot_delay_s)))
    ready = {
        "event": "ready",
        "port": daemon.port,
        "control_port": daemon.control_port,
        "pid": os.getpid(),
        "serial": daemon.serial,
        "root": str(config.root),
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    await daemon.wait_stopped()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    # An asyncio subprocess transport dropped while its command runs kills it (SIGKILL): say so on the log.
    warnings.simplefilter("always", ResourceWarning)
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
