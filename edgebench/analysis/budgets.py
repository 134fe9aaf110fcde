"""Budgets a model is judged against on a target (latency at a percentile, memory, energy per inference, load
time, streaming RTF): parsed from `--budget key=value` and from a suite's `[budget]` table."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UserError


@dataclass(frozen=True)
class Budget:
    """One budget: `latency_p99_ms=15`, `memory_mb=60` (the model's own memory), `process_memory_mb=120`
    (the whole process's peak), `energy_mj=5`, `load_ms=300`, `decode_tokens_per_s_min=20` (a floor: the
    value must reach the limit, not stay under it)."""

    key: str
    limit: float
    quantity: str  # latency | memory (the model's) | process_memory | energy | load | decode
    stat: str | None = None  # for latency
    unit: str = ""
    at_least: bool = False  # the value must be at least the limit (a rate), not at most

    def margin(self, value: float) -> float:
        """Headroom as a share of the limit: >= 0 fits."""
        return (value - self.limit if self.at_least else self.limit - value) / self.limit


_LATENCY_KEY = re.compile(r"^latency_(p50|p90|p99|mean|min|max)_ms$")


_RTF_KEY = re.compile(r"^rtf_(p50|p90|p99|mean)$")  # real-time factor of a streaming bench


BUDGET_KEYS_HELP = (
    "latency_<p50|p90|p99|mean|max>_ms, memory_mb, process_memory_mb, energy_mj, load_ms, cold_load_ms, "
    "rtf_<p50|p90|p99|mean>, decode_tokens_per_s_min"
)


def make_budget(key: str, limit: Any, where: str = "--budget") -> Budget:
    """A Budget from its key and limit; anything else is a one-line error naming where it came from."""
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not math.isfinite(limit)
        or limit <= 0
    ):
        raise UserError(f"{where} {key}: limit must be a positive number, got {limit!r}")
    limit = float(limit)
    m = _LATENCY_KEY.match(key)
    if m:
        return Budget(key, limit, "latency", m.group(1), "ms")
    m = _RTF_KEY.match(key)
    if m:
        return Budget(key, limit, "rtf", m.group(1), "ratio")
    fixed = {
        "memory_mb": ("memory", "MB"),
        "process_memory_mb": ("process_memory", "MB"),
        "energy_mj": ("energy", "mJ"),
        "load_ms": ("load", "ms"),
        "cold_load_ms": ("cold_load", "ms"),
    }
    if key in fixed:
        quantity, unit = fixed[key]
        return Budget(key, limit, quantity, None, unit)
    if key == "decode_tokens_per_s_min":
        return Budget(key, limit, "decode", None, "tokens/s", at_least=True)
    raise UserError(f"{where} {key}: unknown budget (use {BUDGET_KEYS_HELP})")


def parse_budgets(items: Iterable[str], base: Sequence[Budget] = ()) -> tuple[Budget, ...]:
    """`KEY=VALUE` strings on top of `base` (e.g. a suite's [budget]); a later key replaces an earlier one."""
    out = {b.key: b for b in base}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not key or number is None:
            raise UserError(f"--budget {item!r}: expected KEY=NUMBER like latency_p99_ms=15")
        out[key] = make_budget(key, number)
    return tuple(out.values())


def budgets_from_suite(path: Path) -> tuple[Budget, ...]:
    """The `[budget]` table of a suite file (the rest of the suite belongs to the suite loader)."""
    from ..tomlread import load_toml

    data = load_toml(path)
    table = data.get("budget", {})
    if not isinstance(table, dict):
        raise ConfigError(path, "budget: expected a table")
    out = []
    for key, value in table.items():
        try:
            out.append(make_budget(key, value, where="budget."))
        except UserError as exc:
            raise ConfigError(path, str(exc).replace("budget. ", "budget.")) from None
    return tuple(out)
