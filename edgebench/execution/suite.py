"""Suites (suites/NAME.toml) loaded strictly, and the plan they make: devices x models x probes x params.

```toml
name = "nightly"
devices = ["local", "pixel8"]
models = ["models/enc.onnx", "builtin:mlp", {name = "enc-int8", path = "models/enc.int8.onnx"}]
timeout = 600                      # optional bound on every remote call of a job
[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 200, runtime = ["onnxruntime", "mnn"] }   # lists expand as a grid
[[probe]]
kind = "matmul"                    # model-free probes run once per device, not per model
[[gate]]
metric = "latency_ms"
stat = "p50"
max_slowdown = "5%"
[budget]
latency_p99_ms = 15
memory_mb = 60
[policy]                           # optional: how the run treats failures
retries = 2                        # extra attempts after a transport error
quarantine_after = 3               # consecutive device failures before the device is given up
backoff = 1.0                      # seconds before the first retry, doubling up to max_backoff (30)
cooldown = true                    # wait for the device to cool down between jobs (thermal sensors)
lease_timeout = 3600               # give up on a device another run holds for longer (default: wait)
worker_grace = 15                  # --cluster: seconds a device may have no worker before its jobs fail
store_timeout = 60                 # seconds a write waits on a store another process holds (then: spooled)
```

A list value in `params` is a grid axis; to pass a list as one value (an affinity, say), wrap it:
`affinity = [[4, 5, 6, 7]]`. Tables (`shapes = {x = [1, 128]}`) are single values.
"""

from __future__ import annotations

import difflib
import itertools
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..analysis.gate import DEFAULT_STAT, GateRule, Threshold
from ..descriptors import Lab
from ..errors import ConfigError, EdgebenchError
from ..jobs import Job, ModelRef
from ..lab.hashing import HashCache
from ..models.refs import BUILTIN_PREFIX, resolve_model
from ..probes.common import runtime_of
from ..probes.params import ParamError
from ..probes.registry import KINDS, RUNTIMES, ProbeKind
from ..tomlread import TableReader, load_toml
from .repeats import interleave

# Params naming host files (kind "path" in the probe registry) resolve against the suite file, like models.
PATH_PARAMS = ("inputs", "reference")
# The budgets `fit` and the report judge by (edgebench.analysis.fit.make_budget).
_BUDGET_KEY = re.compile(
    r"^(latency_(p50|p90|p99|mean|min|max)_ms|memory_mb|energy_mj|load_ms|cold_load_ms|rtf_(p50|p90|p99|mean)"
    r"|decode_tokens_per_s_min)$"
)
_GATE_THRESHOLDS = ("max_slowdown", "max_increase", "max_drop")


@dataclass(frozen=True)
class ProbeSpec:
    """One [[probe]] table: a kind and a grid of params, optionally narrowed to some models or devices."""

    kind: str
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    models: tuple[str, ...] | None = None  # names of suite models; None = all (or none if model-free)
    devices: tuple[str, ...] | None = None
    timeout_s: float | None = None
    needs_model: bool = True

    def points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's axes, in the order the suite lists them."""
        keys = list(self.grid)
        combos = itertools.product(*(self.grid[k] for k in keys))
        return [dict(zip(keys, combo, strict=True)) for combo in combos]


@dataclass(frozen=True)
class GateSpec:
    """One [[gate]] table: which metric to gate and how much worse it may get (fractions: 5% -> 0.05)."""

    metric: str
    stat: str | None = None
    probe: str | None = None
    device: str | None = None
    model: str | None = None
    max_slowdown: float | None = None
    max_increase: float | None = None
    max_drop: float | None = None
    replace_defaults: bool = False  # drop the gate's default rules on this metric (else rules add up)


@dataclass(frozen=True)
class RunPolicy:
    """How a run treats failures: transport retries, backoff, quarantine, cool-down, lease wait."""

    retries: int = 2
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    quarantine_after: int = 3
    cooldown: bool = True
    cooldown_timeout_s: float = 300.0
    lease_timeout_s: float | None = None  # None: queue behind other runs for as long as it takes
    worker_grace_s: float = 15.0  # --cluster: how long a device may have no worker before its jobs fail
    # How long the run's writes wait on a store another process holds before the finished jobs go to the
    # spool (stored once the store lets go); a lab on a slow shared disk may want longer, a busy one less.
    store_timeout_s: float = 60.0
    # The run's bound on every remote call (--timeout, else the suite's `timeout`); it also bounds reaching
    # the device and its health check. None: the descriptor's timeout (health check at most 120 s).
    timeout_s: float | None = None


@dataclass(frozen=True)
class Suite:
    """A validated suite: everything a run needs, with models resolved to files."""

    name: str
    path: Path
    devices: tuple[str, ...]
    models: tuple[ModelRef, ...]
    probes: tuple[ProbeSpec, ...]
    gates: tuple[GateSpec, ...] = ()
    budget: dict[str, float] = field(default_factory=dict)
    timeout_s: float | None = None
    policy: RunPolicy = field(default_factory=RunPolicy)

    def model(self, name: str) -> ModelRef:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def load_suite(path: Path | str) -> Suite:
    """Read and validate a suite file; any problem is a ConfigError naming the file and key."""
    path = Path(path)
    data = load_toml(path)
    r = TableReader(data, path)
    name = r.get("name", str, path.stem)
    r.get("description", str, "")
    devices = _device_list(r, "devices")
    models = _models(r, path)
    timeout = _positive(r, "timeout", None)
    r.done(later=("probe", "gate", "budget", "policy"))
    probes = _probes(r, path, models, devices)
    gates = _gates(r, path)
    budget = _budget(r.table("budget"))
    policy = _policy(r.table("policy"))
    r.done()
    if not probes:
        raise ConfigError(path, "probe: a suite needs at least one [[probe]] table")
    return Suite(
        name=name,
        path=path.resolve(),
        devices=devices,
        models=tuple(models),
        probes=tuple(probes),
        gates=tuple(gates),
        budget=budget,
        timeout_s=timeout,
        policy=policy,
    )


def check_devices(suite: Suite, lab: Lab) -> None:
    """Every device the suite names must exist in the lab (exit 2 naming the file and the device)."""
    for i, name in enumerate(suite.devices):
        if name not in lab.devices:
            where = f" in {lab.folder}" if lab.folder else ""
            raise ConfigError(
                suite.path, f"devices[{i}]: unknown device '{name}'{where} (known: {', '.join(lab.names())})"
            )


def plan(suite: Suite, timeout_s: float | None = None) -> list[Job]:
    """The suite's jobs, device by device in the suite's order (a configuration with `repeats = N` once per
    invocation, round-robin: `execution.repeats`); keys are stable across processes and
    checkouts: files count by content (sha256), missing ones by their path relative to the suite."""
    jobs: list[Job] = []
    seen: set[str] = set()
    hashes = HashCache()
    for device in suite.devices:
        for probe in suite.probes:
            if probe.devices is not None and device not in probe.devices:
                continue
            models: list[ModelRef | None]
            if not probe.needs_model:
                models = [None]
            elif probe.models is None:
                models = list(suite.models)
            else:
                models = [suite.model(n) for n in probe.models]
            for model in models:
                for point in probe.points():
                    job = _job(device, probe, model, point, timeout_s or probe.timeout_s or suite.timeout_s)
                    job = replace(job, identity=file_identity(job, suite.path.parent, hashes))
                    if job.key not in seen:  # two probe tables asking the same thing measure it once
                        seen.add(job.key)
                        jobs.append(job)
    return interleave(jobs)


def file_identity(job: Job, base: Path, hashes: HashCache) -> dict[str, str]:
    """What stands for each file the job reads in its key (see `Job.identity`)."""
    out = {}
    if job.model is not None and all(path.is_file() for path in job.model.files):
        out["model"] = f"sha256:{hashes.content(job.model.files)}"
    for key in PATH_PARAMS:
        value = job.params.get(key)
        if not isinstance(value, str) or not value or value.startswith(BUILTIN_PREFIX):
            continue
        path = Path(value)
        if path.is_file():
            out[key] = f"sha256:{hashes.sha256(path)}"
        elif path.is_absolute():
            out[key] = f"path:{os.path.relpath(path, base)}"
    return out


def model_digests(suite: Suite) -> dict[str, str]:
    """Each suite model's content hash, by name: kept with a run, so a resume sees a model that changed."""
    hashes = HashCache()
    return {
        m.name: f"sha256:{hashes.content(m.files)}" for m in suite.models if all(p.is_file() for p in m.files)
    }


def jobs_by_device(jobs: list[Job]) -> dict[str, list[Job]]:
    out: dict[str, list[Job]] = {}
    for job in jobs:
        out.setdefault(job.device, []).append(job)
    return out


def _job(
    device: str, probe: ProbeSpec, model: ModelRef | None, point: dict[str, Any], timeout_s: float | None
) -> Job:
    params = dict(point)
    runtime = params.pop("runtime", None)
    if runtime is None and model is not None:
        runtime = runtime_of(model, None)  # the runtime whose own format the model's is
    return Job(
        device=device, probe=probe.kind, model=model, runtime=runtime, params=params, timeout_s=timeout_s
    )


# ---- parts of the file -------------------------------------------------------------------------------------
def _device_list(r: TableReader, key: str) -> tuple[str, ...]:
    names = r.str_list(key)
    if not names:
        raise r.error(key, "needs at least one device")
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise r.error(f"{key}[{i}]", f"device '{n}' is listed twice")
    return names


def _models(r: TableReader, path: Path) -> list[ModelRef]:
    entries = r.get("models", list, [])
    base = path.resolve().parent
    models: list[ModelRef] = []
    for i, entry in enumerate(entries):
        key = f"models[{i}]"
        if isinstance(entry, str):
            ref, name = entry, None
        elif isinstance(entry, dict):
            t = TableReader(entry, path, f"{key}.")
            name = t.get("name", str)
            ref = t.get("path", str)
            t.done()
            if not name.strip():
                raise r.error(f"{key}.name", "must not be empty")
        else:
            raise r.error(key, "expected a path string or a table {name, path}")
        try:
            model = resolve_model(ref, base, name)
        except EdgebenchError as exc:
            raise r.error(key, str(exc)) from None
        if any(m.name == model.name for m in models):
            raise r.error(
                key,
                f"model name '{model.name}' is used twice (name one of them: "
                f'{{name = "...", path = "{ref}"}})',
            )
        models.append(model)
    return models


def _probes(r: TableReader, path: Path, models: list[ModelRef], devices: tuple[str, ...]) -> list[ProbeSpec]:
    tables = r.get("probe", list, [])
    out = []
    for i, table in enumerate(tables):
        if not isinstance(table, dict):
            raise r.error(f"probe[{i}]", "expected a [[probe]] table")
        out.append(_probe(TableReader(table, path, f"probe[{i}]."), path, models, devices))
    return out


def _probe(t: TableReader, path: Path, models: list[ModelRef], devices: tuple[str, ...]) -> ProbeSpec:
    kind_name = t.get("kind", str)
    kind = KINDS.get(kind_name)
    if kind is None:
        raise t.error("kind", f"unknown probe '{kind_name}' (known: {', '.join(sorted(KINDS))})")
    needs_model = kind.needs_model
    grid = _grid(t, path, kind, {m.name: m for m in models})
    model_names: tuple[str, ...] | None = None
    if t.has("models"):
        model_names = t.str_list("models")
        known = [m.name for m in models]
        for j, n in enumerate(model_names):
            if n not in known:
                raise t.error(f"models[{j}]", f"not a model of this suite: '{n}' (known: {', '.join(known)})")
        if not needs_model and model_names:
            raise t.error("models", f"probe '{kind_name}' measures the device and takes no model")
    elif needs_model and not models:
        raise t.error(
            "kind", f"probe '{kind_name}' needs models but the suite lists none (add `models = [...]`)"
        )
    probe_devices: tuple[str, ...] | None = None
    if t.has("devices"):
        probe_devices = _device_list(t, "devices")
        for j, n in enumerate(probe_devices):
            if n not in devices:
                raise t.error(f"devices[{j}]", f"'{n}' is not one of the suite's devices")
    timeout = _positive(t, "timeout", None)
    t.done()
    return ProbeSpec(
        kind=kind_name,
        grid=grid,
        models=model_names,
        devices=probe_devices,
        timeout_s=timeout,
        needs_model=needs_model,
    )


def _grid(
    t: TableReader, path: Path, kind: ProbeKind, models: dict[str, ModelRef]
) -> dict[str, tuple[Any, ...]]:
    """The params table as grid axes, every point checked by the probe's typed params now (exit 2 naming
    the suite file, probe and key), not as error records once the run is under way."""
    params = t.table("params")
    grid: dict[str, tuple[Any, ...]] = {}
    for key, value in params._data.items():
        params.raw(key)
        values = tuple(value) if isinstance(value, list) else (value,)
        if not values:
            raise params.error(key, "an empty list gives no jobs")
        if key == "runtime":
            _check_runtimes(params, values)
        elif key in PATH_PARAMS:
            # A suite model's name stands for its file (`reference = "enc"`); other values are paths.
            values = tuple(
                str(models[v].path) if isinstance(v, str) and v in models else _suite_relative(v, path)
                for v in values
            )
        grid[key] = values
    params.done()
    for point in ProbeSpec(kind.name, grid).points():
        try:
            kind.params.parse({k: v for k, v in point.items() if k != "runtime"})
        except ParamError as exc:
            raise params.error(exc.key, exc.reason) from None
    return grid


def _check_runtimes(t: TableReader, values: tuple[Any, ...]) -> None:
    known = RUNTIMES
    for v in values:
        if not isinstance(v, str) or (known and v not in known):
            raise t.error("runtime", f"unknown runtime {v!r} (known: {', '.join(known)})")


def _suite_relative(value: Any, path: Path) -> Any:
    if not isinstance(value, str) or value.startswith(BUILTIN_PREFIX) or not value:
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (path.resolve().parent / p))


def _gates(r: TableReader, path: Path) -> list[GateSpec]:
    out = []
    for i, table in enumerate(r.get("gate", list, [])):
        if not isinstance(table, dict):
            raise r.error(f"gate[{i}]", "expected a [[gate]] table")
        t = TableReader(table, path, f"gate[{i}].")
        rule = GateSpec(
            metric=t.get("metric", str),
            stat=t.get("stat", str, None),
            probe=t.get("probe", str, None),
            device=t.get("device", str, None),
            model=t.get("model", str, None),
            **{k: _fraction(t, k) for k in _GATE_THRESHOLDS},
            replace_defaults=t.get("replace_defaults", bool, False),
        )
        t.done()
        if all(getattr(rule, k) is None for k in _GATE_THRESHOLDS):
            raise r.error(f"gate[{i}]", "give max_slowdown, max_increase or max_drop")
        if rule.max_drop is not None and rule.max_drop >= 1:
            raise r.error(f"gate[{i}].max_drop", "a drop must be below 100%")
        out.append(rule)
    return out


def _fraction(t: TableReader, key: str) -> float | None:
    """'5%' or 0.05 -> 0.05. A string without % ("10") and a bare number of 1 or more (10) are errors: read
    as fractions they would allow 1000%; a threshold of 100% or more is written with %, "150%"."""
    value = t.get(key, (str, float, int), None)
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            float(text.rstrip("%"))
        except ValueError:
            raise t.error(key, f'expected a percentage like "5%" or a fraction, got {value!r}') from None
        if not text.endswith("%"):
            raise t.error(key, f'{value!r} has no %: write "{text}%" (or a fraction, 0.05 for 5%)')
        try:
            number = float(text[:-1]) / 100.0
        except ValueError:
            raise t.error(key, f'expected a percentage like "5%" or a fraction, got {value!r}') from None
    else:
        number = float(value)
        if number >= 1:
            raise t.error(
                key, f'{value!r} as a fraction is {number:.0%}: write "{value}%" or a fraction below 1'
            )
    if not math.isfinite(number) or number < 0:
        raise t.error(key, "must not be negative")
    return number


# Every name _BUDGET_KEY accepts, spelled out: what a misspelt budget is compared with.
_BUDGET_NAMES = (
    *(f"latency_{s}_ms" for s in ("p50", "p90", "p99", "mean", "min", "max")),
    *(f"rtf_{s}" for s in ("p50", "p90", "p99", "mean")),
    "memory_mb", "energy_mj", "load_ms", "cold_load_ms", "decode_tokens_per_s_min",
)  # fmt: skip


def _budget(t: TableReader) -> dict[str, float]:
    out = {}
    for key in list(t._data):
        if not _BUDGET_KEY.match(key):
            close = difflib.get_close_matches(key, _BUDGET_NAMES, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise t.error(
                key,
                f"unknown budget ({hint}use latency_<p50|p90|p99|mean|min|max>_ms, memory_mb, energy_mj, "
                "load_ms, cold_load_ms, rtf_<p50|p90|p99|mean>, decode_tokens_per_s_min)",
            )
        value = t.get(key, float)
        if value <= 0:
            raise t.error(key, "must be positive")
        out[key] = float(value)
    t.done()
    return out


def _policy(t: TableReader) -> RunPolicy:
    d = RunPolicy()
    retries = t.get("retries", int, d.retries)
    quarantine = t.get("quarantine_after", int, d.quarantine_after)
    if retries < 0:
        raise t.error("retries", "must be 0 or more")
    if quarantine < 1:
        raise t.error("quarantine_after", "must be 1 or more")
    policy = RunPolicy(
        retries=retries,
        backoff_s=_non_negative(t, "backoff", d.backoff_s),
        max_backoff_s=_non_negative(t, "max_backoff", d.max_backoff_s),
        quarantine_after=quarantine,
        cooldown=t.get("cooldown", bool, d.cooldown),
        cooldown_timeout_s=_non_negative(t, "cooldown_timeout", d.cooldown_timeout_s),
        lease_timeout_s=_positive(t, "lease_timeout", None),
        worker_grace_s=_non_negative(t, "worker_grace", d.worker_grace_s),
        store_timeout_s=_positive(t, "store_timeout", d.store_timeout_s) or d.store_timeout_s,
    )
    t.done()
    return policy


def _positive(t: TableReader, key: str, default: float | None) -> float | None:
    """A time limit or duration: a positive, finite number (TOML also spells nan and inf)."""
    value = t.get(key, float, default)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise t.error(key, f"must be a positive number of seconds, got {value:g}")
    return value


def _non_negative(t: TableReader, key: str, default: float) -> float:
    value = t.get(key, float, default)
    if not (math.isfinite(value) and value >= 0):
        raise t.error(key, f"must be a finite number, not negative, got {value:g}")
    return float(value)


def rules_from_suite(path: Path) -> list[GateRule]:
    """The suite's `[[gate]]` tables, as `load_suite` reads them (strictly; thresholds are
    fractions, "5%" or 0.05), turned into rules: one per threshold a table gives."""
    suite = load_suite(path)
    rules = []
    for i, g in enumerate(suite.gates):
        given = [
            (k, getattr(g, k))
            for k in ("max_slowdown", "max_increase", "max_drop")
            if getattr(g, k) is not None
        ]
        if not given:
            raise ConfigError(path, f"gate[{i}]: give max_slowdown, max_increase or max_drop")
        for kind, amount in given:
            if kind == "max_drop" and amount >= 1:
                raise ConfigError(path, f"gate[{i}].max_drop: a drop must be below 100%")
            worse = "lower" if kind == "max_drop" else "higher"
            rules.append(
                GateRule(
                    g.metric,
                    worse,
                    Threshold(amount, True),
                    stat=g.stat or DEFAULT_STAT,
                    probe=g.probe,
                    device=g.device,
                    model=g.model,
                    source=f"{Path(path).name} gate[{i}]",
                    kind=kind,
                    required=True,
                    replaces_defaults=g.replace_defaults,
                )
            )
    return rules
