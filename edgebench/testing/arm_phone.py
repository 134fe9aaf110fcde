"""An aarch64 phone for the test lab: the emulated adbd's shell runs in an aarch64 userland with Android's
own shell tools, under qemu-user (the arm lab's binfmt_misc entry, `arm_board.arm_emulation`).

`phone_userland(emulation)` gives the userland folder (`adbd --userland`), made once per cache:

1. `fetch_arm64_debs`: Debian's `toybox` and `mksh` for arm64, fetched with `apt-get download` through a
   private sources list and apt state folder (arch arm64; the host's apt configuration, lists and dpkg
   status are never touched, nothing is installed), kept in the cache and unpacked with `dpkg-deb -x`.
2. `extract_c_library`: the aarch64 C library (the files dpkg says libc6 and libcrypt1 own: the loader,
   libc, libm, libpthread..., toybox's libcrypt) taken from the arm lab's cached rootfs tarball, the one
   the board unpacks (built first when this machine has none).
3. The folder: `usr/lib/` with that library and glibc's C.UTF-8 locale, `lib -> usr/lib` (Debian's
   merged /usr, where aarch64 binaries look for /lib/ld-linux-aarch64.so.1), an /etc/passwd naming root
   and shell, `system/bin/mksh` and `system/bin/toybox`, and
   `system/toybox-applets` (what toybox lists, asked through qemu-aarch64 directly). No Python, no
   coreutils, no /bin/sh: the phone's shell is /system/bin/sh (mksh), its tools toybox's applets, as on
   Android. The finished folder is renamed into place, so a half-made one is never used.

The phone itself is the ordinary emulated phone (`adblab.EmulatedPhone`) started with this userland,
`PHONE_PROPS` (ro.product.cpu.abi=arm64-v8a) and `PHONE_ENV` (QEMU_CPU, as on the board): its adbd is the
host's Python, its shell and everything the shell starts are aarch64. Timings under emulation mean
nothing: tests on this phone check behaviour.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .adbd_device import USERLAND_APPLETS, USERLAND_BIN
from .arm_board import (
    KEYRING,
    QEMU_CPU,
    SUITE,
    ArmEmulation,
    ArmLabUnavailable,
    PrepareReport,
    apt_options,
    host_pip_config,
    mirror_reachable,
    pip_index_reachable,
    prepare_rootfs,
    run_step,
)

PHONE_DEBS = ("toybox", "mksh")
C_LIBRARY_PACKAGES = ("libc6", "libcrypt1")  # toybox links libcrypt too
LOCALE = "./usr/lib/locale/C.utf8"
USERLAND_VERSION = 2  # bump when the steps change what the folder holds
PHONE_PROPS = {
    "ro.product.cpu.abi": "arm64-v8a",
    "ro.product.cpu.abilist": "arm64-v8a,armeabi-v7a,armeabi",
    "ro.product.model": "edgebench emulated arm64 phone",
    "ro.hardware": "emu-arm64",
}
PHONE_ENV = {"QEMU_CPU": QEMU_CPU}
PHONE_PATH = "/system/bin"


@dataclass
class PhoneUserland:
    """The aarch64 userland folder and how it came to be (made now or found in the cache, seconds)."""

    root: Path
    made: bool = False
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def props(self) -> dict[str, str]:
        return dict(PHONE_PROPS)

    @property
    def env(self) -> dict[str, str]:
        return dict(PHONE_ENV)


def userland_folder(emulation: ArmEmulation) -> Path:
    """Where the cache keeps the userland, named by what it is made from (the rootfs recipe's key)."""
    return emulation.cache.root / f"phone-userland-{emulation.recipe.key()}-v{USERLAND_VERSION}"


def phone_userland(emulation: ArmEmulation) -> PhoneUserland:
    """The aarch64 phone's userland folder: found in the cache, else made (and kept there)."""
    start = time.monotonic()
    folder = userland_folder(emulation)
    seconds: dict[str, float] = {}
    tarball = emulation.cache.tarball(emulation.recipe)
    if not (folder / USERLAND_APPLETS).is_file():
        # prepare_rootfs takes the cache's lock itself: the tarball is made before this takes it.
        tarball = rootfs_tarball(emulation, seconds)
    with emulation.cache.locked():
        if (folder / USERLAND_APPLETS).is_file():
            return PhoneUserland(folder, False, {"userland": time.monotonic() - start})
        debs = fetch_arm64_debs(emulation, PHONE_DEBS)
        seconds["debs"] = time.monotonic() - start
        work = folder.with_name(folder.name + ".work")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        assemble_tools(debs, work)
        extract_c_library(tarball, work)
        list_applets(emulation, work)
        shutil.rmtree(folder, ignore_errors=True)
        work.replace(folder)
    seconds["userland"] = time.monotonic() - start
    return PhoneUserland(folder, True, seconds)


def fetch_arm64_debs(emulation: ArmEmulation, names: tuple[str, ...]) -> list[Path]:
    """The arm64 .debs of `names` from SUITE main, in the cache (fetched once): their paths.

    apt runs with a private sources list, lists, cache and an empty dpkg status, told that arm64 is its
    one architecture; `apt-get download` only downloads."""
    debs = emulation.cache.root / "phone-debs"
    have = {name: sorted(debs.glob(f"{name}_*_arm64.deb")) for name in names}
    if all(have.values()):
        return [found[-1] for found in have.values()]
    why = mirror_reachable(emulation.mirror)
    if why:
        raise ArmLabUnavailable(
            f"the phone's {', '.join(names)} not cached and the Debian mirror is unreachable: {why}"
        )
    work = emulation.cache.root / "phone-debs.work"
    shutil.rmtree(work, ignore_errors=True)
    state = work / "apt"
    for folder in ("sources.list.d", "preferences.d", "lib/lists/partial", "cache/archives/partial"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    (state / "status").write_text("")
    source = f"deb [arch=arm64 signed-by={KEYRING}] {emulation.mirror} {SUITE} main\n"
    (state / "sources.list").write_text(source)
    options = [*apt_options(state), "-o", "APT::Architecture=arm64", "-o", "APT::Architectures=arm64"]
    run_step("apt-get update (private, arm64)", ["apt-get", *options, "update"], timeout=600)
    fetched = work / "debs"
    fetched.mkdir()
    argv = ["apt-get", *options, "download", *(f"{name}:arm64" for name in names)]
    run_step(f"apt-get download {' '.join(names)} (arm64)", argv, timeout=600, cwd=fetched)
    debs.mkdir(parents=True, exist_ok=True)
    for deb in fetched.glob("*.deb"):
        shutil.copy2(deb, debs / deb.name)
    shutil.rmtree(work, ignore_errors=True)
    return [sorted(debs.glob(f"{name}_*_arm64.deb"))[-1] for name in names]


def assemble_tools(debs: list[Path], work: Path) -> None:
    """mksh and toybox from their unpacked .debs into `work`/system/bin."""
    unpacked = work.with_name(work.name + ".debs")
    shutil.rmtree(unpacked, ignore_errors=True)
    for deb in debs:
        run_step(f"dpkg-deb -x {deb.name}", ["dpkg-deb", "-x", str(deb), str(unpacked)], timeout=300)
    sysbin = work / USERLAND_BIN
    sysbin.mkdir(parents=True)
    for name in ("mksh", "toybox"):
        found = [p for p in (unpacked / "bin" / name, unpacked / "usr/bin" / name) if p.is_file()]
        if not found:
            raise ArmLabUnavailable(f"the arm64 {name} package holds no {name} binary")
        shutil.copy2(found[0], sysbin / name)
    shutil.rmtree(unpacked, ignore_errors=True)


def rootfs_tarball(emulation: ArmEmulation, seconds: dict[str, float]) -> Path:
    """The arm lab's cached rootfs tarball, built first (about 5 minutes) when this machine has none."""
    tarball = emulation.cache.tarball(emulation.recipe)
    if tarball.is_file():
        return tarball
    why = pip_index_reachable(host_pip_config())
    if why:
        raise ArmLabUnavailable(f"no cached rootfs and the pip index is unreachable: {why}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edgebench-rootfs-") as tmp:
        report = PrepareReport()
        prepare_rootfs(Path(tmp) / "rootfs", emulation.cache, emulation.recipe, emulation.mirror, report)
    seconds["rootfs"] = time.monotonic() - start
    return tarball


def extract_c_library(tarball: Path, work: Path) -> None:
    """The C library's shared objects (what dpkg lists for C_LIBRARY_PACKAGES directly under /lib and
    its aarch64 folder) from the rootfs tarball into `work`/usr/lib, and `lib -> usr/lib`."""
    lists = [f"./var/lib/dpkg/info/{name}:arm64.list" for name in C_LIBRARY_PACKAGES]
    meta = work.with_name(work.name + ".meta")
    shutil.rmtree(meta, ignore_errors=True)
    meta.mkdir()
    argv = ["tar", "--zstd", "-xf", str(tarball), "-C", str(meta), *lists]
    run_step("tar (dpkg's file lists)", argv, timeout=300)
    members = []
    for listed in lists:
        for line in (meta / listed).read_text().splitlines():
            parent, _, base = line.rpartition("/")
            # merged /usr: dpkg says /lib/..., the tarball holds it under ./usr/lib/...
            if parent in ("/lib", "/lib/aarch64-linux-gnu") and ".so" in base:
                members.append(f"./usr{line}")
    shutil.rmtree(meta, ignore_errors=True)
    # glibc's C.UTF-8 locale: the shell's LANG (without it mksh warns on every command)
    members.append(LOCALE)
    argv = ["tar", "--zstd", "-xpf", str(tarball), "-C", str(work), *members]
    run_step("tar (the aarch64 C library)", argv, timeout=300)
    (work / "lib").symlink_to("usr/lib")
    # who the shell runs as (root here) and Android's shell user, for toybox's id, ls -l, ps
    etc = work / "etc"
    etc.mkdir()
    (etc / "passwd").write_text(
        "root:x:0:0:root:/data:/system/bin/sh\nshell:x:2000:2000:shell:/data:/system/bin/sh\n"
    )
    (etc / "group").write_text("root:x:0:\nshell:x:2000:\n")


def list_applets(emulation: ArmEmulation, work: Path) -> None:
    """`toybox`'s applet list (run by qemu-aarch64 on the userland's own loader) into USERLAND_APPLETS."""
    argv = [str(emulation.qemu), "-L", str(work), str(work / USERLAND_BIN / "toybox")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"QEMU_CPU": QEMU_CPU})
    applets = res.stdout.split()
    if res.returncode != 0 or "ls" not in applets:
        raise ArmLabUnavailable(f"toybox under qemu-aarch64 listed no applets: {res.stderr.strip()[-300:]}")
    (work / USERLAND_APPLETS).write_text("\n".join(applets) + "\n")
