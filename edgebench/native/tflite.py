"""TFLite / LiteRT `benchmark_model` (LiteRT tflite/tools/benchmark, once tensorflow/lite/tools/benchmark).

Rules, with the upstream source each is read from (LiteRT f6745779 unless said otherwise) and the versions
it covers:

- Log lines carry an `INFO: ` / `WARN: ` / `ERROR: ` / `VERBOSE: ` prefix in current builds
  (tflite/tools/logging.h:76-86; ERROR and FATAL go to stderr) and none in TF <= 2.3 captures; both are
  read. A failed run's reason is its first ERROR/FATAL line, told by that prefix.
- Timed runs: each `Running benchmark for at least N iterations ...` line (benchmark_model.cc:226) is
  followed by that phase's stat line (:273); the first is the warm-up, the last the timed runs. The stat
  line (xla/tsl/util/stats_calculator.h, Stat::OutputToStream) is `count=0` (a phase that ran nothing:
  no warm-up, or max_secs spent), `count=N curr=X` (every run the same, as one timed run gives: `--runs 1
  --invocations N`), or `count= first= curr= min= max= avg= std=`; StatWithPercentiles appends ` p5=
  median= p95=` (values[n*p/100], nearest rank; 0 when empty). The warm-up's count is the tool's own
  count of warm-up inferences (at least 0.5 s of them by default): energy per inference uses it.
  `First inference:` (:90) is the warm-up's first run, and 0 when there was none: then not a time. The
  profiler's own
  `Timings (microseconds): count=...` summary (stats_calculator.cc, GetShortSummary) is the sum of the
  profiled ops, not the latency, and is never read as such.
- Memory: `Overall peak memory footprint (MB) via periodic monitoring: X` (benchmark_model.cc:106, with
  `--report_peak_memory_footprint=true`) is the process peak, recorded as peak_rss_mb. `Memory footprint
  delta from the start of the tool (MB): init= overall=` (benchmark_model.cc:99) and the TF <= 2.3
  `Peak memory footprint (MB): init= overall=` (the growth of max RSS since the tool started) are growth,
  recorded as memory_growth_mb, never as a peak.
- Delegates (benchmark_tflite_model.cc:1296-1362): `Failed to apply X delegate.`; `Explicitly applied X
  delegate, and the model graph will be completely|partially executed by the delegate[ w/ N delegate
  kernels].`; `Though X delegate is explicitly applied, the model graph will not be executed by the
  delegate.` The default XNNPACK delegate says `Created TensorFlow Lite XNNPACK delegate for CPU.`
  (delegates/xnnpack/xnnpack_delegate.cc:682) and, where VERBOSE is on (Android builds; a Linux build logs
  from INFO up, minimal_logging_default.cc:30), `Replacing N out of M node(s) with delegate
  (TfLiteXNNPackDelegate) node, yielding K partitions for subgraph S (NAME).` (core/subgraph.cc:581).
  Without that line or an op profile the default delegate's share of the graph is "unknown". A flag the binary
  does not know (a delegate not compiled in) is only `WARN: Unconsumed cmdline flags: ...`
  (benchmark_model.cc:385): here it is an error when it is the delegate or precision asked for.
- Precision: `--allow_fp16` only reaches the interpreter's own kernels and NNAPI; XNNPACK needs
  `--xnnpack_force_fp16` (xnnpack_delegate_provider.cc:32, applied only with `--use_xnnpack=true`), NNAPI
  `--nnapi_allow_fp16` (nnapi_delegate_provider.cc:61), and `--gpu_precision_loss_allowed` defaults to true
  (gpu_delegate_provider.cc:40), so fp32 on the GPU is asked for explicitly; the other fp16 flags default to
  false and are passed only for fp16 (an older build refuses a flag it does not know).
- Warm-up: `--warmup_runs` is a minimum beside `--warmup_min_secs` (default 0.5 s, benchmark_model.cc:69):
  both are set.
- Op tables (stats_calculator.cc, HeaderString/ColumnString): current builds print 8 columns `[node type]
  [first] [avg ms] [%] [cdf%] [mem KB] [times called] [Name]`, TF 1.x-2.3 a 9th `[start]`; columns are
  found by their header, per table.
"""

from __future__ import annotations

import re
from typing import Any

from .base import (
    KILLED,
    NativeOptions,
    NativeResult,
    NativeToolError,
    crash_reason,
    first_error_line,
    killed_from_outside,
)

_PREFIX = re.compile(r"^\s*(?P<severity>INFO|WARN|WARNING|ERROR|VERBOSE|FATAL): ?")
# Stat::OutputToStream: `count=0` (no run), `count=N curr=X[(all same)]` or the full form; percentiles follow
# from StatWithPercentiles (an empty one prints 0 for each: int64's quiet_NaN()).
_STAT = re.compile(
    r"^count=(?P<count>\d+)(?: first=(?P<first>-?\d+))?(?: curr=(?P<curr>-?\d+)(?:\(all same\))?)?"
    r"(?: min=(?P<min>-?\d+) max=(?P<max>-?\d+) avg=(?P<avg>[\d.e+-]+|nan) std=(?P<std>\d+))?"
    r"(?: p5=(?P<p5>-?\d+) median=(?P<median>-?\d+) p95=(?P<p95>-?\d+))?\s*$"
)
_PHASE = "Running benchmark for at least"
_REPLACING = re.compile(
    r"Replacing (\d+) out of (\d+) node\(s\) with delegate \((\w+)\) node, yielding (\d+) partitions"
    r"(?: for subgraph (\d+))?"
)
# edgebench delegate name -> (the flag that turns it on, the provider name the tool logs)
_DELEGATES = {
    "xnnpack": ("--use_xnnpack=true", "XNNPACK"),
    "nnapi": ("--use_nnapi=true", "NNAPI"),
    "gpu": ("--use_gpu=true", "GPU"),
    "hexagon": ("--use_hexagon=true", "Hexagon"),
    "cpu": ("--use_xnnpack=false", ""),
}
_ERRORS = (
    "Failed to apply",
    "Benchmarking failed",
    "Failed to mmap",
    "Failed to load",
    "Failed to allocate",
    "Failed to invoke",
    "Disallowed CPU fallback",
    "Could not open",
    "failed to prepare",
)


class TfliteBenchmarkModel:
    name = "benchmark_model"
    runtime = "litert"
    model_suffix = ".tflite"
    needs_model_dir = False
    profile_to_file = False  # the op table is printed

    def argv(self, binary: str, model: str, opts: NativeOptions) -> list[str]:
        args = [
            binary,
            f"--graph={model}",
            f"--warmup_runs={opts.warmup}",
            f"--warmup_min_secs={opts.warmup_seconds:g}",
            f"--num_runs={opts.runs}",
            f"--min_secs={opts.min_seconds:g}",
            f"--max_secs={opts.max_seconds:g}",
            "--report_peak_memory_footprint=true",
        ]
        if opts.threads:
            args.append(f"--num_threads={opts.threads}")
        delegate = opts.delegate
        if delegate and delegate not in _DELEGATES:
            raise NativeToolError(
                self.name, f"unknown delegate '{delegate}' (use {', '.join(_DELEGATES)})", kind="usage"
            )
        fp16 = opts.precision in ("fp16", "low")
        if fp16 and delegate in (None, "xnnpack"):
            delegate = "xnnpack"  # force_fp16 reaches XNNPACK only when it is applied explicitly
        if delegate:
            args.append(_DELEGATES[delegate][0])
        args += _precision_flags(delegate, fp16, self.name)
        if opts.profile:
            args.append("--enable_op_profiling=true")
        return args

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult:
        raw = output.splitlines()
        lines = [_PREFIX.sub("", ln).strip() for ln in raw]
        phases = _phase_stats(lines)
        if returncode != 0 or not phases:
            raise NativeToolError(self.name, *_failure(raw, lines, returncode))
        timed = phases[-1]  # the warm-up comes first, when the tool ran one
        if timed["count"] == 0:
            raise NativeToolError(
                self.name,
                "the timed phase ran no inference (count=0): max_seconds ran out in the warm-up, or "
                "num_runs and min_secs were 0",
                "measurement",
            )
        result = NativeResult(aggregates=_aggregates(timed), count=timed["count"])
        if len(phases) > 1:
            result.warmup_count = phases[0]["count"]
        if "p50" in result.aggregates:
            result.notes["percentile_method"] = "tool: nearest rank, values[n*p/100]"
        _timings(result, lines, phases)
        _memory(result, lines)
        result.ops = _run_order(lines)
        _unconsumed(result, lines, opts)
        _placement(result, lines, opts)
        _precision(result, lines, opts)
        return result


def _precision_flags(delegate: str | None, fp16: bool, tool: str) -> list[str]:
    """Flags that make the asked precision the one that runs (fp32 unless fp16/low is asked). A flag
    whose default already is fp32 is not passed for fp32 (a build older than the flag refuses it):
    only the GPU delegate defaults to lower precision (gpu_delegate_provider.cc:40)."""
    if delegate == "gpu":
        return [f"--gpu_precision_loss_allowed={'true' if fp16 else 'false'}"]
    if not fp16:
        return []
    if delegate == "nnapi":
        return ["--nnapi_allow_fp16=true", "--allow_fp16=true"]
    if delegate == "xnnpack":
        return ["--xnnpack_force_fp16=true"]
    raise NativeToolError(tool, f"no fp16 switch for the {delegate} delegate", kind="usage")


def _failure(raw: list[str], lines: list[str], returncode: int) -> tuple[str, str]:
    """(reason, kind) of a run without a result: the tool's first ERROR/FATAL line (its prefix says so,
    benchmark_model's logging.h), else the first line naming a known failure, else how it ended."""
    logged = [ln for r, ln in zip(raw, lines, strict=True) if _severity(r) in ("ERROR", "FATAL") and ln]
    reason = logged[0] if logged else first_error_line("\n".join(lines), _ERRORS)
    if reason is None:
        crash = crash_reason(returncode)
        reason = killed_from_outside(returncode) or (
            f"crashed ({crash})" if crash else f"exited {returncode} without a result"
        )
    kind = "delegate" if "delegate" in reason.lower() or "fallback" in reason.lower() else "model"
    return reason, KILLED if reason == killed_from_outside(returncode) else kind


def _severity(line: str) -> str | None:
    match = _PREFIX.match(line)
    return match.group("severity") if match else None


def _phase_stats(lines: list[str]) -> list[dict[str, Any]]:
    """Each phase's stat line, in order: the first `count=...` line after each `Running benchmark for at
    least ...` line (benchmark_model.cc:226 then :273), `count=0` included. Captures without phase lines
    (TF <= 2.3 printed them too, but a log may be cut) fall back to every bare `count=...` line; the
    profiler's `Timings (microseconds): count=...` and `Memory (bytes): count=...` are never one."""
    starts = [i for i, ln in enumerate(lines) if ln.startswith(_PHASE)]
    if starts:
        ends = [*starts[1:], len(lines)]
        spans = zip(starts, ends, strict=True)
        found = (next(filter(None, map(_stat, lines[a + 1 : b])), None) for a, b in spans)
        return [stat for stat in found if stat is not None]
    return [stat for stat in map(_stat, lines) if stat is not None]


def _stat(line: str) -> dict[str, Any] | None:
    match = _STAT.match(line)
    if not match:
        return None
    stat: dict[str, Any] = {k: (float(v) if v is not None else None) for k, v in match.groupdict().items()}
    stat["count"] = int(match.group("count"))
    return stat


def _aggregates(stat: dict[str, Any]) -> dict[str, float]:
    """In ms. `count=N curr=X` means every run took X (or N is 1): min = max = mean = X, std 0."""
    if stat["avg"] is None:
        x = stat["curr"] / 1e3
        return {"min": x, "max": x, "mean": x, "std": 0.0}
    out = {
        "min": stat["min"] / 1e3,
        "max": stat["max"] / 1e3,
        "mean": stat["avg"] / 1e3,
        "std": stat["std"] / 1e3,
    }
    if stat["median"] is not None:
        out.update(p5=stat["p5"] / 1e3, p50=stat["median"] / 1e3, p95=stat["p95"] / 1e3)
    return out


def _number(pattern: str, lines: list[str]) -> float | None:
    for line in lines:
        match = re.search(pattern, line)
        if match:
            return float(match.group(1))
    return None


def _timings(result: NativeResult, lines: list[str], phases: list[dict[str, Any]]) -> None:
    """Load and first inference. `First inference:` is the warm-up's first run (benchmark_model.cc:90);
    with no warm-up run the tool prints its empty Stat's 0, which is no time at all."""
    init_us = _number(r"Inference timings in us: Init: ([\d.e+-]+)", lines)
    first_us = _number(r"First inference: ([\d.e+-]+)", lines)
    init_ms = _number(r"Initialized session in ([\d.e+-]+)\s*ms", lines)
    result.load_ms = init_us / 1e3 if init_us is not None else init_ms
    warmed = result.warmup_count
    if warmed == 0 or (warmed is None and first_us == 0):
        result.notes["first_inference"] = "not measured: the tool ran no warm-up run"
    elif first_us is not None:
        result.first_ms = first_us / 1e3
    elif len(phases) > 1 and phases[0]["count"]:
        result.first_ms = (phases[0]["first"] or phases[0]["curr"]) / 1e3


def _memory(result: NativeResult, lines: list[str]) -> None:
    result.peak_memory_mb = _number(r"Overall peak memory footprint \(MB\)[^:]*: ([\d.e+-]+)", lines)
    delta = r"Memory footprint delta from the start of the tool \(MB\): init=[\d.e+-]+ overall=([\d.e+-]+)"
    growth = _number(delta, lines)
    if growth is None:
        growth = _number(r"^Peak memory footprint \(MB\): init=[\d.e+-]+ overall=([\d.e+-]+)", lines)
    result.memory_growth_mb = growth
    if result.peak_memory_mb is None and growth is not None:
        result.warnings.append(
            "benchmark_model printed only the memory growth since it started, not a peak "
            "(a build without --report_peak_memory_footprint): no peak_rss_mb"
        )


def _unconsumed(result: NativeResult, lines: list[str], opts: NativeOptions) -> None:
    """Flags the binary does not know: an error when they carry the delegate or precision asked for."""
    for line in lines:
        if not line.startswith("Unconsumed cmdline flags:"):
            continue
        flags = line.split(":", 1)[1].split()
        vital = [f for f in flags if f.startswith(("--use_", "--xnnpack_force_fp16", "--gpu_precision"))]
        vital += [f for f in flags if f.startswith(("--nnapi_allow_fp16", "--allow_fp16"))]
        if vital:
            raise NativeToolError(
                "benchmark_model",
                f"this build does not know {' '.join(vital)} (Unconsumed cmdline flags): the delegate or "
                "precision asked for is not compiled in, and the run would be on the CPU",
                "delegate",
            )
        result.warnings.append(f"benchmark_model ignored unknown flags: {' '.join(flags)}")


def _placement(result: NativeResult, lines: list[str], opts: NativeOptions) -> None:
    """Which delegate ran, and over how much of the graph, from what the tool says."""
    applied: dict[str, str] = {}
    for line in lines:
        match = re.match(
            r"Explicitly applied (\S+) delegate, and the model graph will be (\w+) executed", line
        )
        if match:
            applied[match.group(1).lower()] = "full" if match.group(2) == "completely" else "partial"
        match = re.match(r"Though (\S+) delegate is explicitly applied, the model graph will not be", line)
        if match:
            raise NativeToolError(
                "benchmark_model",
                f"the {match.group(1)} delegate was applied but runs none of the graph: "
                "the run is on the CPU",
                "delegate",
            )
    asked = opts.delegate
    if asked and asked != "cpu" and asked not in applied:
        raise NativeToolError(
            "benchmark_model",
            f"asked for the {asked} delegate; the tool never said it applied it",
            "delegate",
        )
    if (
        not applied
        and any("Created TensorFlow Lite XNNPACK delegate" in ln for ln in lines)
        and asked != "cpu"
    ):
        applied["xnnpack"] = _default_xnnpack_coverage(lines, result)
    name = next(iter(applied), "cpu")
    coverage = applied.get(name, "full")
    result.path = {"full": name, "partial": f"{name}+cpu"}.get(coverage, f"{name}+unknown")
    result.applied["delegate"] = name
    result.notes["delegated"] = coverage
    if asked:
        result.notes["delegate_asked"] = asked
    if coverage == "partial":
        result.warnings.append(f"the {name} delegate runs part of the graph; the rest runs on the CPU")
    if coverage != "full" and opts.require_backend:
        raise NativeToolError(
            "benchmark_model",
            f"the {name} delegate is required, and it runs {coverage} of the graph "
            f"({result.notes.get('placement_evidence', 'the tool printed no placement')})",
            "delegate",
        )


def _default_xnnpack_coverage(lines: list[str], result: NativeResult) -> str:
    """The default XNNPACK delegate's share of the graph: full when every `Replacing N out of M node(s)`
    line (core/subgraph.cc:581, VERBOSE: printed by Android builds, not by a Linux build's default INFO
    level) replaced all nodes in one partition, or when every profiled op ran inside the delegate;
    "unknown" when the tool printed neither: creating the delegate is no evidence of what it took."""
    seen = [m for m in map(_REPLACING.search, lines) if m and m.group(3) == "TfLiteXNNPackDelegate"]
    if seen:
        full = all(int(m.group(1)) == int(m.group(2)) and int(m.group(4)) == 1 for m in seen)
        result.notes["placement_evidence"] = "; ".join(m.group(0) for m in seen)
        return "full" if full else "partial"
    if result.ops:
        inside = [node.startswith("Delegate/") for node, _, _ in result.ops]
        outside = len(inside) - sum(inside)
        evidence = f"op profile: {outside} of {len(inside)} ops outside the delegate"
        result.notes["placement_evidence"] = evidence
        return "full" if all(inside) else "partial"
    result.notes["placement_evidence"] = (
        "none printed (no VERBOSE 'Replacing N out of M node(s)' line, no op profile)"
    )
    result.warnings.append(
        "benchmark_model created the default XNNPACK delegate but printed no placement: how much of the "
        "graph it runs is unknown (set profile = true for the op table)"
    )
    return "unknown"


def _precision(result: NativeResult, lines: list[str], opts: NativeOptions) -> None:
    fp16 = opts.precision in ("fp16", "low")
    echoed = {
        "xnnpack": r"^xnnpack_force_fp16: \[(\d)\]",
        "gpu": r"^Allow lower precision in gpu: \[(\d)\]",
        "nnapi": r"^Allow fp16 in NNAPI: \[(\d)\]",
    }.get(result.applied.get("delegate", ""))
    value = _number(echoed, lines) if echoed else None
    if value is not None:
        result.applied["precision"] = "fp16" if value else "fp32"
    elif fp16:
        result.applied["precision"] = "fp16"
        result.notes["precision_source"] = "asked (the tool did not echo it)"
    else:
        result.applied["precision"] = "fp32"
        result.notes["precision_source"] = "the tool's default (fp16 flags left unset)"
    if opts.precision:
        result.notes["precision_asked"] = opts.precision


def _run_order(lines: list[str]) -> list[tuple[str, str, float]]:
    """(node, op type, avg ms) from the 'Run Order' table of the regular (not the init) runs."""
    marker = "Operator-wise Profiling Info for Regular"
    start = max((i for i, ln in enumerate(lines) if ln.startswith(marker)), default=-1)
    if start < 0:
        return []
    rows = lines[start:]
    try:
        table = next(i for i, ln in enumerate(rows) if "Run Order" in ln and ln.startswith("="))
    except StopIteration:
        return []
    header = [c.strip() for c in _cells(rows[table + 1])]
    try:
        col_type, col_avg = header.index("[node type]"), header.index("[avg ms]")
        col_name = header.index("[Name]")
    except ValueError:
        return []
    ops = []
    for line in rows[table + 2 :]:
        cells = _cells(line)
        if not line or line.startswith("=") or len(cells) < len(header):
            break
        try:
            ops.append((cells[col_name].strip(), cells[col_type].strip(), float(cells[col_avg])))
        except ValueError:
            break
    return ops


def _cells(line: str) -> list[str]:
    """Tab-separated cells without the leading empty ones (the tables start each line with tabs)."""
    cells = line.split("\t")
    while cells and not cells[0].strip():
        cells.pop(0)
    return cells
