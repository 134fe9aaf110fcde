"""Job parameters the compute probes share: lists that may come as scalars (a suite grid expands lists
into one value per job), thread counts, CPU sets and shapes; bad values are UserErrors naming the key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UserError
from ..lab.device import Device


def as_list(value: Any) -> list[Any]:
    """None -> [], a scalar -> [scalar], a comma string -> its parts, a list stays a list."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def choices(
    job_params: dict[str, Any], key: str, allowed: Sequence[str], aliases: Sequence[str] = ()
) -> list[str]:
    """A list of names from `allowed` (empty means all); an unknown name is a UserError."""
    values: list[Any] = []
    for name in (key, *aliases):
        values += as_list(job_params.get(name))
    out = []
    for v in values:
        if v not in allowed:
            raise UserError(f"{key} '{v}' is not one of {', '.join(allowed)}")
        if v not in out:
            out.append(str(v))
    return out


def int_list(job_params: dict[str, Any], key: str, minimum: int = 1) -> list[int]:
    """Integers from a list, a scalar, or a string like '1,2,4' or '1-4'."""
    out: list[int] = []
    for part in as_list(job_params.get(key)):
        try:
            if isinstance(part, str) and "-" in part.strip("-"):
                lo, hi = part.split("-", 1)
                out += list(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
        except (TypeError, ValueError):
            raise UserError(f"{key}: '{part}' is not a whole number or range like 1-4") from None
    bad = [v for v in out if v < minimum]
    if bad:
        raise UserError(f"{key}: {bad[0]} is below {minimum}")
    return sorted(set(out))


def device_cpus(device: Device, job_params: dict[str, Any]) -> list[int]:
    """The CPUs the measurement may use: the job's affinity, else every CPU the agent may run on."""
    affinity = job_params.get("affinity")
    if affinity:
        return [int(c) for c in as_list(affinity)]
    info = device.fingerprint()
    cpus = info.get("affinity") or list(range(int(info.get("cores") or 1)))
    return [int(c) for c in cpus]


def thread_counts(job_params: dict[str, Any], cpus: int) -> list[int]:
    """`threads` from the job (0 or absent means the full sweep 1..cpus, "max" all CPUs only)."""
    if str(job_params.get("threads", "")).strip().lower() == "max":
        return [max(1, cpus)]
    counts = [t for t in int_list(job_params, "threads", minimum=0) if t > 0]
    return counts or list(range(1, max(1, cpus) + 1))


def shape_triples(value: Any, key: str = "skinny") -> list[tuple[int, int, int]]:
    """GEMM shapes as MxNxK strings or [m, n, k] lists."""
    if value is False:
        return []
    out = []
    items = (
        as_list(value) if not (isinstance(value, list) and value and isinstance(value[0], int)) else [value]
    )
    for item in items:
        try:
            dims = [int(d) for d in (item.lower().split("x") if isinstance(item, str) else item)]
            if len(dims) != 3 or min(dims) < 1:
                raise ValueError
        except (TypeError, ValueError, AttributeError):
            raise UserError(f"{key}: '{item}' is not a GEMM shape MxNxK like 1x4096x4096") from None
        out.append((dims[0], dims[1], dims[2]))
    return out


def number(job_params: dict[str, Any], key: str, default: float, minimum: float = 0.0) -> float:
    value = job_params.get(key, default)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{key}: '{value}' is not a number") from None
    if value < minimum:
        raise UserError(f"{key}: {value:g} is below {minimum:g}")
    return value
