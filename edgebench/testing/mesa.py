"""Mesa 25's lavapipe (a Vulkan driver on the CPU) for the tests: LiteRT's GPU accelerator runs on it.

LiteRT's GPU backend is WebGPU (Dawn) over Vulkan. Debian 12's own Mesa 22.3 lavapipe lacks what Dawn asks
of an adapter (shaderUniform*ArrayDynamicIndexing: "No adapters found"); bookworm-backports' Mesa 25 has
it. `fetch_mesa` brings that Mesa into a cache folder without installing anything:

1. a private apt (`arm_board.apt_options`: its own sources list, lists, archive cache and a *copy* of the
   host's dpkg status; the host's apt configuration, lists and dpkg status are never touched) with
   bookworm and bookworm-backports, updated;
2. `apt-get install --download-only mesa-vulkan-drivers/bookworm-backports`: apt resolves against the
   copied status, so it downloads the driver and exactly the dependencies the host lacks at the versions
   it needs (on a Debian 12 host with Mesa 22: libdrm2, libdrm-amdgpu1 and libdrm-common from backports;
   lavapipe's libLLVM-15 is Debian 12's own, fetched too where the host has none);
3. each .deb unpacked with `dpkg-deb -x` into one tree, lavapipe's ICD manifest rewritten with the
   absolute path of its library in that tree, and `ldd` run on the library with the tree first on the
   library path: a library not found is an error naming it.

`Mesa.env()` is the environment a process needs to use it (VK_ICD_FILENAMES and LD_LIBRARY_PATH): given
only to the subprocesses that run on it, so the calling process's Vulkan state is untouched. About 12 MB
from the mirror; `Mesa.fetch_s` says what the fetch cost (also kept in the cache's manifest).

The cache folder is $EDGEBENCH_MESA_CACHE, else $XDG_CACHE_HOME/edgebench/mesa25, else
~/.cache/edgebench/mesa25. Needs a Debian 12 host with apt-get, dpkg-deb and ldd, and (for the first
fetch) the Debian mirror the host's apt uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .arm_board import (
    BACKPORTS,
    KEYRING,
    SUITE,
    ArmLabError,
    apt_options,
    debian_mirror,
    mirror_reachable,
    run_step,
)
from .caches import cache_folder, locked

PACKAGE = "mesa-vulkan-drivers"
MIN_MAJOR = 25  # the first Mesa whose lavapipe Dawn takes as an adapter (seen: 25.0.7-2~bpo12+1)
HOST_TOOLS = ("apt-get", "dpkg-deb", "dpkg", "ldd")
DPKG_STATUS = Path("/var/lib/dpkg/status")
SYSTEM_ICD_DIR = Path("/usr/share/vulkan/icd.d")
MANIFEST_VERSION = 1  # bump when what the tree holds changes, so a cached tree is fetched again


class MesaUnavailable(RuntimeError):
    """This machine cannot fetch Mesa 25 (not Debian 12, a tool or the mirror missing); the message says
    what. Tests skip on it, and fail under CI."""


class MesaError(RuntimeError):
    """A step of fetching or checking Mesa 25 failed: the message names the step and the output's end."""


@dataclass(frozen=True)
class Mesa:
    """An unpacked Mesa 25: its tree, lavapipe's ICD manifest pointing into it, its library folders."""

    tree: Path
    icd: Path
    lib_dirs: tuple[Path, ...]
    version: str  # the mesa-vulkan-drivers package's version
    packages: tuple[str, ...]  # every .deb unpacked into the tree
    fetch_s: float  # what fetching it cost (seconds), whenever it was fetched
    cached: bool  # True: found in the cache by this call, nothing fetched

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with Vulkan's loader pointed at this lavapipe alone
        and the tree's libraries first on the library path; the device-select layer is left out (one
        driver, nothing to select)."""
        env = dict(os.environ if base is None else base)
        paths = [str(d) for d in self.lib_dirs] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        env.update(
            VK_ICD_FILENAMES=str(self.icd),
            VK_DRIVER_FILES=str(self.icd),
            LD_LIBRARY_PATH=":".join(paths),
            NODEVICE_SELECT="1",
        )
        return env


@dataclass(frozen=True)
class MesaCache:
    """The folder holding the unpacked tree and its manifest between test sessions."""

    root: Path

    @classmethod
    def default(cls) -> MesaCache:
        """$EDGEBENCH_MESA_CACHE, else the user's cache folder's edgebench/mesa25."""
        return cls(cache_folder("EDGEBENCH_MESA_CACHE", "mesa25"))

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the cache's lock: two sessions never fetch into the same folder at once."""
        return locked(self.root)


def system_lavapipe_env(base: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """`base` with Vulkan's loader pointed at the host's own lavapipe (Debian 12: Mesa 22.3, which Dawn
    finds no adapter in); None where the host has no lavapipe manifest."""
    found = sorted(SYSTEM_ICD_DIR.glob("lvp_icd*.json"))
    if not found:
        return None
    env = dict(os.environ if base is None else base)
    env.pop("LD_LIBRARY_PATH", None)
    env.update(VK_ICD_FILENAMES=str(found[0]), VK_DRIVER_FILES=str(found[0]), NODEVICE_SELECT="1")
    return env


def mesa_available() -> str | None:
    """None when this host can fetch Mesa 25 the way `fetch_mesa` does, else why not (one line)."""
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"host tools missing: {', '.join(missing)}"
    release = _os_release()
    if release.get("ID") != "debian" or release.get("VERSION_CODENAME") != SUITE:
        name = release.get("PRETTY_NAME", "an unknown system")
        return f"Mesa 25 comes from {BACKPORTS}, for Debian 12 hosts; this is {name}"
    if not KEYRING.is_file():
        return f"the Debian archive keyring {KEYRING} is missing"
    return None


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: value.strip().strip('"') for key, value in pairs}


def fetch_mesa(cache: MesaCache | None = None, mirror: str | None = None) -> Mesa:
    """Mesa 25's lavapipe, unpacked in the cache (fetched the first time): see the module docstring.

    MesaUnavailable where this host cannot fetch it (no cache, and not Debian 12 or no mirror); MesaError
    where a step failed."""
    cache = cache or MesaCache.default()
    with cache.locked():
        found = _cached(cache)
        if found is not None:
            return found
        why = mesa_available()
        if why is not None:
            raise MesaUnavailable(why)
        mirror = mirror or debian_mirror()
        why = mirror_reachable(mirror)
        if why is not None:
            raise MesaUnavailable(f"the Debian mirror does not answer: {why}")
        start = time.monotonic()
        try:
            debs = _download(cache.root / "work", mirror)
            mesa = _unpack(cache, debs)
        except ArmLabError as exc:  # the arm lab's step runner: say it as this module's own failure
            raise MesaError(
                f"Mesa 25: {exc.step} failed (exit {exc.returncode}): {_tail(exc.output)}"
            ) from exc
        finally:
            shutil.rmtree(cache.root / "work", ignore_errors=True)
        return _record(cache, mesa, time.monotonic() - start)


def _download(work: Path, mirror: str) -> list[Path]:
    """The .debs of mesa-vulkan-drivers from bookworm-backports and of what the host lacks for it, by a
    private apt resolving against a copy of the host's dpkg status."""
    shutil.rmtree(work, ignore_errors=True)
    state = work / "apt"
    for folder in ("sources.list.d", "preferences.d", "lib/lists/partial", "cache/archives/partial"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DPKG_STATUS, state / "status")
    (state / "sources.list").write_text(
        "".join(f"deb [signed-by={KEYRING}] {mirror} {suite} main\n" for suite in (SUITE, BACKPORTS))
    )
    options = apt_options(state)
    run_step("apt-get update (private)", ["apt-get", *options, "update"], timeout=600)
    wanted = f"{PACKAGE}/{BACKPORTS}"
    install = ["apt-get", *options, "install", "--download-only", "-y", "--no-install-recommends", wanted]
    run_step(f"apt-get install --download-only {wanted}", install, timeout=900)
    archives = state / "cache" / "archives"
    if not list(archives.glob(f"{PACKAGE}_*.deb")):  # the host has that version installed already
        download = ["apt-get", *options, "download", wanted]
        run_step(f"apt-get download {wanted}", download, timeout=900, cwd=archives)
    return sorted(archives.glob("*.deb"))


def _unpack(cache: MesaCache, debs: list[Path]) -> Mesa:
    """Every .deb unpacked into a fresh tree (renamed into place when whole), lavapipe's manifest pointed at
    its library there, and the library's dependencies checked with ldd."""
    work = cache.root / "work" / "tree"
    for deb in debs:
        run_step(f"dpkg-deb -x {deb.name}", ["dpkg-deb", "-x", str(deb), str(work)], timeout=300)
    version = next(
        run_step("dpkg-deb -f", ["dpkg-deb", "-f", str(d), "Version"], timeout=60).stdout.strip()
        for d in debs
        if d.name.startswith(f"{PACKAGE}_")
    )
    tree = cache.root / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    work.rename(tree)
    return _describe(cache, tree, version, tuple(d.name for d in debs), 0.0, cached=False)


def _describe(
    cache: MesaCache, tree: Path, version: str, packages: tuple[str, ...], fetch_s: float, cached: bool
) -> Mesa:
    """The Mesa in `tree`: its manifest written (absolute library path), its libraries checked."""
    libraries = sorted(tree.glob("usr/lib/*/libvulkan_lvp.so"))
    manifests = sorted(tree.glob("usr/share/vulkan/icd.d/lvp_icd*.json"))
    if not libraries or not manifests:
        raise MesaError(f"Mesa 25: {PACKAGE} {version} has no lavapipe (libvulkan_lvp.so, lvp_icd.json)")
    major = int(version.split(":")[-1].split(".")[0])
    if major < MIN_MAJOR:
        raise MesaError(f"Mesa 25: {BACKPORTS} gave {PACKAGE} {version}, older than Mesa {MIN_MAJOR}")
    lib_dirs = tuple(sorted({p.parent for p in tree.glob("usr/lib/*/*.so*")} | {libraries[0].parent}))
    manifest = json.loads(manifests[0].read_text())
    manifest["ICD"]["library_path"] = str(libraries[0])
    icd = cache.root / "lvp_icd.json"
    icd.write_text(json.dumps(manifest, indent=2) + "\n")
    mesa = Mesa(tree, icd, lib_dirs, version, packages, fetch_s, cached)
    _check_libraries(mesa, libraries[0])
    return mesa


def _check_libraries(mesa: Mesa, library: Path) -> None:
    """ldd on lavapipe with the tree's folders first on the library path: every library it needs found."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": mesa.env({})["LD_LIBRARY_PATH"],
    }
    try:
        res = subprocess.run(
            ["ldd", str(library)], capture_output=True, text=True, timeout=60, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MesaError(f"Mesa 25: ldd {library.name}: {exc}") from exc
    missing = [line.split()[0] for line in res.stdout.splitlines() if "not found" in line]
    if res.returncode != 0 or missing:
        said = ", ".join(missing) or _tail(res.stderr)
        raise MesaError(f"Mesa 25: lavapipe's libraries are not all found here: {said}")


def _record(cache: MesaCache, mesa: Mesa, seconds: float) -> Mesa:
    """`mesa` with what its fetch cost, written to the cache's manifest (what a later call reads)."""
    record = {
        "manifest_version": MANIFEST_VERSION,
        "version": mesa.version,
        "packages": list(mesa.packages),
        "fetch_s": round(seconds, 2),
    }
    tmp = cache.manifest.with_suffix(".part")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(cache.manifest)
    return Mesa(mesa.tree, mesa.icd, mesa.lib_dirs, mesa.version, mesa.packages, seconds, cached=False)


def _cached(cache: MesaCache) -> Mesa | None:
    """The Mesa the cache holds (its manifest current, its tree whole), or None."""
    try:
        record = json.loads(cache.manifest.read_text())
    except (OSError, ValueError):
        return None
    tree = cache.root / "tree"
    if record.get("manifest_version") != MANIFEST_VERSION or not tree.is_dir():
        return None
    packages = tuple(record.get("packages", ()))
    return _describe(cache, tree, str(record["version"]), packages, float(record["fetch_s"]), cached=True)


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-4:]) or "no output"
