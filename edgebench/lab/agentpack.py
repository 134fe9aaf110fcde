"""Packs the on-device agent (edgebench/agent/*.py) into one deterministic zipapp file."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from importlib import resources
from pathlib import Path

AGENT_PACKAGE = "edgebench_agent"
_BOOT = "import sys\nfrom edgebench_agent.main import main\n\nsys.exit(main())\n"
_EPOCH = (2020, 1, 1, 0, 0, 0)


def agent_bytes() -> bytes:
    """The zipapp's bytes: same sources give the same bytes (fixed timestamps, sorted names)."""
    sources = resources.files("edgebench.agent")
    names = sorted(p.name for p in sources.iterdir() if p.name.endswith(".py") and p.name != "__main__.py")
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _BOOT)
        for name in names:
            zf.writestr(
                zipfile.ZipInfo(f"{AGENT_PACKAGE}/{name}", _EPOCH), sources.joinpath(name).read_bytes()
            )
    return buf.getvalue()


def build_agent(folder: Path) -> Path:
    """Write the agent zipapp into `folder` (once per content) and return its path."""
    data = agent_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"edgebench-agent-{digest}.pyz"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path
