"""The cool-down guard: before a sustained measurement, wait until the device is back at idle temperature.

    result = wait_for_cooldown(device)                           # margin 2 °C, timeout 10 min
    if not result.cooled: log(result.describe())
    later = wait_for_cooldown(device, idle_c=result.idle_c)      # reuse the idle readings between jobs
    wait_for_cooldown(device, idle_c=35.0)                       # a known idle temperature

"Cool" means the hottest thermal zone is within `margin_c` of its idle reading. The idle reading is
given (`idle_c`: per zone, e.g. from an earlier result, or one figure for the hottest zone) or
estimated on the device from the zone's own cooling curve (Newton cooling, T = idle + b·exp(-t/tau))
after `min_observe_s` of readings.
The waiting happens inside the agent, idle, so the guard adds no load of its own; it never raises for
a device that stays warm: the result says so and the caller decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..lab.device import Device
from .sensing import sensors_config

AGENT_START_ALLOWANCE_S = 120.0


@dataclass(frozen=True)
class CooldownPolicy:
    """How long and how closely to wait. `timeout_s = 0` checks once and returns."""

    margin_c: float = 2.0
    timeout_s: float = 600.0
    period_s: float = 1.0
    min_observe_s: float = 10.0


@dataclass(frozen=True)
class CooldownResult:
    """What the guard saw: whether the device cooled, how long it waited, the hottest zone at the end."""

    cooled: bool
    waited_s: float
    zone: str | None
    temp_c: float | None
    idle_c: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    margin_c: float = 2.0
    readings: tuple[tuple[float, float], ...] = ()  # (s since the guard started, hottest zone °C)

    @property
    def idle_of_zone(self) -> float | None:
        return self.idle_c.get(self.zone) if self.zone else None

    def describe(self) -> str:
        """One line for logs and warnings."""
        if self.zone is None:
            return "no thermal zones: cool-down not checked"
        idle = self.idle_of_zone
        where = f"hottest zone {self.zone} at {self.temp_c:.1f} °C"
        ref = f", idle ≈ {idle:.1f} °C" if idle is not None else ""
        if self.cooled:
            return f"cool after {self.waited_s:.1f} s ({where}{ref})"
        return (
            f"device did not cool to within {self.margin_c:g} °C of idle in {self.waited_s:.0f} s "
            f"({where}{ref}); the run starts warm"
        )

    def params(self) -> dict[str, Any]:
        """Provenance for the records of the job that follows."""
        return {
            "cooled": self.cooled,
            "zone": self.zone,
            "start_temp_c": self.temp_c,
            "idle_c": self.idle_of_zone,
            "margin_c": self.margin_c,
        }


def wait_for_cooldown(
    device: Device,
    policy: CooldownPolicy | None = None,
    idle_c: Mapping[str, float] | float | None = None,
) -> CooldownResult:
    """Wait (on the device, idle) until its hottest zone is within the margin of its idle reading."""
    policy = policy or CooldownPolicy()
    task = {
        "kind": "idle",
        "sensors": sensors_config(device.spec),
        "margin_c": policy.margin_c,
        "timeout_s": policy.timeout_s,
        "period_s": policy.period_s,
        "min_observe_s": policy.min_observe_s,
        "idle_c": dict(idle_c) if isinstance(idle_c, Mapping) else idle_c,
    }
    reply = device.run_agent(task, timeout=policy.timeout_s + AGENT_START_ALLOWANCE_S)
    return result_from_agent(reply.result, policy.margin_c)


def result_from_agent(r: dict[str, Any], margin_c: float) -> CooldownResult:
    readings = tuple(zip(r.get("t") or [], r.get("hottest") or [], strict=False))
    return CooldownResult(
        cooled=bool(r.get("cooled")),
        waited_s=float(r.get("waited_s") or 0.0),
        zone=r.get("zone"),
        temp_c=r.get("temp_c"),
        idle_c={k: float(v) for k, v in (r.get("idle_c") or {}).items()},
        reason=str(r.get("reason") or ""),
        margin_c=float(r.get("margin_c", margin_c)),
        readings=tuple((float(a), float(b)) for a, b in readings),
    )
