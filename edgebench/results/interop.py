"""pytest-benchmark interop: a run as pytest-benchmark JSON, and pytest-benchmark JSON into the store.

Export: every time series with raw samples (bench `latency_ms`, in ms) becomes one benchmark whose
`stats` (in seconds, as pytest-benchmark keeps them) are computed from the samples, which go in
`stats.data`; single time values without samples (`load_ms`, `first_inference_ms`) become one-round
benchmarks; other single values of the same measurement (`peak_rss_mb` ...) ride along in `extra_info`.
Quartiles use numpy's linear interpolation (pytest-benchmark's own quartile method differs by at most one
sample's spacing). `pytest-benchmark compare` reads the file.

Import: each benchmark becomes probe `bench`, model = its fullname, runtime `python`, device = the file's
`machine_info.node` unless one is given; its stats become `latency_ms` records (p50 from the median, mean,
min, max, p25/p75 from the quartiles; p90/p99 when raw `data` was saved and is long enough) and its raw
`data` (saved with `--benchmark-save-data`) becomes `latency_ms` samples, so `gate` can test them.
Records carry the file's `datetime`, so `history` orders imports by when they were measured.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..records import Record, Samples, new_run_id, utc_now
from ..stats import summarize

FORMAT_VERSION = "5.1.0"  # the pytest-benchmark JSON layout written and read here
_TIME_SCALE = {"ms": 1e-3, "s": 1.0, "us": 1e-6, "ns": 1e-9}


# ---- export --------------------------------------------------------------------------------------------


def pytest_benchmark_stats(seconds: Sequence[float], include_data: bool = True) -> dict[str, Any]:
    """pytest-benchmark's `stats` block for per-round times in seconds."""
    x = np.sort(np.asarray(seconds, dtype=float))
    n = int(x.size)
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    q1, q3 = (float(v) for v in np.percentile(x, [25, 75]))
    iqr = q3 - q1
    lo_fence, hi_fence = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    inside = x[(x >= lo_fence) & (x <= hi_fence)]
    std_out = int(np.sum((x < mean - std) | (x > mean + std)))
    iqr_out = int(np.sum((x < lo_fence) | (x > hi_fence)))
    out: dict[str, Any] = {
        "min": float(x[0]),
        "max": float(x[-1]),
        "mean": mean,
        "stddev": std,
        "rounds": n,
        "median": float(np.median(x)),
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": iqr_out,
        "stddev_outliers": std_out,
        "outliers": f"{std_out};{iqr_out}",
        "ld15iqr": float(inside[0]) if inside.size else float(x[0]),
        "hd15iqr": float(inside[-1]) if inside.size else float(x[-1]),
        "ops": 1.0 / mean if mean > 0 else 0.0,
        "total": float(x.sum()),
    }
    if include_data:
        out["data"] = [float(v) for v in seconds]
    out["iterations"] = 1
    return out


def _stats_from_records(recs: dict[str, float], scale: float) -> dict[str, Any] | None:
    """A stats block from stored statistics when the raw samples were not kept."""
    if "p50" not in recs and "mean" not in recs:
        return None
    median = recs["p50"] if "p50" in recs else recs["mean"]
    mean = recs.get("mean", median)
    q1, q3 = recs.get("p25", median), recs.get("p75", median)
    std = recs.get("stddev", 0.0)
    rounds = int(recs.get("rounds", 1))
    raw = {
        "min": recs.get("min", median),
        "max": recs.get("max", median),
        "mean": mean,
        "median": median,
        "q1": q1,
        "q3": q3,
        "stddev": std,
    }
    vals = {k: v * scale for k, v in raw.items()}
    return {
        "min": vals["min"],
        "max": vals["max"],
        "mean": vals["mean"],
        "stddev": vals["stddev"],
        "rounds": rounds,
        "median": vals["median"],
        "iqr": vals["q3"] - vals["q1"],
        "q1": vals["q1"],
        "q3": vals["q3"],
        "iqr_outliers": 0,
        "stddev_outliers": 0,
        "outliers": "0;0",
        "ld15iqr": vals["min"],
        "hd15iqr": vals["max"],
        "ops": 1.0 / vals["mean"] if vals["mean"] > 0 else 0.0,
        "total": vals["mean"] * rounds,
        "iterations": 1,
    }


def _bench_name(
    device: str, model: str, runtime: str, probe: str, metric: str, params: dict[str, Any]
) -> str:
    parts = [device, runtime] + [f"{k}={_short(v)}" for k, v in sorted(params.items())]
    what = "" if (probe, metric) == ("bench", "latency_ms") else f"{probe}.{metric}:"
    return f"{what}{model}[{'-'.join(parts)}]"


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{_short(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list | tuple):
        return "x".join(_short(v) for v in value)
    return str(value)


def _entry(
    key: tuple[Any, ...], stats: dict[str, Any], extra: dict[str, Any], options: dict[str, Any]
) -> dict[str, Any]:
    device, model, runtime, probe, metric, pkey = key
    params = json.loads(pkey)
    name = _bench_name(device, model, runtime, probe, metric, params)
    return {
        "group": device,
        "name": name,
        "fullname": f"edgebench::{name}",
        "params": params or None,
        "param": name[name.index("[") + 1 : -1],
        "extra_info": extra,
        "options": options,
        "stats": stats,
    }


def export_run(store: Any, run_id: str, include_data: bool = True) -> dict[str, Any]:
    """One stored run as a pytest-benchmark JSON document."""
    info = store.run(run_id)
    records = store.records([run_id])
    samples = store.samples([run_id])

    def key(r: Record | Samples) -> tuple[Any, ...]:
        return dataclasses.astuple(r.key().series())

    by_measurement: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(dict)
    stat_records: dict[tuple[Any, ...], dict[str, float]] = defaultdict(dict)
    single_times: dict[tuple[Any, ...], float] = {}
    for r in records:
        if r.value is None or not math.isfinite(r.value):
            continue
        k = key(r)
        if r.metric.endswith("_stddev_ms"):  # the spread of a series kept without samples (see import)
            stat_records[k[:4] + (r.metric[: -len("_stddev_ms")] + "_ms",) + k[5:]]["stddev"] = r.value
        elif "stat" in r.params and r.unit in _TIME_SCALE:
            stat_records[k][str(r.params["stat"])] = r.value
        elif r.unit in _TIME_SCALE:
            single_times[k] = r.value
        else:
            by_measurement[k[:4] + k[5:]][r.metric] = r.value

    benchmarks, done = [], set()
    opts = {
        "disable_gc": False,
        "timer": "edgebench-agent",
        "min_rounds": 1,
        "max_time": 0.0,
        "min_time": 0.0,
        "warmup": True,
    }
    for s in samples:
        k = key(s)
        if s.unit not in _TIME_SCALE or not s.values or k in done:
            continue
        pooled = [v for t in samples if key(t) == k for v in t.values]
        seconds = [v * _TIME_SCALE[s.unit] for v in pooled]
        extra = {"unit": s.unit, **by_measurement.get(k[:4] + k[5:], {})}
        benchmarks.append(_entry(k, pytest_benchmark_stats(seconds, include_data), extra, opts))
        done.add(k)
    for k, recs in stat_records.items():
        unit = next((r.unit for r in records if key(r) == k), "ms")
        if k in done:
            continue
        if "rounds" not in recs:
            n = by_measurement.get(k[:4] + k[5:], {}).get("samples_n")
            if n:
                recs["rounds"] = n
        stats = _stats_from_records(recs, _TIME_SCALE.get(unit, 1e-3))
        if stats is not None:
            benchmarks.append(_entry(k, stats, {"unit": unit, **by_measurement.get(k[:4] + k[5:], {})}, opts))
            done.add(k)
    for k, value in single_times.items():
        if k in done or k[4] == "latency_ms":
            continue
        unit = next((r.unit for r in records if key(r) == k), "ms")
        seconds = [value * _TIME_SCALE[unit]]
        benchmarks.append(_entry(k, pytest_benchmark_stats(seconds, include_data), {"unit": unit}, opts))
    if not benchmarks:
        raise UserError(f"run '{run_id}' has no time measurements to export")
    benchmarks.sort(key=lambda b: (b["group"], b["name"]))
    return {
        "machine_info": _machine_info(store, run_id, info.provenance),
        "commit_info": {
            "id": info.provenance.get("git_commit"),
            "time": info.created,
            "author_time": info.created,
            "dirty": False,
            "project": "edgebench",
            "branch": None,
        },
        "benchmarks": benchmarks,
        "datetime": _iso(info.created),
        "version": FORMAT_VERSION,
    }


def _machine_info(store: Any, run_id: str, provenance: dict[str, Any]) -> dict[str, Any]:
    devices = {d["device"]: d["fingerprint"] for d in store.device_info([run_id])}
    return {
        "node": ",".join(sorted(devices)) or provenance.get("host") or "edgebench",
        "processor": "",
        "machine": "",
        "python_compiler": "",
        "python_implementation": "CPython",
        "python_implementation_version": provenance.get("python", ""),
        "python_version": provenance.get("python", ""),
        "python_build": [],
        "release": "",
        "system": provenance.get("platform", ""),
        "cpu": {},
        "edgebench": {"run_id": run_id, "version": provenance.get("edgebench"), "devices": devices},
    }


def _iso(ts: str) -> str:
    return ts[:-1] + "+00:00" if ts.endswith("Z") else ts


# ---- import --------------------------------------------------------------------------------------------


def _fail(path: Path, where: str, message: str) -> UserError:
    return UserError(f"{path}: {where}: {message}" if where else f"{path}: {message}")


def _number(stats: dict[str, Any], key: str, path: Path, where: str, required: bool = True) -> float | None:
    value = stats.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(path, f"{where}.{key}", f"expected a number, got {value!r}")
    return float(value)


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _record_ts(doc: dict[str, Any]) -> str:
    """The file's datetime as a record timestamp (UTC, trailing Z); now when absent or unreadable."""
    raw = doc.get("datetime")
    if isinstance(raw, str):
        try:
            when = _dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
            if when.tzinfo is None:
                when = when.replace(tzinfo=_dt.UTC)
            return when.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        except ValueError:
            pass
    return utc_now()


def read_pytest_benchmark(path: Path) -> dict[str, Any]:
    """Load and shape-check a pytest-benchmark JSON file; a bad one is a one-line UserError."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise _fail(path, "benchmarks", "not a pytest-benchmark file (no benchmarks list)")
    return doc


def records_from_pytest_benchmark(
    doc: dict[str, Any], path: Path, run_id: str, device: str | None = None
) -> tuple[list[Record], list[Samples]]:
    """Records and samples for one pytest-benchmark document (validated field by field)."""
    machine = _table(doc, "machine_info")
    dev = device or str(machine.get("node") or "unknown")
    ts = _record_ts(doc)
    records: list[Record] = []
    samples: list[Samples] = []
    for i, bench in enumerate(doc["benchmarks"]):
        where = f"benchmarks[{i}]"
        if not isinstance(bench, dict):
            raise _fail(path, where, "expected an object")
        name = bench.get("fullname") or bench.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(path, f"{where}.fullname", "missing benchmark name")
        stats = bench.get("stats")
        if not isinstance(stats, dict):
            raise _fail(path, f"{where}.stats", "missing stats")

        def rec(metric: str, value: float, unit: str, bench_name: str = name, **params: Any) -> Record:
            return Record(run_id, dev, "bench", bench_name, "python", metric, value, unit, params, ts)

        data = stats.get("data")
        if data is not None:
            numbers = isinstance(data, list) and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in data
            )
            if not numbers or not data:
                raise _fail(path, f"{where}.stats.data", "expected a non-empty list of numbers")
            ms = [float(v) * 1000.0 for v in data]
            s = summarize(ms)
            values = {**s.percentiles, "mean": s.mean, "min": s.min, "max": s.max}
            records += [rec("latency_ms", v, "ms", stat=k) for k, v in values.items()]
            records.append(rec("latency_cv", s.cv, "ratio"))
            records.append(rec("samples_n", float(s.n), "count"))
            samples.append(
                Samples(run_id, dev, "bench", name, "python", "latency_ms", "ms", tuple(ms), {}, ts)
            )
        else:
            fields = {"p50": "median", "mean": "mean", "min": "min", "max": "max", "p25": "q1", "p75": "q3"}
            for stat, field in fields.items():
                value = _number(stats, field, path, f"{where}.stats", required=stat in ("p50", "mean"))
                if value is not None:
                    records.append(rec("latency_ms", value * 1000.0, "ms", stat=stat))
            std = _number(stats, "stddev", path, f"{where}.stats", required=False)
            mean = _number(stats, "mean", path, f"{where}.stats")
            if std is not None:
                records.append(rec("latency_stddev_ms", std * 1000.0, "ms"))
                records.append(rec("latency_cv", std / mean if mean else 0.0, "ratio"))
            rounds = _number(stats, "rounds", path, f"{where}.stats", required=False)
            if rounds is not None:
                records.append(rec("samples_n", rounds, "count"))
    if not records:
        raise _fail(path, "benchmarks", "no benchmarks in the file")
    return records, samples


def import_file(store: Any, path: Path, device: str | None = None) -> tuple[str, int, int]:
    """Import one pytest-benchmark file as a new run; returns (run_id, records, sample series)."""
    doc = read_pytest_benchmark(path)
    run_id = new_run_id()
    records, samples = records_from_pytest_benchmark(doc, path, run_id, device)
    machine, commit = _table(doc, "machine_info"), _table(doc, "commit_info")
    provenance = {
        "source": "pytest-benchmark",
        "file": Path(path).name,
        "datetime": doc.get("datetime"),
        "pytest_benchmark_version": doc.get("version"),
        "python": machine.get("python_version"),
        "host": machine.get("node"),
        "git_commit": commit.get("id"),
        "branch": commit.get("branch"),
    }
    store.import_records(run_id, records, samples, kind="pytest-benchmark", provenance=provenance)
    return run_id, len(records), len(samples)
