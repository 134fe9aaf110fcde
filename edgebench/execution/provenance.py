"""Run provenance: which edgebench, which commit, which host, which command."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from ..descriptors import DeviceSpec

_SECRET_KEYS = ("key", "password", "passphrase", "token", "secret")


def git_commit(folder: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def host_provenance(argv: list[str] | None = None) -> dict[str, Any]:
    return {
        "edgebench": __version__,
        "git_commit": git_commit(Path(__file__).resolve().parent),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "argv": redact_argv(argv if argv is not None else sys.argv[1:]),
    }


def redact_argv(argv: list[str]) -> list[str]:
    """Drop values of options that could carry secrets."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        name = arg.split("=", 1)[0].lstrip("-").lower()
        if any(s in name for s in _SECRET_KEYS):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=***")
            else:
                out.append(arg)
                hide = True
            continue
        out.append(arg)
    return out


def descriptor_summary(spec: DeviceSpec) -> dict[str, Any]:
    """What the store keeps of a descriptor: identity and datasheet, never key paths or credentials."""
    return {
        "name": spec.name,
        "transport": spec.transport,
        "soc": spec.soc,
        "agent": spec.agent,
        "serial": spec.serial,
        "host": spec.host,
        "workdir": spec.workdir,
        "spec": {
            "memory_bandwidth_gbps": spec.spec.memory_bandwidth_gbps,
            "peak_tops": spec.spec.peak_tops,
            "cpu_clusters": {k: list(v) for k, v in spec.spec.cpu_clusters.items()},
            "llc_bytes": spec.spec.llc_bytes,
        },
        "source": spec.source,
    }
