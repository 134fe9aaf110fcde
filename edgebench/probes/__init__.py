"""Probes: host-side orchestration of one kind of measurement; each returns records.

A probe is `fn(device, job, ctx) -> ProbeResult`; `registry.KINDS` declares every kind (its typed params,
whether it needs a model, its Python-agent and native implementations). Modules are imported only when a
probe runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UserError
from .params import ParamError
from .registry import KINDS, probe_kind

ProbeFn = Callable[[Any, Any, Any], Any]  # (Device, Job, RecordContext) -> ProbeResult


def probe_function(kind: str, agent: str = "python") -> ProbeFn:
    """The implementation of `kind` for a device running `agent` ("python" or "native")."""
    try:
        return probe_kind(kind).implementation(agent)
    except ParamError as exc:
        if kind in KINDS:
            known = sorted(k for k, v in KINDS.items() if (v.native if agent == "native" else v.python))
            where = " on a native device" if agent == "native" else ""
            raise UserError(f"unknown probe '{kind}'{where} (known: {', '.join(known)})") from None
        raise UserError(exc.reason) from None
