"""An aarch64 board for the test lab: an arm64 Debian rootfs run by qemu-user, reached over real ssh.

`arm_lab(root)` (a context manager) gives a started `ArmBoard`:

1. `fetch_qemu`: bookworm-backports' `qemu-user` package (qemu 10, static binaries), fetched with
   `apt-get download` through a private sources list and apt state folder (the host's apt configuration,
   lists and dpkg status are never touched), unpacked with `dpkg-deb -x`; only `qemu-aarch64` is kept,
   in the cache. Debian 12's own qemu 7.2 passes the host's /proc/cpuinfo through and onnxruntime
   crashes on import, hence the backport.
2. `binfmt_registered`: qemu-aarch64 registered for aarch64 ELF files under a name of this process's own
   (`edgebench-aarch64-PID`) with flags F (the interpreter is opened now, so chroots need no copy of it)
   and P (argv[0] is kept: sshd starts `-bash` as a login shell by its name). binfmt_misc is mounted, when
   the host has not mounted it, only inside a short-lived private mount namespace, so no mount stays
   behind; the entry is removed on the way out, whatever happened, and entries of dead test processes
   are removed on the way in.
3. `prepare_rootfs`: a zstd tarball of the finished rootfs in the cache is unpacked (seconds); without
   one, the rootfs is built (debootstrap's first stage on the host, its second stage under emulation, a
   venv with the aarch64 wheels of numpy, onnxruntime, MNN and ncnn installed by pip inside) and the
   tarball saved for next time. About 5 minutes on 2 cores from nothing.
4. `ArmBoard.start()`: the rootfs's own OpenSSH sshd (aarch64, emulated) on a free loopback port, with
   a pinned host key and key-only auth, run with an empty environment inside `unshare --mount --pid
   --fork` (its /proc, /dev, /sys mounts and every process it starts end with it) and chroot.

The board has the interface of the x86 `SshBoard` (name, lab_dir, `descriptor()`, `write_descriptor()`,
`spec()`, `stop()`...), so descriptors and the ssh transport work unchanged; the agent's interpreter is
the venv's python inside the rootfs. Every session process runs with `QEMU_CPU=cortex-a76` (sshd's
`SetEnv`): qemu's default `max` CPU advertises SVE2 and SME, which onnxruntime then uses, very slowly.
Timings under emulation mean nothing: tests on this board check behaviour.

The cache folder is $EDGEBENCH_ARM_LAB_CACHE, else $XDG_CACHE_HOME/edgebench/arm-lab, else
~/.cache/edgebench/arm-lab. Needs root, the Debian tools debootstrap, zstd, tar, unshare and chroot, and
(for a first build) network access to the Debian mirror apt uses and to the pip index.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .caches import cache_folder, locked
from .sshd import SshBoard, free_port, generate_key

SUITE = "bookworm"
BACKPORTS = f"{SUITE}-backports"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
QEMU_PACKAGE = "qemu-user"  # bookworm-backports: qemu 10, statically linked binaries
QEMU_CPU = "cortex-a76"
PACKAGES = ("python3", "python3-venv", "openssh-server", "procps", "ca-certificates", "iproute2")
# The host's versions, so the agent finds on the board what it finds here (aarch64 cp311 wheels exist).
WHEELS = ("numpy==2.4.6", "onnxruntime==1.32.0", "mnn==3.6.1", "ncnn==1.0.20261020")
RECIPE_VERSION = 1  # bump when the build steps change what the tarball holds
VENV = "/opt/edgebench/venv"
BOARD_WORKDIR = "/root/edgebench"
SSH_DIR = "/etc/ssh/edgebench"  # the board's own sshd files, inside the rootfs
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BOARD_CA = "/etc/edgebench/host-ca-bundle.pem"
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
BINFMT_PREFIX = "edgebench-aarch64-"
# qemu's own aarch64 ELF magic and mask (qemu-user's binfmt.d/qemu-aarch64.conf), as binfmt_misc reads them
AARCH64_MAGIC = r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
AARCH64_MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
BOARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSED_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
HOST_TOOLS = ("debootstrap", "dpkg-deb", "apt-get", "unshare", "setpriv", "chroot", "tar", "zstd", "env")
START_TIMEOUT_S = 120.0  # sshd's first start under emulation takes a few seconds; a busy host, more

# argv: DIR ACTION ARGS... binfmt_misc at DIR is mounted first when it is not (this script runs inside
# `unshare --mount`, so that mount ends with it); register ENTRY | remove NAME... | list.
BINFMT_SCRIPT = (
    "dir=$1; action=$2; shift 2\n"
    '[ -e "$dir/register" ] || mount -t binfmt_misc binfmt_misc "$dir" || exit 97\n'
    'case "$action" in\n'
    '  register) printf "%s" "$1" > "$dir/register" ;;\n'
    '  remove) for n in "$@"; do [ ! -e "$dir/$n" ] || echo -1 > "$dir/$n"; done ;;\n'
    '  list) for f in "$dir"/*; do echo "${f##*/}"; done ;;\n'
    "esac\n"
)

# argv: DIR ENTRY NAME. Registers ENTRY (mounting binfmt_misc in this namespace if the host has not),
# prints "ready", waits until stdin closes, then removes NAME.
BINFMT_HOLD_SCRIPT = (
    "dir=$1; entry=$2; name=$3\n"
    '[ -e "$dir/register" ] || mount -t binfmt_misc binfmt_misc "$dir" || exit 97\n'
    '[ ! -e "$dir/$name" ] || echo -1 > "$dir/$name"\n'
    'printf "%s" "$entry" > "$dir/register" || exit 98\n'
    '[ -e "$dir/$name" ] || exit 98\n'
    "echo ready\n"
    "cat > /dev/null\n"
    '[ ! -e "$dir/$name" ] || echo -1 > "$dir/$name"\n'
)

# argv: ROOTFS TOPOLOGY COMMAND... run as pid 1 of fresh mount and pid namespaces (unshare has mounted
# /proc): a private /dev with the few nodes a system needs, sysfs read-only (with TOPOLOGY, when not
# empty, bound over its cpu folder), then the command chrooted. Nothing is spliced into the script.
ROOTFS_SCRIPT = (
    "root=$1; topo=$2; shift 2\n"
    "set -e\n"
    'mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"\n'
    "for n in null zero full random urandom tty; do\n"
    '  : > "$root/dev/$n"; mount --bind "/dev/$n" "$root/dev/$n"\n'
    "done\n"
    'mkdir "$root/dev/pts" "$root/dev/shm"\n'
    'mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"\n'
    'mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"\n'
    'ln -s pts/ptmx "$root/dev/ptmx"; ln -s /proc/self/fd "$root/dev/fd"\n'
    'ln -s /proc/self/fd/0 "$root/dev/stdin"; ln -s /proc/self/fd/1 "$root/dev/stdout"\n'
    'ln -s /proc/self/fd/2 "$root/dev/stderr"\n'
    'mount -t sysfs -o ro sysfs "$root/sys"\n'
    '[ -z "$topo" ] || mount --bind -o ro "$topo" "$root/sys/devices/system/cpu"\n'
    'exec chroot "$root" "$@"\n'
)


class ArmLabError(RuntimeError):
    """A step of building or starting the arm lab failed: the step, its argv, exit code and output's end."""

    def __init__(self, step: str, argv: Sequence[str], returncode: int | None, output: str) -> None:
        self.step, self.argv, self.returncode, self.output = step, list(argv), returncode, output
        tail = " | ".join(output.strip().splitlines()[-8:])
        super().__init__(f"arm lab: {step} failed (exit {returncode}): {tail or 'no output'}")


class ArmLabUnavailable(RuntimeError):
    """This machine cannot run the arm lab (not root, no binfmt_misc, a tool or the network missing);
    the message says exactly what. Tests skip on it (and fail under CI)."""


@dataclass(frozen=True)
class ArmLabCache:
    """The folder holding what outlives a test session: qemu-aarch64 and the finished rootfs tarballs."""

    root: Path

    @classmethod
    def default(cls) -> ArmLabCache:
        """$EDGEBENCH_ARM_LAB_CACHE, else the user's cache folder's edgebench/arm-lab."""
        return cls(cache_folder("EDGEBENCH_ARM_LAB_CACHE", "arm-lab"))

    @property
    def qemu(self) -> Path:
        return self.root / "qemu" / "qemu-aarch64"

    def tarball(self, recipe: RootfsRecipe) -> Path:
        return self.root / f"rootfs-{recipe.suite}-arm64-{recipe.key()}.tar.zst"

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the cache's lock: two sessions never build or write the same files at once."""
        return locked(self.root)


@dataclass(frozen=True)
class RootfsRecipe:
    """What the rootfs holds; its key names the cached tarball, so a changed recipe builds a new one."""

    suite: str = SUITE
    packages: tuple[str, ...] = PACKAGES
    wheels: tuple[str, ...] = WHEELS
    version: int = RECIPE_VERSION

    def key(self) -> str:
        text = repr((self.suite, self.packages, self.wheels, self.version))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Topology:
    """CPU clusters the board's sysfs shows (cpu_capacity and cpufreq maximum per CPU): qemu-user runs on
    the host's cores, so there are as many CPUs as the host has, each given a cluster here."""

    clusters: tuple[tuple[tuple[int, ...], int, int], ...]  # (cpus, capacity, max kHz)

    @classmethod
    def little_big(cls, cores: int) -> Topology | None:
        """The lower half of the host's cores little (capacity 446, 1.8 GHz), the rest big (1024,
        2.4 GHz); None on a single core."""
        if cores < 2:
            return None
        little = tuple(range(cores // 2))
        return cls(((little, 446, 1_800_000), (tuple(range(cores // 2, cores)), 1024, 2_400_000)))

    def write(self, folder: Path) -> Path:
        """The cpu folder's files under `folder` (bound over /sys/devices/system/cpu on the board)."""
        cpus = sorted(c for group, _, _ in self.clusters for c in group)
        span = f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
        for name in ("online", "possible", "present"):
            _write(folder / name, span + "\n")
        for group, capacity, khz in self.clusters:
            for cpu in group:
                _write(folder / f"cpu{cpu}" / "cpu_capacity", f"{capacity}\n")
                _write(folder / f"cpu{cpu}" / "online", "1\n")
                _write(folder / f"cpu{cpu}" / "cpufreq" / "cpuinfo_max_freq", f"{khz}\n")
                _write(folder / f"cpu{cpu}" / "cpufreq" / "scaling_governor", "schedutil\n")
        return folder


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---- commands -------------------------------------------------------------------------------------------
def run_step(
    step: str,
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one argv (never a shell string) with a timeout; a failure is an ArmLabError naming `step`."""
    try:
        res = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        raise ArmLabError(f"{step} (timed out after {timeout:.0f} s)", argv, None, out or "") from exc
    except OSError as exc:
        raise ArmLabError(step, argv, None, str(exc)) from exc
    if res.returncode != 0:
        raise ArmLabError(step, argv, res.returncode, res.stdout + res.stderr)
    return res


def board_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of processes on the board: a clean one (the host's must not leak in), the
    emulated CPU, and the host's proxy settings (pip inside goes where the host's pip goes)."""
    env = {"PATH": BOARD_PATH, "HOME": "/root", "LANG": "C.UTF-8", "QEMU_CPU": QEMU_CPU}
    env.update({k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)})
    env.update(extra or {})
    return env


def in_rootfs_argv(
    rootfs: Path, argv: Sequence[str], *, env: Mapping[str, str], topology: Path | None = None
) -> list[str]:
    """argv running `argv` chrooted in `rootfs` as pid 1 of its own mount and pid namespaces (killed with
    unshare, and unshare with the process starting it), with exactly `env` as its environment: nothing
    it mounts or starts outlives it, even when the test session is killed."""
    return [
        "setpriv",
        "--pdeathsig=KILL",
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        "unshare",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        f"--mount-proc={rootfs / 'proc'}",
        "sh",
        "-c",
        ROOTFS_SCRIPT,
        "sh",
        str(rootfs),
        str(topology or ""),
        *argv,
    ]


def missing_host_tools() -> list[str]:
    return [tool for tool in HOST_TOOLS if shutil.which(tool) is None]


# ---- the Debian mirror and qemu -------------------------------------------------------------------------
def debian_mirror(apt_etc: Path = Path("/etc/apt")) -> str:
    """The archive URI the host's apt uses for SUITE (deb822 .sources files first, then one-line .list
    files), else deb.debian.org."""
    for path in sorted((apt_etc / "sources.list.d").glob("*.sources")):
        for stanza in _read_text(path).split("\n\n"):
            fields = _deb822(stanza)
            if "deb" in fields.get("types", "").split() and SUITE in fields.get("suites", "").split():
                if fields.get("uris"):
                    return fields["uris"].split()[0].rstrip("/")
    for path in [apt_etc / "sources.list", *sorted((apt_etc / "sources.list.d").glob("*.list"))]:
        for line in _read_text(path).splitlines():
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                return words[1].rstrip("/")
    return DEFAULT_MIRROR


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _deb822(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields


def mirror_reachable(mirror: str, timeout: float = 15.0) -> str | None:
    """None when the mirror's SUITE Release file answers, else why not (one line)."""
    return url_reachable(f"{mirror}/dists/{SUITE}/Release", timeout)


def pip_index_reachable(settings: Mapping[str, str], timeout: float = 15.0) -> str | None:
    """None when the pip index the rootfs will use (the host's http(s) index, else PyPI) answers for
    pip itself, else why not."""
    index = (settings.get("index-url") or "https://pypi.org/simple").split()[0].rstrip("/")
    return url_reachable(f"{index}/pip/", timeout)


def url_reachable(url: str, timeout: float) -> str | None:
    """None when a HEAD request on `url` succeeds, else the URL and what went wrong."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except Exception as exc:  # noqa: BLE001 - any failure means the same: no build possible here
        return f"{url}: {exc}"


def apt_options(state: Path) -> list[str]:
    """apt -o options pointing every list, cache, lock and status at `state` (a private apt)."""
    options = {
        "Dir::Etc::SourceList": state / "sources.list",
        "Dir::Etc::SourceParts": state / "sources.list.d",
        "Dir::Etc::Preferences": state / "preferences",
        "Dir::Etc::PreferencesParts": state / "preferences.d",
        "Dir::State": state / "lib",
        "Dir::State::status": state / "status",
        "Dir::Cache": state / "cache",
        "APT::Sandbox::User": "root",
        "Debug::NoLocking": "true",
    }
    return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]


def fetch_qemu(cache: ArmLabCache, mirror: str) -> Path:
    """qemu-aarch64 from bookworm-backports' qemu-user, in the cache (fetched once): its path."""
    if cache.qemu.is_file():
        return cache.qemu
    work = cache.root / "qemu.work"
    shutil.rmtree(work, ignore_errors=True)
    state = work / "apt"
    for folder in ("sources.list.d", "preferences.d", "lib/lists/partial", "cache/archives/partial"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    (state / "status").write_text("")
    (state / "sources.list").write_text(f"deb [signed-by={KEYRING}] {mirror} {BACKPORTS} main\n")
    options = apt_options(state)
    run_step("apt-get update (private, bookworm-backports)", ["apt-get", *options, "update"], timeout=300)
    debs = work / "debs"
    debs.mkdir()
    run_step(
        f"apt-get download {QEMU_PACKAGE}",
        ["apt-get", *options, "download", f"{QEMU_PACKAGE}/{BACKPORTS}"],
        timeout=600,
        cwd=debs,
    )
    deb = next(debs.glob("*.deb"))
    run_step("dpkg-deb -x", ["dpkg-deb", "-x", str(deb), str(work / "x")], timeout=300)
    version = run_step(
        "qemu-aarch64 --version", [str(work / "x/usr/bin/qemu-aarch64"), "--version"], timeout=30
    )
    cache.qemu.parent.mkdir(parents=True, exist_ok=True)
    (cache.qemu.parent / "VERSION").write_text(version.stdout.splitlines()[0] + "\n")
    tmp = cache.qemu.with_suffix(".part")
    shutil.copy2(work / "x/usr/bin/qemu-aarch64", tmp)
    tmp.replace(cache.qemu)
    shutil.rmtree(work, ignore_errors=True)
    return cache.qemu


def qemu_version(qemu: Path) -> str:
    """The first line of `qemu-aarch64 --version` (kept beside the cached binary)."""
    text = _read_text(qemu.parent / "VERSION").strip()
    return text or run_step("qemu --version", [str(qemu), "--version"], timeout=30).stdout.splitlines()[0]


# ---- binfmt_misc ----------------------------------------------------------------------------------------
def _binfmt(action: str, *args: str) -> subprocess.CompletedProcess[str]:
    """BINFMT_SCRIPT in a private mount namespace (a binfmt_misc mount it makes ends with it)."""
    argv = ["unshare", "--mount", "sh", "-c", BINFMT_SCRIPT, "sh", str(BINFMT_DIR), action, *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArmLabUnavailable(f"binfmt_misc: {' '.join(argv[:2])}: {exc}") from exc


def binfmt_entries() -> list[str]:
    """Names of the registered binfmt_misc entries (besides `register` and `status`)."""
    res = _binfmt("list")
    if res.returncode != 0:
        raise ArmLabUnavailable(f"binfmt_misc cannot be mounted here: {res.stderr.strip() or res.returncode}")
    return [n for n in res.stdout.split() if n not in ("register", "status", "*")]


def _remove_stale_entries() -> None:
    """Entries a killed test session left behind (their process is gone): removed."""
    stale = []
    for name in binfmt_entries():
        pid = name[len(BINFMT_PREFIX) :]
        if name.startswith(BINFMT_PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.append(name)
    if stale:
        _binfmt("remove", *stale)


@contextlib.contextmanager
def binfmt_registered(qemu: Path) -> Iterator[str]:
    """qemu-aarch64 registered for aarch64 ELF files (flags F and P) under this process's own name, the
    name yielded; unregistered on the way out, whatever happened. Raises ArmLabUnavailable where it
    cannot be registered.

    A holder process keeps the registration: a binfmt_misc entry lives as long as some mount of
    binfmt_misc does (seen on Linux 6.18), so where the host has none mounted, the holder mounts it in a
    mount namespace of its own, registers, and waits on its stdin; closing it (or this process dying)
    ends the holder, its mount and so the entry, and the host's mount table never changes."""
    if os.geteuid() != 0:
        raise ArmLabUnavailable("registering qemu-aarch64 with binfmt_misc needs root")
    _remove_stale_entries()
    name = f"{BINFMT_PREFIX}{os.getpid()}"
    entry = f":{name}:M::{AARCH64_MAGIC}:{AARCH64_MASK}:{qemu.resolve()}:FP"
    argv = ["unshare", "--mount", "sh", "-c", BINFMT_HOLD_SCRIPT, "sh", str(BINFMT_DIR), entry, name]
    holder = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stderr is not None
        if holder.stdout.readline().strip() != "ready":
            holder.wait(30)
            why = {97: "binfmt_misc cannot be mounted here", 98: "binfmt_misc refused the entry"}
            raise ArmLabUnavailable(
                f"{why.get(holder.returncode, 'binfmt_misc registration failed')} "
                f"(exit {holder.returncode}): {holder.stderr.read().strip() or 'no message'}"
            )
        yield name
    finally:
        if holder.stdin is not None:
            holder.stdin.close()  # the holder removes the entry and ends
        try:
            holder.wait(30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(5)
        _binfmt("remove", name)  # in case the holder was killed before it could remove it


# ---- the rootfs -----------------------------------------------------------------------------------------
def host_pip_config() -> dict[str, str]:
    """The host's pip settings that also hold inside the rootfs (`pip config list`): index URLs over
    http(s) and network options; local paths (file:// indexes, find-links, constraints) are left out."""
    try:
        res = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    wanted = {
        "index-url",
        "extra-index-url",
        "trusted-host",
        "timeout",
        "default-timeout",
        "retries",
        "proxy",
    }
    found: dict[str, str] = {}
    for line in res.stdout.splitlines():
        key, sep, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if not sep or name not in wanted:
            continue
        value = value.strip().strip("'\"")
        if name.endswith("index-url"):
            value = " ".join(u for u in value.split() if u.startswith(("http://", "https://")))
        if value:
            found["timeout" if name == "default-timeout" else name] = value
    return found


def pip_conf_text(settings: Mapping[str, str]) -> str:
    """/etc/pip.conf for the rootfs: the host's network settings and its CA bundle (a proxy's own CA)."""
    lines = ["[global]", f"cert = {BOARD_CA}", "disable-pip-version-check = true", "no-cache-dir = true"]
    lines += [f"{key} = {value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def debootstrap_first_stage(rootfs: Path, recipe: RootfsRecipe, mirror: str) -> None:
    """Unpack the arm64 base system (host tools only, no emulation yet)."""
    argv = [
        "debootstrap",
        "--arch=arm64",
        "--foreign",
        "--variant=minbase",
        f"--include={','.join(recipe.packages)}",
        f"--keyring={KEYRING}",
        recipe.suite,
        str(rootfs),
        mirror,
    ]
    run_step("debootstrap (first stage)", argv, timeout=900)


def in_rootfs(rootfs: Path, step: str, argv: Sequence[str], timeout: float) -> str:
    """Run `argv` in the rootfs (emulated, its own namespaces); its output, or ArmLabError."""
    res = run_step(step, in_rootfs_argv(rootfs, argv, env=board_env()), timeout=timeout)
    return res.stdout


def install_wheels(rootfs: Path, recipe: RootfsRecipe) -> None:
    """The venv with the aarch64 wheels, pip inside the rootfs reaching the index as the host's does."""
    ca = rootfs / BOARD_CA.lstrip("/")
    ca.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(HOST_CA if HOST_CA.is_file() else rootfs / HOST_CA.relative_to("/"), ca)
    (rootfs / "etc/pip.conf").write_text(pip_conf_text(host_pip_config()))
    in_rootfs(rootfs, "python3 -m venv", ["/usr/bin/python3", "-m", "venv", VENV], timeout=600)
    pip = [f"{VENV}/bin/python", "-m", "pip", "install", "--only-binary=:all:", *recipe.wheels]
    in_rootfs(rootfs, "pip install (aarch64 wheels)", pip, timeout=1800)


def tidy_rootfs(rootfs: Path) -> None:
    """Drop what a board never needs (downloaded .debs, apt lists) so the tarball stays small."""
    for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / folder).glob("*"):
            if path.is_file():
                path.unlink()
    (rootfs / "run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation folder
    (rootfs / BOARD_WORKDIR.lstrip("/")).mkdir(parents=True, exist_ok=True)


def build_rootfs(rootfs: Path, recipe: RootfsRecipe, mirror: str) -> None:
    """From nothing: debootstrap's two stages, the wheels, tidied. binfmt must be registered."""
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.mkdir(parents=True)
    debootstrap_first_stage(rootfs, recipe, mirror)
    in_rootfs(rootfs, "debootstrap (second stage)", ["/debootstrap/debootstrap", "--second-stage"], 1800)
    install_wheels(rootfs, recipe)
    tidy_rootfs(rootfs)


def save_rootfs(rootfs: Path, tarball: Path) -> None:
    """The rootfs as a zstd tarball (owners, modes and device nodes kept), written atomically."""
    part = tarball.with_name(tarball.name + ".part")
    argv = ["tar", "--zstd", "--numeric-owner", "-cpf", str(part), "-C", str(rootfs), "."]
    run_step("tar (save the rootfs)", argv, timeout=900)
    part.replace(tarball)


def restore_rootfs(tarball: Path, rootfs: Path) -> None:
    """Unpack a cached rootfs tarball into an empty `rootfs`."""
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.mkdir(parents=True)
    argv = ["tar", "--zstd", "--numeric-owner", "-xpf", str(tarball), "-C", str(rootfs)]
    run_step("tar (restore the rootfs)", argv, timeout=900)


@dataclass
class PrepareReport:
    """How the lab was set up: from the cache or built, and how long each part took (seconds)."""

    built: bool = False
    qemu_fetched: bool = False
    seconds: dict[str, float] = field(default_factory=dict)


def prepare_rootfs(
    rootfs: Path, cache: ArmLabCache, recipe: RootfsRecipe, mirror: str, report: PrepareReport
) -> None:
    """The finished rootfs at `rootfs`: unpacked from the cache, else built and cached. Needs binfmt."""
    tarball = cache.tarball(recipe)
    start = time.monotonic()
    with cache.locked():
        if not tarball.is_file():
            why = mirror_reachable(mirror)
            if why:
                raise ArmLabUnavailable(f"no cached rootfs and the Debian mirror is unreachable: {why}")
            why = pip_index_reachable(host_pip_config())
            if why:
                raise ArmLabUnavailable(f"no cached rootfs and the pip index is unreachable: {why}")
            build_rootfs(rootfs, recipe, mirror)
            report.seconds["build_rootfs"] = time.monotonic() - start
            save_rootfs(rootfs, tarball)
            report.built = True
            return
    restore_rootfs(tarball, rootfs)
    report.seconds["restore_rootfs"] = time.monotonic() - start


# ---- the board ------------------------------------------------------------------------------------------
class ArmBoard(SshBoard):
    """The rootfs's own sshd (aarch64, under qemu-user) on a loopback port: an `SshBoard` whose commands
    run on an aarch64 Debian with its own python, numpy, onnxruntime, MNN and ncnn."""

    def __init__(
        self, root: Path, rootfs: Path, name: str = "armboard", *, topology: Topology | None = None
    ) -> None:
        super().__init__(root, name, user="root")
        self.rootfs = Path(rootfs).absolute()
        self.topology = topology
        ssh_dir = self.rootfs / SSH_DIR.lstrip("/")
        self.host_key = ssh_dir / "host_ed25519"
        self.authorized_keys = ssh_dir / "authorized_keys"
        self.config = ssh_dir / "sshd_config"
        self.workdir = self.rootfs / BOARD_WORKDIR.lstrip("/")  # the board's workdir, seen from the host
        self.home = self.rootfs / "root"
        self.python = f"{VENV}/bin/python"

    def start(self) -> ArmBoard:
        """Keys (first time), a free port, sshd started and answering; the descriptor written."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config.parent.mkdir(parents=True, exist_ok=True)
        if not self.host_key.exists():
            generate_key(self.host_key)
        if not self.client_key.exists():
            self.authorized_keys.write_text(generate_key(self.client_key) + "\n")
        for _ in range(3):
            self.port = free_port()
            self._write_config()
            if self._launch():
                break
        else:
            raise ArmLabError("sshd start", self._sshd_argv(), None, self.log_tail(20))
        self.pin_host_key()
        self.write_descriptor()
        return self

    def _in_board(self, argv: Sequence[str]) -> list[str]:
        """argv running `argv` on the board (its namespaces, its sysfs topology), not over ssh."""
        topology = self.topology.write(self.root / "sys-cpu") if self.topology else None
        return in_rootfs_argv(self.rootfs, argv, env=board_env(), topology=topology)

    def _sshd_argv(self) -> list[str]:
        return self._in_board(["/usr/sbin/sshd", "-D", "-e", "-f", f"{SSH_DIR}/sshd_config"])

    def _launch(self) -> bool:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self._sshd_argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return self._up_in_time(0.2, START_TIMEOUT_S)

    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {SSH_DIR}/host_ed25519",
            "PidFile none",
            f"AuthorizedKeysFile {SSH_DIR}/authorized_keys",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "StrictModes no",
            "UsePAM no",
            "UseDNS no",
            "MaxSessions 64",
            "MaxStartups 64",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            f"SetEnv QEMU_CPU={QEMU_CPU}",  # every session's processes: the CPU the lab emulates
            "LogLevel ERROR",
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def descriptor(self, **overrides: Any) -> dict[str, Any]:
        """The descriptor's keys: the board's own python and workdir, timeouts for an emulated CPU."""
        data = super().descriptor(
            python=self.python, workdir=BOARD_WORKDIR, connect_timeout=30.0, timeout=900.0
        )
        data.update(overrides)
        return {k: v for k, v in data.items() if v is not None}

    def run(self, argv: Sequence[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run argv on the board directly (not over ssh): for checks of the board itself."""
        return run_step(f"{argv[0]} on the board", self._in_board(argv), timeout=timeout)


@dataclass
class ArmEmulation:
    """qemu-aarch64 fetched and registered with binfmt_misc (one entry per process, `binfmt_name`), and
    where the lab's cached parts live: what the board and the phone of one test session share."""

    cache: ArmLabCache
    recipe: RootfsRecipe
    mirror: str
    qemu: Path
    qemu_version: str
    binfmt_name: str
    seconds: dict[str, float] = field(default_factory=dict)
    qemu_fetched: bool = False


@dataclass
class ArmLab:
    """A started board and how it was set up (versions, what was cached, how long it took)."""

    board: ArmBoard
    qemu_version: str
    report: PrepareReport


@contextlib.contextmanager
def arm_emulation(
    *, cache: ArmLabCache | None = None, recipe: RootfsRecipe | None = None
) -> Iterator[ArmEmulation]:
    """qemu fetched (once per cache) and registered under this process's binfmt_misc name, unregistered
    on the way out. Enter it once per process: the name is the process's, so a second registration
    would replace the first and the first exit would remove both."""
    if os.geteuid() != 0:
        raise ArmLabUnavailable("the arm lab needs root (binfmt_misc, chroot, mount namespaces)")
    if missing_host_tools():
        raise ArmLabUnavailable(f"host tools missing: {', '.join(missing_host_tools())} (Debian packages)")
    cache, recipe = cache or ArmLabCache.default(), recipe or RootfsRecipe()
    mirror, fetched = debian_mirror(), False
    start = time.monotonic()
    with cache.locked():
        if not cache.qemu.is_file():
            why = mirror_reachable(mirror)
            if why:
                raise ArmLabUnavailable(
                    f"qemu-aarch64 not cached and the Debian mirror is unreachable: {why}"
                )
            fetched = True
        qemu = fetch_qemu(cache, mirror)
    seconds = {"qemu": time.monotonic() - start}
    with binfmt_registered(qemu) as name:
        yield ArmEmulation(cache, recipe, mirror, qemu, qemu_version(qemu), name, seconds, fetched)


@contextlib.contextmanager
def arm_lab(
    root: Path,
    *,
    cache: ArmLabCache | None = None,
    recipe: RootfsRecipe | None = None,
    name: str = "armboard",
    topology: Topology | None = None,
    emulation: ArmEmulation | None = None,
) -> Iterator[ArmLab]:
    """The rootfs ready under `root` and its sshd started, on `emulation` (else one of its own: qemu
    fetched, binfmt registered); all undone on the way out (sshd stopped, the unpacked rootfs deleted, the
    binfmt entry removed when it is this lab's own; the cache kept)."""
    with contextlib.ExitStack() as stack:
        if emulation is None:
            emulation = stack.enter_context(arm_emulation(cache=cache, recipe=recipe))
        report = PrepareReport(qemu_fetched=emulation.qemu_fetched, seconds=dict(emulation.seconds))
        rootfs = Path(root) / "rootfs"
        stack.callback(shutil.rmtree, rootfs, True)
        prepare_rootfs(rootfs, emulation.cache, emulation.recipe, emulation.mirror, report)
        start = time.monotonic()
        board = ArmBoard(Path(root) / "board", rootfs, name, topology=topology).start()
        stack.callback(board.stop)
        report.seconds["sshd"] = time.monotonic() - start
        yield ArmLab(board, emulation.qemu_version, report)
