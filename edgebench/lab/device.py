"""Device = DeviceSpec + Transport: content-addressed pushes and agent calls.

Files go to WORKDIR/cache/<sha256><suffix>: the remote hash is checked first (skip when present),
verified after pushing, re-pushed once on mismatch, then a clear TransferError.
"""

from __future__ import annotations

import json
import posixpath
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent.protocol import PROTOCOL, InfoTask, Task, parse_task
from ..descriptors import DeviceSpec
from ..errors import (
    CommandError,
    CommandTimeout,
    LabError,
    MeasurementError,
    ModelError,
    TransferError,
    UserError,
)
from ..jobs import ModelRef
from ..transports import Transport, open_transport
from .agentpack import build_agent
from .hashing import HashCache, hash_timeout, together_digest

_SAFE_SUFFIX = re.compile(r"\.[A-Za-z0-9_-]{1,16}")


@dataclass
class AgentReply:
    """A successful agent task: its result and the warnings it raised."""

    result: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    # What else used the device while the task ran (agent.disturbance.delta); empty when unknown.
    disturbance: dict[str, Any] = field(default_factory=dict)


@dataclass
class PushStats:
    """What pushes cost in this Device's lifetime: for the cache-efficiency benchmark and overhead."""

    pushed_bytes: int = 0
    push_seconds: float = 0.0
    skipped: int = 0
    verified: int = 0


class Device:
    """A reachable device: its descriptor, an open transport and a push cache."""

    def __init__(self, spec: DeviceSpec, transport: Transport | None = None) -> None:
        self.spec = spec
        self.transport = transport if transport is not None else open_transport(spec)
        self.hashes = HashCache()
        self.stats = PushStats()
        self._present: dict[str, str] = {}  # remote path -> sha256 verified during this session
        self._local_of: dict[str, str] = {}  # remote path -> the host file it holds, to name in errors
        self._fingerprint: dict[str, Any] | None = None
        self._agent_dir = Path(tempfile.gettempdir()) / "edgebench-agent"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def cache_dir(self) -> str:
        return posixpath.join(self.spec.workdir, "cache")

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- files -------------------------------------------------------------------------------
    def remote_path_for(self, local: Path, digest: str) -> str:
        # Only a plain suffix (.onnx, .mnn, .npz) is kept: the name must survive `sha256sum` output intact.
        suffix = local.suffix if _SAFE_SUFFIX.fullmatch(local.suffix) else ""
        return posixpath.join(self.cache_dir, digest + suffix)

    def remote_hashes(self, paths: Sequence[str], timeout: float, nbytes: int = 0) -> dict[str, str]:
        """sha256 of each remote file that exists; missing files are simply absent from the result.

        Bounded by `timeout` (the job's --timeout) unless the files (`nbytes` together) are too large to
        hash in it on a slow device: then by their size (lab.hashing.hash_timeout), and a timeout says so."""
        if not paths:
            return {}
        limit, why = hash_timeout(timeout, nbytes)
        try:
            res = self.transport.run(["sha256sum", "--", *paths], timeout=limit)
            if res.returncode == 127 or "not found" in res.stderr and not res.stdout:
                res = self.transport.run([self.spec.python, "-c", _PY_SHA256, *paths], timeout=limit)
        except CommandTimeout as exc:
            if not why:
                raise
            raise CommandTimeout(
                exc.argv, exc.timeout, device=self.name, output=exc.output, detail=why
            ) from None
        found = {}
        for line in res.stdout.splitlines():
            digest, _, path = line.strip().partition("  ")
            if len(digest) == 64 and path:
                found[path.lstrip("*")] = digest
        return found

    def ensure_files(self, files: Sequence[Path], timeout: float, together: bool = False) -> list[str]:
        """Make each host file present in the device cache, verified; return the remote paths.

        `together`: the files are one model in several files found by name (an ncnn `.param` finds its
        `.bin`): each is named by a digest of all their contents, so they keep their common stem."""
        digests = [self.hashes.sha256(local) for local in files]
        stem = together_digest(digests) if together else None
        wanted = []
        for local, digest in zip(files, digests, strict=True):
            wanted.append((local, digest, self.remote_path_for(local, stem or digest)))
            self._local_of[wanted[-1][2]] = str(local)
        unknown = [remote for _, digest, remote in wanted if self._present.get(remote) != digest]
        size = sum(local.stat().st_size for local, digest, remote in wanted if remote in unknown)
        remote_now = self.remote_hashes(unknown, timeout, size)
        self.stats.verified += len(unknown)
        for local, digest, remote in wanted:
            if self._present.get(remote) == digest:
                self.stats.skipped += 1
                continue
            if remote_now.get(remote) == digest:
                self.stats.skipped += 1
            else:
                self._push_verified(local, digest, remote, timeout)
            self._present[remote] = digest
        return [remote for _, _, remote in wanted]

    def ensure_model(self, path: Path, timeout: float) -> str:
        """Make a model present in the device cache with every file it is (an ncnn graph's weights beside
        it, under the same name); return the remote path of the file the runtime opens."""
        return self.ensure_models([path], timeout)[0]

    def ensure_models(self, paths: Sequence[Path], timeout: float) -> list[str]:
        """`ensure_model` for several models: the one-file models in one round trip, as `ensure_files`."""
        single = [p for p in paths if len(ModelRef(p.stem, p).files) == 1]
        found = dict(zip(single, self.ensure_files(single, timeout), strict=True)) if single else {}
        for path in paths:
            if path not in found:
                found[path] = self.ensure_files(ModelRef(path.stem, path).files, timeout, together=True)[0]
        return [found[path] for path in paths]

    def _push_verified(self, local: Path, digest: str, remote: str, timeout: float) -> None:
        import time

        self.transport.run(["mkdir", "-p", self.cache_dir], timeout=timeout).check(self.name)
        for attempt in (1, 2):
            start = time.monotonic()
            self.transport.push(local, remote, timeout=timeout)
            self.stats.push_seconds += time.monotonic() - start
            self.stats.pushed_bytes += local.stat().st_size
            got = self.remote_hashes([remote], timeout, local.stat().st_size).get(remote)
            if got == digest:
                return
            if attempt == 2:
                raise TransferError(
                    f"{local.name}: pushed file does not match (sha256 {got or 'missing'} != {digest}) "
                    f"after a re-push to {remote}",
                    device=self.name,
                )

    # ---- agent ---------------------------------------------------------------------------------
    def agent_path(self, timeout: float) -> str:
        return self.ensure_files([build_agent(self._agent_dir)], timeout)[0]

    def run_agent(self, task: Task | dict[str, Any], timeout: float) -> AgentReply:
        """Run one agent task on the device and return its result; failures become typed errors.

        A dict is checked against the task's declaration first (`agent.protocol.parse_task`)."""
        typed = task if isinstance(task, Task) else parse_task(task)
        agent = self.agent_path(timeout)
        argv = [self.spec.python, agent, "--task", typed.to_json()]
        res = self.transport.run(argv, timeout=timeout, env=self.spec.env or None)
        document = _last_json(res.stdout)
        if document is None:
            if res.returncode == 127:
                raise LabError(
                    f"{self.name}: interpreter '{self.spec.python}' not found on the device "
                    f"(set `python` in {self.spec.source})"
                )
            raise CommandError(
                argv[:2],
                res.returncode,
                res.stdout,
                res.stderr,
                device=self.name,
                message=f"agent gave no result: {_tail(res.stderr or res.stdout)}",
            )
        if document.get("protocol") != PROTOCOL:
            raise LabError(
                f"{self.name}: the agent speaks protocol {document.get('protocol')}, this edgebench speaks "
                f"{PROTOCOL} (a stale or foreign agent at {agent}; remove it from {self.cache_dir})"
            )
        if not document.get("ok"):
            error = dict(document.get("error") or {})
            if isinstance(error.get("message"), str):  # the user's files by their names, not the cache's
                for remote in sorted(self._local_of, key=len, reverse=True):
                    error["message"] = error["message"].replace(remote, self._local_of[remote])
            raise agent_error(self.name, error)
        return AgentReply(
            document.get("result") or {},
            list(document.get("warnings") or []),
            res.duration_s,
            dict(document.get("disturbance") or {}),
        )

    def fingerprint(self, timeout: float = 120.0) -> dict[str, Any]:
        """What the device is (kernel, CPU, cores, runtimes); asked once per Device."""
        if self._fingerprint is None:
            if self.spec.agent == "native":
                self._fingerprint = self._shell_fingerprint(timeout)
            else:
                self._fingerprint = self.run_agent(InfoTask(), timeout).result
        return self._fingerprint

    def _shell_fingerprint(self, timeout: float) -> dict[str, Any]:
        """For devices without Python: the device's own shell says what it is."""
        # One line each, empty where the device has no getprop (a board): the ABI picks a runner's build.
        script = (
            "uname -s -r; uname -m; grep -c ^processor /proc/cpuinfo; "
            "for p in ro.product.model ro.build.fingerprint ro.product.cpu.abi ro.product.cpu.abilist; do "
            'echo "$(getprop "$p" 2>/dev/null)"; done'
        )
        res = self.transport.run(["sh", "-c", script], timeout=timeout)
        lines = [ln.strip() for ln in res.stdout.splitlines()] + [""] * 7
        cores = int(lines[2]) if lines[2].isdigit() else None
        return {
            "kernel": lines[0],
            "arch": lines[1],
            "cores": cores,
            "model": lines[3] or None,
            "build": lines[4] or None,
            "abi": lines[5] or None,
            "abilist": lines[6] or None,
            "agent": "native",
            "runners": {name: r.path for name, r in self.spec.runners.items()},
        }


def agent_error(device: str, error: dict[str, Any]) -> Exception:
    """Map the agent's error type to the harness's error classes."""
    kind, message = error.get("type", "crash"), error.get("message", "agent failed")
    if kind == "model":
        return ModelError(f"{device}: model rejected by the runtime: {message}")
    if kind in ("input", "usage"):
        return UserError(f"{device}: {message}")
    return MeasurementError(message, device=device, kind=kind)


def _last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


# Fallback for devices without sha256sum: the device's own Python hashes the files.
_PY_SHA256 = (
    "import hashlib,sys\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n"
    "        h=hashlib.sha256()\n"
    "        with open(p,'rb') as f:\n"
    "            for b in iter(lambda:f.read(1<<20),b''):h.update(b)\n"
    "        print(h.hexdigest()+'  '+p)\n"
    "    except OSError:pass\n"
)
