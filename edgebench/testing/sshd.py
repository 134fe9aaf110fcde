"""A real OpenSSH board on loopback, for tests and CI dry runs.

`SshBoard(root).start()` makes, under `root`:

- `keys/host_ed25519` (the board's host key) and `keys/client_ed25519` (the lab's key, authorized on the
  board; optionally encrypted with `passphrase`),
- `sshd_config` (127.0.0.1 only, a free port, key-only auth, `Subsystem sftp internal-sftp`, pid file and
  authorized_keys inside `root`),
- `known_hosts` with the board's key pinned as `[127.0.0.1]:PORT`,
- `lab/NAME.toml`: a device descriptor (transport = "ssh", host, port, user, key, known_hosts,
  workdir = `root/workdir`, python = this interpreter, so the board runs the same runtimes as the host),

and runs `/usr/sbin/sshd -D -e -f sshd_config` as a child process. The board is "a Linux board": commands
run on this host as the current user, through a real sshd, over a real TCP connection.

Faults: `kill()` SIGKILLs sshd and every session process (a board losing power); `freeze()` / `thaw()`
SIGSTOP / SIGCONT them (a hung board whose connections stay open and silent); `stop()` ends them
politely; `restart()` brings the same board back on the same port; `rotate_host_key()` gives it a new
host key (a reinstalled board). `cpu_quota=0.5` puts sshd and its sessions in a cgroup v1 CPU quota (a
slower chip) when `/sys/fs/cgroup/cpu` is writable (`cpu_quota_supported()`). `network=True` runs sshd in
a network namespace of its own (`edgebench.testing.netns`): the board listens on port 22 of its own
address, and `unplug()` / `replug()` pull and reconnect its cable (`netns_supported()`).

Pytest fixtures are in `edgebench.testing.pytest_ssh` (`ssh_board`, `fresh_ssh_board`, `slow_ssh_board`).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .netns import NetworkLink

SSHD = "/usr/sbin/sshd"
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
START_TIMEOUT_S = 15.0
CFS_PERIOD_US = 100_000


def sshd_available() -> bool:
    """True when OpenSSH's server is installed (Debian package openssh-server)."""
    return os.access(SSHD, os.X_OK)


# cgroup v2: the unified hierarchy, mounted alone (v2 hosts) or beside v1 (hybrid hosts)
CGROUP_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def cgroup_v2_cpu_root() -> Path | None:
    """The cgroup v2 hierarchy whose children may get the cpu controller (enabled in its
    cgroup.subtree_control here if it was not), or None: v2 absent, cpu bound to v1, or not delegable."""
    for root in CGROUP_V2_ROOTS:
        controllers, subtree = root / "cgroup.controllers", root / "cgroup.subtree_control"
        try:
            if "cpu" not in controllers.read_text().split() or not os.access(root, os.W_OK):
                continue
            if "cpu" not in subtree.read_text().split():
                subtree.write_text("+cpu")  # refused (EBUSY) where processes sit in a non-root group
            return root
        except OSError:
            continue
    return None


def cpu_quota_supported() -> bool:
    """True when a CPU quota can be set on a group of our own: cgroup v1's cpu controller, or v2's."""
    v1 = (CGROUP_CPU / "cpu.cfs_quota_us").exists() and os.access(CGROUP_CPU, os.W_OK)
    return v1 or cgroup_v2_cpu_root() is not None


def generate_key(path: Path, passphrase: str | None = None) -> str:
    """Write a new ed25519 private key (OpenSSH format, mode 0600) and `path.pub`; return the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    encryption: Any = (
        serialization.BestAvailableEncryption(passphrase.encode())
        if passphrase
        else serialization.NoEncryption()
    )
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, encryption)
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    path.with_name(path.name + ".pub").write_text(public + "\n")
    return public


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(value: Any) -> str:
    """TOML for the simple values a descriptor holds (JSON strings are valid TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


class SshBoard:
    """A real sshd on 127.0.0.1 (or its own address) with its own keys, known_hosts and descriptor."""

    def __init__(
        self,
        root: Path,
        name: str = "board",
        *,
        cpu_quota: float | None = None,
        passphrase: str | None = None,
        user: str | None = None,
        network: bool = False,
    ) -> None:
        self.root = Path(root).absolute()  # sshd resolves its config from /, not from our cwd
        self.name = name
        self.cpu_quota = cpu_quota
        self.passphrase = passphrase
        self.user = user or getpass.getuser()
        self.port = 0
        self.network = network
        self.link: NetworkLink | None = None
        self.proc: subprocess.Popen | None = None
        self._cgroup: Path | None = None
        keys = self.root / "keys"
        self.host_key = keys / "host_ed25519"
        self.client_key = keys / "client_ed25519"
        self.authorized_keys = keys / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        self.config = self.root / "sshd_config"
        self.log = self.root / "sshd.log"
        self.lab_dir = self.root / "lab"
        self.workdir = self.root / "workdir"
        self.home = self.root / "home"

    @property
    def address(self) -> str:
        """Where the board listens: loopback, or its own address behind the namespace's cable."""
        return self.link.board_ip if self.link else "127.0.0.1"

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> SshBoard:
        """Generate keys (first time), pick a free port (first time), start sshd and wait until it answers."""
        if not sshd_available():
            raise RuntimeError(f"{SSHD} not found: install the Debian package openssh-server")
        if self.cpu_quota and not cpu_quota_supported():
            raise RuntimeError(
                "cpu_quota needs a writable cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.host_key.exists():
            generate_key(self.host_key)
        if not self.client_key.exists():
            self.authorized_keys.write_text(generate_key(self.client_key, self.passphrase) + "\n")
        if self.network and self.link is None:
            self.link = NetworkLink.create()
            self.port = 22  # its own address: the usual port, as on a real board
        for attempt in range(3):
            if not self.link and (not self.port or attempt):
                self.port = free_port()
            self._write_config()
            if self._launch():
                break
        else:
            self.close()  # no namespace left behind by a board that never came up
            raise RuntimeError(f"sshd did not start: {self.log_tail()}")
        self.pin_host_key()
        self.write_descriptor()
        return self

    def _launch(self) -> bool:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*(self.link.exec_prefix() if self.link else []), SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        if self.cpu_quota:
            try:
                self._enter_cgroup(self.proc.pid, self.cpu_quota)
            except OSError:
                self.kill()
                raise
        return self._up_in_time(0.05)

    def _up_in_time(self, step_s: float, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Whether the started sshd answers on its port within `timeout_s` (killed otherwise)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False  # e.g. the port was taken meanwhile
            if self._answers():
                return True
            time.sleep(step_s)
        self.kill()
        return False

    def _answers(self) -> bool:
        try:
            with socket.create_connection((self.address, self.port), timeout=1.0) as s:
                return s.recv(8).startswith(b"SSH-")
        except OSError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def session_pids(self) -> list[int]:
        """Pids of sshd's connection handlers and everything they run (the board's sessions)."""
        if not self.running():
            return []
        import psutil

        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]  # type: ignore[union-attr]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL sshd and all its sessions at once: the board lost power mid-whatever."""
        self._signal_all(signal.SIGKILL)
        self._reap()

    def freeze(self) -> None:
        """SIGSTOP sshd and its sessions: the board hangs, its TCP connections stay open and silent."""
        self._signal_all(signal.SIGSTOP, wait=False)

    def thaw(self) -> None:
        """SIGCONT everything freeze() stopped."""
        self._signal_all(signal.SIGCONT, wait=False)

    def stop(self) -> None:
        """End sshd and its sessions (SIGTERM, then SIGKILL after 3 s); remove the cgroup."""
        self.thaw()
        self._signal_all(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                pass
        self._signal_all(signal.SIGKILL)
        self._reap()
        self._leave_cgroup()

    def restart(self) -> SshBoard:
        """The same board (keys, port, descriptor) back up after stop() or kill()."""
        if self.running():
            self.stop()
        if not self._launch():
            raise RuntimeError(f"sshd did not restart on port {self.port}: {self.log_tail()}")
        return self

    def unplug(self) -> None:
        """Pull the board's network cable: its sessions go silent, new connections find no route."""
        self._require_link().unplug()

    def replug(self) -> None:
        self._require_link().replug()

    def _require_link(self) -> NetworkLink:
        if self.link is None:
            raise RuntimeError(f"board {self.name} is on loopback; start it with network=True to unplug it")
        return self.link

    def close(self) -> None:
        """stop(), then delete the board's network namespace if it has one."""
        self.stop()
        if self.link is not None:
            self.link.remove()
            self.link = None

    def rotate_host_key(self) -> None:
        """Give the board a new host key (as a reinstall would); known_hosts keeps the old pin."""
        generate_key(self.host_key)
        if self.running():
            self.restart()

    def _signal_all(self, sig: int, wait: bool = True) -> None:
        if self.proc is None:
            return
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        if wait:
            _wait_gone(procs[1:], 3.0 if sig == signal.SIGKILL else 0.5)

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    # ---- cgroup (a slower chip) -------------------------------------------------------------------
    def _enter_cgroup(self, pid: int, quota: float) -> None:
        """Put sshd (and so its sessions) in a group of its own with `quota` CPUs: v1 cfs files where v1's
        cpu controller is writable, else v2's cpu.max ("QUOTA PERIOD")."""
        quota_us = max(1000, int(quota * CFS_PERIOD_US))
        if (CGROUP_CPU / "cpu.cfs_quota_us").exists() and os.access(CGROUP_CPU, os.W_OK):
            group = CGROUP_CPU / f"edgebench-{self.name}-{self.port}"
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            root = cgroup_v2_cpu_root()
            if root is None:
                raise RuntimeError("no writable cgroup cpu controller (v1 or v2)")
            group = root / f"edgebench-{self.name}-{self.port}"
            group.mkdir(exist_ok=True)
            (group / "cpu.max").write_text(f"{quota_us} {CFS_PERIOD_US}")
        (group / "cgroup.procs").write_text(str(pid))  # children (sessions) inherit the group
        self._cgroup = group

    def _leave_cgroup(self) -> None:
        if self._cgroup is not None:
            try:
                self._cgroup.rmdir()
            except OSError:
                pass
            self._cgroup = None

    # ---- files the lab uses ------------------------------------------------------------------------
    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.address}",
            f"HostKey {self.host_key}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",  # tests run as root in CI containers
            "StrictModes no",
            "UsePAM no",
            "UseDNS no",
            "MaxSessions 64",
            "MaxStartups 64",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            # The board's own home: sessions must not run this host user's rc files (Debian's bash
            # sources ~/.bashrc for ssh commands; a heavy one slows every call, and a session killed in
            # the middle of it can leave stale locks behind for the whole host).
            f"SetEnv HOME={self.home}",
            "LogLevel ERROR",
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def host_key_line(self) -> str:
        """The known_hosts line pinning this board's current host key."""
        kind, data = Path(str(self.host_key) + ".pub").read_text().split()[:2]
        where = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{where} {kind} {data}"

    def pin_host_key(self, known_hosts: Path | None = None) -> Path:
        path = known_hosts or self.known_hosts
        path.write_text(self.host_key_line() + "\n")
        return path

    def descriptor(self, **overrides: Any) -> dict[str, Any]:
        """The device descriptor's keys for this board; `overrides` replace or add keys (None removes)."""
        data: dict[str, Any] = {
            "name": self.name,
            "transport": "ssh",
            "host": self.address,
            "port": self.port,
            "user": self.user,
            "key": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "workdir": str(self.workdir),
            "python": sys.executable,
            "connect_timeout": 5.0,
            "timeout": 120.0,
        }
        data.update(overrides)
        return {k: v for k, v in data.items() if v is not None}

    def write_descriptor(self, lab_dir: Path | None = None, **overrides: Any) -> Path:
        """Write NAME.toml into `lab_dir` (default: this board's lab folder) and return its path."""
        data = self.descriptor(**overrides)
        folder = lab_dir or self.lab_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{data['name']}.toml"
        path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in data.items()))
        return path

    def spec(self, **overrides: Any):
        """The board's DeviceSpec, parsed from its descriptor exactly as the CLI would."""
        from ..descriptors import parse_device
        from ..tomlread import load_toml

        path = self.write_descriptor(self.root / "specs", **overrides)
        return parse_device(load_toml(path), path)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(text[-lines:]) or "no log"

    def private_key_text(self) -> str:
        """The client key file's text: tests grep outputs and stores for it (it must never appear)."""
        return self.client_key.read_text()

    def remove(self) -> None:
        """Stop the board, delete its network namespace and its folder."""
        self.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SshBoard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_gone(procs: list[Any], timeout: float) -> None:
    """Wait until the processes are dead; a zombie counts as dead (its reaper may be slow or absent)."""
    import psutil

    deadline = time.monotonic() + timeout
    for p in procs:
        while time.monotonic() < deadline:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
