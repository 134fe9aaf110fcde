"""Exclusive per-device leases shared by every process on the host, so concurrent runs queue.

A lease is a `filelock.SoftFileLease` marker in the lab lock folder (default
`$XDG_CACHE_HOME/edgebench/locks`, or `EDGEBENCH_LOCK_DIR`): its holder refreshes it from a heartbeat thread;
a contender takes it over when the holder's process is gone (same host: pid and start time) or when the
marker has not been refreshed for the lease duration (a frozen or vanished holder). A holder whose lease was
taken over sees it in `DeviceLease.lost` and must stop using the device.

Leases are keyed by the hardware (`lease_key`: the adb serial, the ssh host and port, this host for local
devices), not by the descriptor's name, so two descriptors of one device (an alias) never measure it at
once. Next to the marker, `<key>.holder.json` says who holds the lease (run, pid, descriptor, since when) for
the "waiting for ..." message, and `<key>.journal` keeps one JSON line per acquire and release: the lease
history that shows runs did not overlap on a device.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import filelock

from ..descriptors import DeviceSpec
from ..errors import LabError
from ..records import utc_now

LOCK_DIR_ENV = "EDGEBENCH_LOCK_DIR"
# Every contender for a device must agree on the duration (filelock refuses a mismatch), so it is a
# constant of the installation, not a per-run knob; tests pass a short one explicitly.
DEFAULT_LEASE_S = 60.0
DEFAULT_POLL_S = 0.25


class LeaseTimeout(LabError):
    """The device stayed leased by someone else for longer than the caller would wait."""


class LeaseLost(LabError):
    """Our lease was taken over (we were frozen past the lease duration): stop using the device."""


def default_lock_dir() -> Path:
    """The lab lock folder: EDGEBENCH_LOCK_DIR, else the user cache's edgebench/locks."""
    if os.environ.get(LOCK_DIR_ENV):
        return Path(os.path.expanduser(os.environ[LOCK_DIR_ENV]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgebench" / "locks"


def lease_key(spec: DeviceSpec) -> str:
    """What a device's lease is keyed by: the hardware, so every descriptor of one device shares it.

    adb: the serial; ssh: host and port as the descriptor spells them; local transport: this host.
    """
    if spec.transport == "adb":
        return f"adb-{spec.serial}"
    if spec.transport == "ssh":
        return f"ssh-{(spec.host or '').lower()}-{spec.port}"
    return f"local-{socket.gethostname()}"


def lease_stem(device: str) -> str:
    """A file name for the device: readable, and distinct for names that differ only in odd characters."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    if safe != device or not safe:
        safe = f"{safe}-{hashlib.sha256(device.encode()).hexdigest()[:8]}"
    return safe


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds (or held) a device's lease."""

    device: str
    run_id: str
    pid: int
    host: str
    since: str  # ISO UTC
    since_epoch: float

    def describe(self, device: str | None = None) -> str:
        """Who holds it; names the holder's descriptor when it differs from `device` (an alias)."""
        run = f"run {self.run_id}, " if self.run_id else ""
        alias = f" as '{self.device}'" if device is not None and self.device != device else ""
        return f"{run}pid {self.pid} on {self.host}{alias}, since {self.since}"


class DeviceLease:
    """The exclusive lease on one device. Acquire, use the device while `lost` is None, release.

    `device` is the descriptor name (for messages and the journal); `key` what the lease is keyed by
    (`lease_key(spec)`; the name itself when not given).
    """

    def __init__(
        self,
        device: str,
        *,
        key: str | None = None,
        run_id: str = "",
        folder: Path | str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        poll_s: float = DEFAULT_POLL_S,
    ) -> None:
        self.device = device
        self.key = key or device
        self.run_id = run_id
        self.folder = Path(folder) if folder is not None else default_lock_dir()
        stem = lease_stem(self.key)
        self.marker_path = self.folder / f"{stem}.lock"
        self.holder_path = self.folder / f"{stem}.holder.json"
        self.journal_path = self.folder / f"{stem}.journal"
        self.poll_s = poll_s
        self.lease_s = lease_s
        self._lock = filelock.SoftFileLease(
            str(self.marker_path), lease_duration=lease_s, thread_local=False, is_singleton=False
        )
        self._holder: LeaseHolder | None = None
        self._marker: tuple[int, int] | None = None  # (st_dev, st_ino) of the marker we created
        self._lost: str | None = None

    @property
    def held(self) -> bool:
        return self._holder is not None

    @property
    def lost(self) -> str | None:
        """Why the lease is no longer ours (taken over, marker gone), or None while it is. Once lost,
        always lost until released: a device taken over is someone else's for the rest of this hold."""
        if self._holder is None:
            return None
        if self._lost is None:
            reason = self._loss_reason()
            if reason is not None:
                taker = read_holder(self.holder_path)
                who = taker.describe(self.device) if taker and taker != self._holder else "another holder"
                self._lost = f"lease on {self.device} was lost ({reason}): taken over by {who}"
        return self._lost

    def _loss_reason(self) -> str | None:
        compromise = self._lock.compromise
        if compromise is not None:
            return compromise.reason
        # filelock's heartbeat looks only every third of the lease and lets its first "owner changed" pass;
        # a holder thawed after a takeover must know at once, so look at the marker itself: a contender
        # replaces it (a new inode) only once it has judged us gone.
        try:
            st = os.lstat(self.marker_path)
        except FileNotFoundError:
            return "marker-missing"
        except OSError:
            return None  # cannot tell now; the heartbeat keeps watching
        if self._marker is not None and (st.st_dev, st.st_ino) != self._marker:
            return "owner-changed"
        return None

    def acquire(
        self, timeout: float | None = None, on_wait: Callable[[LeaseHolder | None, float], None] | None = None
    ) -> LeaseHolder:
        """Wait for the lease (forever when timeout is None); while queued, on_wait(holder, waited_s)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        told: LeaseHolder | None = None
        first = True
        while True:
            waited = time.monotonic() - start
            step = self.poll_s if timeout is None else max(0.0, min(self.poll_s * 4, timeout - waited))
            try:
                self._lock.acquire(timeout=step, poll_interval=self.poll_s)
                break
            except filelock.Timeout:
                holder = read_holder(self.holder_path)
                waited = time.monotonic() - start
                if timeout is not None and waited >= timeout:
                    who = holder.describe(self.device) if holder else "another process"
                    raise LeaseTimeout(
                        f"{self.device}: still leased by {who} after waiting {waited:.0f} s "
                        f"(lock {self.marker_path})"
                    ) from None
                if on_wait is not None and (first or holder != told):
                    on_wait(holder, waited)
                told, first = holder, False
            except filelock.LeaseSettingsMismatch as exc:
                raise LabError(f"{self.device}: {exc}") from None
            except OSError as exc:
                raise LabError(f"{self.device}: cannot use lock folder {self.folder}: {exc}") from None
        now = time.time()
        self._lost = None
        try:
            st = os.lstat(self.marker_path)
            self._marker = (st.st_dev, st.st_ino)
        except OSError:
            self._marker = None
        self._holder = LeaseHolder(
            self.device, self.run_id, os.getpid(), socket.gethostname(), utc_now(), now
        )
        _write_json_atomic(self.holder_path, asdict(self._holder))
        self._journal("acquired", waited_s=round(time.monotonic() - start, 3))
        return self._holder

    def release(self) -> None:
        """Give the lease back (a no-op when not held). A lost lease is not ours to clear."""
        if self._holder is None:
            return
        lost = self.lost
        if lost is None and read_holder(self.holder_path) == self._holder:
            try:
                self.holder_path.unlink()
            except FileNotFoundError:
                pass
        self._journal("released" if lost is None else "lost")
        self._holder, self._marker, self._lost = None, None, None
        try:
            self._lock.release(force=True)
        except (OSError, RuntimeError):
            pass  # the marker belongs to the new holder now; nothing of ours is left to clean

    def check(self) -> None:
        """Raise LeaseLost when the lease was taken over: the device is someone else's now."""
        why = self.lost
        if why:
            raise LeaseLost(why)

    def __enter__(self) -> DeviceLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _journal(self, event: str, **extra: Any) -> None:
        entry = {
            "event": event,
            "device": self.device,
            "key": self.key,
            "run_id": self.run_id,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "ts": utc_now(),
            "epoch": time.time(),
            **extra,
        }
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        # One write on an O_APPEND descriptor: lines from concurrent processes never interleave.
        try:
            fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError:
            pass  # the journal is history for people; the lease itself does not depend on it


def read_holder(path: Path) -> LeaseHolder | None:
    try:
        data = json.loads(path.read_text())
        return LeaseHolder(**data)
    except (OSError, ValueError, TypeError):
        return None


def lease_history(key: str | DeviceSpec, folder: Path | str | None = None) -> list[dict[str, Any]]:
    """A device's lease journal, oldest first: one dict per acquire / release / loss. `key` is the lease
    key (or the DeviceSpec whose `lease_key` it is); every descriptor of the device shows up in it."""
    path = Path(folder) if folder is not None else default_lock_dir()
    stem = lease_stem(lease_key(key) if isinstance(key, DeviceSpec) else key)
    try:
        lines = (path / f"{stem}.journal").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash
    return out


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
