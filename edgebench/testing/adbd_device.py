"""The emulated phone's file system and process sandbox.

Device paths `/data`, `/sdcard`, `/system` and `/sys` live under the device root DIR; every other
absolute path is the host's, read-only, or, for a phone given a userland (another machine's C library,
say an aarch64 one run through qemu-user's binfmt_misc entry), that folder's. Shell commands run inside
bubblewrap with exactly that view: the top-level folders of the host (or of the userland) bound read-only,
DIR's device folders bound writable over them, a fresh
/proc and /dev, and --die-with-parent so nothing outlives the emulated adbd. All commands share the phone's
one pid namespace (`adbd_processes`). The sync service, which
runs in adbd itself, resolves paths the same way (`DeviceFs`), following symlinks in the device's view.
"""

from __future__ import annotations

import errno
import os
import platform
import posixpath
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_DIRS = ("data", "sdcard", "system", "sys")
DEFAULT_PATH = "/system/bin:/system/xbin:/usr/local/bin:/usr/bin:/bin"
SHELL = "/system/bin/sh"
TMPDIR = "/data/local/tmp"
# Host tools linked into /system/bin (like toybox on a phone), so a device whose PATH is only
# /system/bin still has a shell and coreutils, but no Python.
SYSTEM_TOOLS = (
    "sh",
    "ls",
    "cat",
    "mkdir",
    "rm",
    "rmdir",
    "cp",
    "mv",
    "chmod",
    "ln",
    "stat",
    "touch",
    "echo",
    "printf",
    "sleep",
    "kill",
    "ps",
    "id",
    "uname",
    "nproc",
    "env",
    "head",
    "tail",
    "grep",
    "sed",
    "awk",
    "cut",
    "tr",
    "wc",
    "sort",
    "uniq",
    "sha256sum",
    "sha1sum",
    "md5sum",
    "test",
    "true",
    "false",
    "date",
    "df",
    "du",
    "find",
    "xargs",
    "readlink",
    "realpath",
    "dirname",
    "basename",
    "mktemp",
    "tee",
    "timeout",
    "getconf",
    "which",
    "dd",
    "free",
    "pidof",
    "taskset",
    "nice",
)
# A userland phone's /system/bin: the userland's shell and toybox, each applet a link to toybox (as on
# Android), listed one a line in USERLAND_APPLETS by whoever made the userland.
USERLAND_BIN = "system/bin"
USERLAND_APPLETS = "system/toybox-applets"
GETPROP_SCRIPT = """#!/bin/sh
# getprop [NAME [DEFAULT]]: this emulated device's properties, kept in /system/build.prop.
props=/system/build.prop
if [ $# -eq 0 ]; then
    while IFS= read -r line; do
        case "$line" in ''|'#'*) continue ;; esac
        printf '[%s]: [%s]\\n' "${line%%=*}" "${line#*=}"
    done < "$props"
    exit 0
fi
while IFS= read -r line; do
    case "$line" in "$1="*) printf '%s\\n' "${line#*=}"; exit 0 ;; esac
done < "$props"
if [ $# -ge 2 ]; then printf '%s\\n' "$2"; else echo; fi
"""


def host_abi() -> tuple[str, str]:
    """(ro.product.cpu.abi, ro.product.cpu.abilist) matching the host, whose binaries the device runs."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return "arm64-v8a", "arm64-v8a,armeabi-v7a,armeabi"
    if machine.startswith("arm"):
        return "armeabi-v7a", "armeabi-v7a,armeabi"
    if machine in ("x86_64", "amd64"):
        return "x86_64", "x86_64,x86"
    return machine, machine


def default_props(serial: str) -> dict[str, str]:
    abi, abilist = host_abi()
    return {
        "ro.product.name": "edgebench_emu",
        "ro.product.model": "edgebench emulated phone",
        "ro.product.device": "emu",
        "ro.product.manufacturer": "edgebench",
        "ro.product.brand": "edgebench",
        "ro.product.cpu.abi": abi,
        "ro.product.cpu.abilist": abilist,
        "ro.build.version.sdk": "33",
        "ro.build.version.release": "13",
        "ro.build.type": "userdebug",
        "ro.build.fingerprint": "edgebench/edgebench_emu/emu:13/EMU1/1:userdebug/test-keys",
        "ro.hardware": "emu",
        "ro.board.platform": "emu",
        "ro.soc.model": "emulated",
        "ro.serialno": serial,
        "ro.debuggable": "1",
        "sys.boot_completed": "1",
    }


@dataclass(frozen=True)
class DeviceLayout:
    """Where the device lives on the host, and how its shell is set up.

    With `userland` (a folder holding a machine's C library, and `system/bin/` with its `mksh` and
    `toybox`), the shell sees that folder's top level in place of the host's and /system/bin holds its
    shell and toybox applets rather than links to host tools: nothing of the host's userland (its Python
    included) is reachable. `env` is added to every shell's environment (e.g. QEMU_CPU)."""

    root: Path
    serial: str
    props: Mapping[str, str] = field(default_factory=dict)
    path: str = DEFAULT_PATH
    bwrap: str = "bwrap"
    userland: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def host_dir(self, name: str) -> Path:
        return self.root / name

    def prepare(self) -> None:
        """Create the device folders, /system/bin tools, getprop and build.prop (idempotent)."""
        for name in DEVICE_DIRS:
            self.host_dir(name).mkdir(parents=True, exist_ok=True)
        (self.root / "data" / "local" / "tmp").mkdir(parents=True, exist_ok=True)
        sysbin = self.root / "system" / "bin"
        sysbin.mkdir(parents=True, exist_ok=True)
        if self.userland is not None:
            self._userland_tools(sysbin, self.userland)
        else:
            for tool in SYSTEM_TOOLS:
                link = sysbin / tool
                target = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
                if target and not os.path.lexists(link):
                    os.symlink(target, link)
        getprop = sysbin / "getprop"
        # A userland phone has no /bin/sh: its getprop names the phone's own shell.
        script = GETPROP_SCRIPT if self.userland is None else GETPROP_SCRIPT.replace("/bin/sh", SHELL, 1)
        getprop.write_text(script)
        getprop.chmod(0o755)
        lines = [f"{k}={v}" for k, v in self.props.items()]
        (self.root / "system" / "build.prop").write_text("\n".join(lines) + "\n")

    @staticmethod
    def _userland_tools(sysbin: Path, userland: Path) -> None:
        """The userland's mksh as /system/bin/sh, its toybox beside it and every applet a link to it."""
        for name, target in (("sh", "mksh"), ("toybox", "toybox")):
            if not (sysbin / name).exists():
                shutil.copy2(userland / USERLAND_BIN / target, sysbin / name)
        for applet in (userland / USERLAND_APPLETS).read_text().split():
            link = sysbin / applet
            if applet not in ("sh", "getprop", "toybox") and not os.path.lexists(link):
                os.symlink("toybox", link)

    def shell_env(self) -> dict[str, str]:
        """The environment adbd gives shell commands (as on a phone: HOME, TMPDIR, ANDROID_*)."""
        return {
            "PATH": self.path,
            "HOME": TMPDIR,
            "TMPDIR": TMPDIR,
            "SHELL": SHELL,
            "USER": "shell",
            "LOGNAME": "shell",
            "HOSTNAME": self.props.get("ro.product.device", "localhost"),
            "TERM": "dumb",
            "ANDROID_DATA": "/data",
            "ANDROID_ROOT": "/system",
            "EXTERNAL_STORAGE": "/sdcard",
            "LANG": "C.UTF-8",
            **self.env,
        }

    def sandbox_argv(
        self, command: str | None, *, pidns_fd: int | None = None, info_fd: int | None = None
    ) -> list[str]:
        """bwrap argv running `sh -c command` (or an interactive sh) in the device's view: in the phone's
        process namespace when `pidns_fd` is given (else a namespace of its own), as a session leader (adbd
        calls setsid for each shell), reporting its host pid on `info_fd`."""
        argv = [self.bwrap, "--die-with-parent", "--new-session"]
        argv += ["--pidns", str(pidns_fd)] if pidns_fd is not None else ["--unshare-pid"]
        argv += ["--info-fd", str(info_fd)] if info_fd is not None else []
        hostname = self.props.get("ro.product.device", "localhost")
        argv += ["--unshare-ipc", "--unshare-uts", "--hostname", hostname]
        top = str(self.userland) if self.userland is not None else "/"
        for entry in sorted(os.listdir(top)):
            if entry in DEVICE_DIRS or entry in ("proc", "dev"):
                continue
            host = os.path.join(top, entry)
            if os.path.islink(host):
                argv += ["--symlink", os.readlink(host), "/" + entry]
            elif os.path.isdir(host) or os.path.isfile(host):
                argv += ["--ro-bind", host, "/" + entry]
        for name in DEVICE_DIRS:
            argv += ["--bind", str(self.host_dir(name)), "/" + name]
        argv += self._cpu_sysfs_binds()
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--chdir", "/"]
        argv += ["--", SHELL, "-c", command] if command else ["--", SHELL, "-"]
        return argv

    def _cpu_sysfs_binds(self) -> list[str]:
        # Runtimes read CPU topology and frequencies from sysfs; unless the test supplies its own,
        # the device shows the host's (read-only), as a phone shows its own.
        binds = []
        for rel in ("devices/system/cpu", "devices/system/node"):
            mine = self.root / "sys" / rel
            host = Path("/sys") / rel
            if host.is_dir() and not (mine.is_dir() and any(mine.iterdir())):
                binds += ["--ro-bind", str(host), f"/sys/{rel}"]
        return binds


class DeviceFs:
    """Device paths to host paths, following symlinks as the device sees them (paths outside the device
    folders are the host's, or the userland's when the phone has one)."""

    def __init__(self, root: Path, userland: Path | None = None) -> None:
        self.root = root
        self.userland = userland

    def _map_plain(self, device_path: str) -> tuple[str, bool]:
        """(host path, writable) of a normalized absolute device path, without following links."""
        parts = device_path.strip("/").split("/", 1)
        if parts[0] in DEVICE_DIRS:
            rest = parts[1] if len(parts) > 1 else ""
            return os.path.join(str(self.root), parts[0], rest).rstrip("/") or "/", True
        if self.userland is not None:
            return os.path.join(str(self.userland), device_path.lstrip("/")).rstrip("/"), False
        return device_path, False

    def resolve(self, device_path: str, *, follow_last: bool = True) -> tuple[str, bool]:
        """(host path, writable) for a device path; raises OSError(ELOOP) on symlink loops."""
        path = posixpath.normpath("/" + device_path.lstrip("/")) if device_path else "/"
        path = "/" + path.lstrip("/")
        for _ in range(40):
            components = [c for c in path.split("/") if c]
            resolved = "/"
            restarted = False
            for index, comp in enumerate(components):
                candidate = posixpath.join(resolved, comp)
                last = index == len(components) - 1
                host, _ = self._map_plain(candidate)
                if (not last or follow_last) and os.path.islink(host):
                    target = os.readlink(host)
                    rest = "/".join(components[index + 1 :])
                    base = target if target.startswith("/") else posixpath.join(resolved, target)
                    path = posixpath.normpath(posixpath.join(base, rest) if rest else base)
                    path = "/" + path.lstrip("/")
                    restarted = True
                    break
                resolved = candidate
            if not restarted:
                return self._map_plain(resolved)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), device_path)
