"""Start and stop the adb part of a test lab: an adb server of its own and emulated phones.

    with AdbServer.start(home) as server:                     # adb on a free port, never 5037
        phone = EmulatedPhone.start(root, server)             # python -m edgebench.testing.adbd + adb connect
        write_descriptor(lab_dir, "phone", phone)             # devices/phone.toml for the CLI
        phone.freeze(); phone.thaw(); phone.drop(); phone.reboot(1.0); phone.kill(); phone.processes()
        phone.stop()

The server runs in the foreground (`adb nodaemon server`) as our own child with its own HOME (so
its keys stay out of ~/.android); stop() ends only that process, and refuses to touch a server that
was already listening on the port. Phones listen on free ports outside 5555-5585 (the adb server
scans those for emulators); their adb serial is "127.0.0.1:PORT".
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from adbutils import AdbClient
from adbutils.errors import AdbError

from ..errors import LabError

WORKDIR = "/data/local/tmp/edgebench"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if the test process dies, so nothing is left running."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port, outside the adb emulator range and not 5037."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not 5555 <= port <= 5585 and port != 5037:
            return port
    raise LabError("no free TCP port found")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise LabError(f"timed out after {timeout:g} s waiting for {what}")


class AdbServer:
    """An adb server this process started (foreground child), on its own port and HOME."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, home: Path, adb: str) -> None:
        self.proc = proc
        self.port = port
        self.home = home
        self.adb = adb
        self.address = f"127.0.0.1:{port}"

    @classmethod
    def start(
        cls, home: Path, port: int | None = None, *, adb: str | None = None, timeout: float = 30.0
    ) -> AdbServer:
        """Start `adb -P PORT nodaemon server`; refuse a port something else already listens on."""
        adb = adb or shutil.which("adb")
        if adb is None:
            raise LabError("adb not found: install the Debian package adb")
        port = port or free_port()
        if port_open(port):
            raise LabError(f"port {port} already has a listener; not starting (nor later stopping) it")
        home.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HOME": str(home),
            "ANDROID_SDK_HOME": str(home),
            "ANDROID_ADB_SERVER_PORT": str(port),
        }
        log = (home / "adb-server.log").open("ab")
        proc = subprocess.Popen(
            [adb, "-P", str(port), "nodaemon", "server"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        server = cls(proc, port, home, adb)
        try:
            _wait(lambda: proc.poll() is not None or port_open(port), timeout, f"adb server on port {port}")
            if proc.poll() is not None:
                raise LabError(f"adb server exited with {proc.returncode}; see {home / 'adb-server.log'}")
        except BaseException:
            server.stop()
            raise
        return server

    def client(self) -> AdbClient:
        return AdbClient("127.0.0.1", self.port)

    def run_adb(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """The real adb client against this server (for tests of the command-line path)."""
        env = {**os.environ, "HOME": str(self.home), "ANDROID_SDK_HOME": str(self.home)}
        return subprocess.run(
            [self.adb, "-P", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )

    def connect(self, address: str, timeout: float = 20.0) -> None:
        """`adb connect` and wait until the server sees the device online."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                reply = self.client().connect(address, timeout=5.0)
                last = reply
                if "unable" not in reply and "failed" not in reply:
                    if self.wait_online(address, min(3.0, max(0.1, deadline - time.monotonic()))):
                        return
            except AdbError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise LabError(f"adb connect {address} did not bring the device online ({last or 'no reply'})")

    def disconnect(self, address: str) -> None:
        with contextlib.suppress(AdbError, OSError):
            self.client().disconnect(address)

    def state(self, serial: str) -> str:
        """device | offline | absent, as the server lists this serial."""
        try:
            for info in self.client().list():
                if info.serial == serial:
                    return info.state
        except (AdbError, OSError):
            return "absent"
        return "absent"

    def wait_online(self, serial: str, timeout: float) -> bool:
        """True once the server lists serial as `device`, False after timeout."""
        with contextlib.suppress(LabError):
            _wait(lambda: self.state(serial) == "device", timeout, f"{serial} online")
            return True
        return False

    def stop(self) -> None:
        """End the server we started (only ours: it is our child process)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> AdbServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class PhoneOptions:
    """How an emulated phone is started (see `python -m edgebench.testing.adbd --help`)."""

    serial: str | None = None
    props: Mapping[str, str] | None = None
    path: str | None = None
    features: Sequence[str] | None = None
    reboot_delay_s: float = 1.0
    userland: Path | None = None  # another machine's userland for the shell (see adbd --userland)
    env: Mapping[str, str] | None = None  # added to every shell's environment


class EmulatedPhone:
    """Control handle of one emulated phone (an adbd child process) attached to an AdbServer."""

    def __init__(self, root: Path, server: AdbServer, options: PhoneOptions) -> None:
        self.root = root
        self.server = server
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.control_port = 0
        self.device_serial = ""

    @property
    def serial(self) -> str:
        """The adb serial the server knows this phone by."""
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, root: Path, server: AdbServer, options: PhoneOptions | None = None, *, timeout: float = 30.0
    ) -> EmulatedPhone:
        phone = cls(root, server, options or PhoneOptions())
        try:
            phone.power_on(timeout=timeout)
        except BaseException:
            phone.stop()
            raise
        return phone

    def power_on(self, *, timeout: float = 30.0) -> None:
        """Start adbd (on its previous port after a kill, so the adb serial stays) and connect it."""
        o = self.options
        argv = [
            sys.executable,
            "-m",
            "edgebench.testing.adbd",
            "--root",
            str(self.root),
            "--port",
            str(self.port),
            "--reboot-delay",
            str(o.reboot_delay_s),
        ]
        if o.serial:
            argv += ["--serial", o.serial]
        for key, value in (o.props or {}).items():
            argv += ["--prop", f"{key}={value}"]
        if o.path:
            argv += ["--path", o.path]
        if o.features is not None:
            argv += ["--features", ",".join(o.features)]
        if o.userland is not None:
            argv += ["--userland", str(o.userland)]
        for key, value in (o.env or {}).items():
            argv += ["--env", f"{key}={value}"]
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        ready = self._read_ready(timeout)
        self.port = int(ready["port"])
        self.control_port = int(ready["control_port"])
        self.device_serial = str(ready["serial"])
        self.server.connect(self.serial, timeout=timeout)

    def _read_ready(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise LabError(f"emulated adbd did not start within {timeout:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise LabError(f"emulated adbd exited ({self.proc.wait()}); see its log beside {self.root}")
        return json.loads(line)

    # ---- faults -----------------------------------------------------------------------------------
    def control(self, command: str, timeout: float = 10.0) -> dict[str, Any]:
        """Send one control line (drop | freeze | thaw | reboot [S] | status) and return the reply."""
        with socket.create_connection(("127.0.0.1", self.control_port), timeout=timeout) as s:
            s.sendall(command.encode() + b"\n")
            reply = s.makefile("rb").readline()
        if not reply:
            raise LabError(f"emulated adbd gave no reply to {command!r}")
        return json.loads(reply)

    def status(self) -> dict[str, Any]:
        return self.control("status")

    def processes(self) -> list[dict[str, Any]]:
        """The phone's process list ({"pid", "host_pid", "args"} each), as `ps` on it would show."""
        return list(self.control("ps")["processes"])

    def freeze(self) -> None:
        """Stop answering (connections stay open; commands are SIGSTOPped)."""
        self.control("freeze")

    def thaw(self) -> None:
        self.control("thaw")

    def drop(self, *, reconnect: bool = True, timeout: float = 20.0) -> None:
        """Close every adb connection at once; by default wait until the server has it back."""
        self.control("drop")
        if reconnect:
            self.wait_online(timeout)

    def reboot(self, delay_s: float | None = None, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Go away for delay_s seconds and come back with the device folders intact."""
        delay = self.options.reboot_delay_s if delay_s is None else delay_s
        self.control(f"reboot {delay}")
        if wait:
            self.wait_ready(delay + timeout)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until a reboot in progress is over and the adb server has the phone online again."""
        _wait(lambda: not self.status()["rebooting"], timeout, f"{self.serial} to reboot")
        self.wait_online(timeout)

    def wait_online(self, timeout: float = 20.0) -> None:
        """Until the adb server lists the phone as `device` (re-connecting it if needed)."""
        if self.server.wait_online(self.serial, min(timeout, 1.0)):
            return
        # The server retries dropped TCP devices only every few seconds: reconnect it now.
        self.server.disconnect(self.serial)
        self.server.connect(self.serial, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL adbd: sockets close and commands die with it, as when a phone is pulled off USB."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Disconnect from the server and stop adbd cleanly (then hard, if it lingers)."""
        if self.port:
            self.server.disconnect(self.serial)
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    @property
    def log_path(self) -> Path:
        """adbd's own log (its stderr), beside the phone's root."""
        return self.root.parent / f"{self.root.name}-adbd.log"

    def log_events(self) -> list[str]:
        """adbd's lines on its shells (started, killed, hung up, stdin closed) and warnings, oldest first."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.startswith("adbd:") or "Warning" in line]

    def host_path(self, device_path: str) -> Path:
        """Where a device path under /data, /sdcard, /system or /sys lives on the host."""
        parts = device_path.strip("/").split("/", 1)
        if parts[0] not in ("data", "sdcard", "system", "sys"):
            raise ValueError(f"{device_path} is not in the device's own folders")
        return self.root.joinpath(*[p for p in device_path.strip("/").split("/") if p])

    def __enter__(self) -> EmulatedPhone:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def descriptor_toml(
    name: str,
    phone: EmulatedPhone,
    *,
    python: str | None = None,
    workdir: str = WORKDIR,
    timeout_s: float = 300.0,
    extra: str = "",
) -> str:
    """A device descriptor for the phone (transport adb, its serial and server, the host's Python)."""
    lines = [
        f"name = {json.dumps(name)}",
        'transport = "adb"',
        f"serial = {json.dumps(phone.serial)}",
        f"adb_server = {json.dumps(phone.server.address)}",
        f"workdir = {json.dumps(workdir)}",
        f"python = {json.dumps(python or sys.executable)}",
        f"timeout = {float(timeout_s)}",
        'soc = "emulated"',
    ]
    return "\n".join(lines) + "\n" + (extra.strip() + "\n" if extra.strip() else "")


def write_descriptor(lab_dir: Path, name: str, phone: EmulatedPhone, **kwargs: Any) -> Path:
    """Write lab_dir/NAME.toml for the phone; returns its path."""
    lab_dir.mkdir(parents=True, exist_ok=True)
    path = lab_dir / f"{name}.toml"
    path.write_text(descriptor_toml(name, phone, **kwargs))
    return path


# ---- a standing phone lab: `edgebench lab phone` -------------------------------------------------------
@dataclass(frozen=True)
class PhoneLab:
    """A running emulated phone lab: its descriptor, the adb serial and server, and the supervisor's pid."""

    name: str
    descriptor: Path
    serial: str
    adb_server: str
    pid: int
    started: bool  # False when an already running lab was found and kept


def _state_dir(state: Path, name: str) -> Path:
    return state.resolve() / name


def running_lab(lab_dir: Path, name: str, state: Path) -> PhoneLab | None:
    """The lab `start_phone_lab` left running for NAME, if its supervisor is still alive."""
    info_path = _state_dir(state, name) / "lab.json"
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError):
        return None
    if not psutil.pid_exists(int(info["pid"])) or not Path(info["descriptor"]).exists():
        return None
    return PhoneLab(
        name, Path(info["descriptor"]), info["serial"], info["adb_server"], int(info["pid"]), False
    )


def start_phone_lab(lab_dir: Path, name: str, state: Path, *, timeout: float = 60.0) -> PhoneLab:
    """Start (or find running) an adb server and an emulated phone on loopback, supervised by a background
    process of their own, and write lab_dir/NAME.toml; returns once the phone is online.

    The supervisor outlives this call (a cron script starts the lab, then runs the suite); it ends its adb
    server and adbd when stopped with `stop_phone_lab` (SIGTERM), or when either dies.
    """
    found = running_lab(lab_dir, name, state)
    if found is not None:
        return found
    where = _state_dir(state, name)
    where.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "edgebench.testing.adblab", "serve", "--lab", str(lab_dir.resolve()),
            "--name", name, "--state", str(state.resolve())]  # fmt: skip
    log = (where / "supervisor.log").open("ab")
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True
    )
    log.close()
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout)
    line = proc.stdout.readline() if ready else b""
    proc.stdout.close()
    if not line:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        raise LabError(
            f"the emulated phone lab did not start within {timeout:g} s; see {where / 'supervisor.log'}"
        )
    info = json.loads(line)
    return PhoneLab(name, Path(info["descriptor"]), info["serial"], info["adb_server"], proc.pid, True)


def stop_phone_lab(name: str, state: Path, timeout: float = 20.0) -> bool:
    """Stop the supervisor of NAME's lab (it stops its adbd and adb server); False when none was running."""
    info_path = _state_dir(state, name) / "lab.json"
    try:
        pid = int(json.loads(info_path.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return False
    if not psutil.pid_exists(pid):
        info_path.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(LabError):
        _wait(lambda: not psutil.pid_exists(pid), timeout, f"lab supervisor {pid} to stop")
        info_path.unlink(missing_ok=True)
        return True
    raise LabError(f"lab supervisor {pid} did not stop within {timeout:g} s")


def serve_phone_lab(lab_dir: Path, name: str, state: Path) -> int:
    """The supervisor: adb server + emulated phone, descriptor written, one ready line on stdout, then
    wait for SIGTERM (or for adbd or the server to die) and stop both."""
    where = _state_dir(state, name)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with AdbServer.start(where / "adb-home") as server, EmulatedPhone.start(where / "root", server) as phone:
        descriptor = write_descriptor(lab_dir, name, phone)
        info = {"descriptor": str(descriptor), "serial": phone.serial, "adb_server": server.address,
                "pid": os.getpid()}  # fmt: skip
        (where / "lab.json").write_text(json.dumps(info))
        sys.stdout.write(json.dumps(info) + "\n")
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the starter has read its line and gone: nothing more goes to its pipe
        while (
            not stop and server.proc.poll() is None and phone.proc is not None and phone.proc.poll() is None
        ):
            time.sleep(0.5)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m edgebench.testing.adblab serve --lab DIR --name NAME --state DIR` (the supervisor)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m edgebench.testing.adblab")
    sub = parser.add_subparsers(dest="verb", required=True)
    serve = sub.add_parser("serve", help="run an adb server and an emulated phone until SIGTERM")
    serve.add_argument("--lab", type=Path, required=True)
    serve.add_argument("--name", required=True)
    serve.add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)
    return serve_phone_lab(args.lab, args.name, args.state)


if __name__ == "__main__":
    sys.exit(main())
