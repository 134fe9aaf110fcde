"""`onnxruntime_perf_test` (onnxruntime/test/perftest).

Rules, with the upstream source each is read from and the versions it covers:

- Inputs: `-I` generates them, and without `-S SEED` they are left unset: zeros (command_args_parser.cc,
  flag S: "defaults to -1 (no initialize)", 1.17 and later; older builds fill with zeros too). edgebench
  always passes `-S` with the job's seed. Even then only float, int8 and uint8 inputs are randomised
  (ort_test_session.cc, FillTensorDataTyped: uniform [0, 5) for float, [0, max] for int8/uint8); every
  other type (float16, int64 token ids, bool...) is filled with zeros, and the tool prints ` this type of
  data won't be random initialized` once per such input. The input types are read from the ONNX model on
  the host (NativeOptions.input_types); the note says which inputs ran on zeros.
- Counting: `-m times -r N` runs exactly N timed inferences after one warm-up inference (printed as
  `First inference time cost`); there is no warm-up count, warm-up duration, minimum or maximum duration:
  a warm-up other than 1, warmup_seconds, min_seconds and max_seconds are not applied and a warning says
  so. The invocation's inferences are N + 1 (energy per inference uses that).
- Placement: perf_test prints none, but onnxruntime logs at WARNING (perf_test's default level, main.cc:
  `Ort::Env(ORT_LOGGING_LEVEL_WARNING, "Default")`) `[W:onnxruntime:Default, session_state.cc:N
  VerifyEachNodeIsAssignedToAnEp] Some nodes were not assigned to the preferred execution providers ...`
  when any node fell back to another EP (the CPU). With that line a run asked of nnapi/qnn/... is recorded
  as partial (path `EP+cpu`, the line kept as evidence) and, when the backend is required, is an error;
  without it every node ran on the asked EP.
- Precision has no general flag; per execution provider through `-i`: NNAPI `NNAPI_FLAG_USE_FP16`, QNN
  `enable_htp_fp16_precision|0/1` (default 1: fp16), TensorRT `trt_fp16_enable|true`
  (command_args_parser.cc, flag i). fp32 is asked explicitly where the EP defaults to fp16.
- `-e`: the execution providers of command_args_parser.cc (-e); an unknown name makes the tool print its
  usage and exit 255, so it is refused before the run. `X is not supported in this build`
  (ort_test_session.cc) is a delegate error, not a model error.
- Output lines (performance_runner.cc): `Session creation time cost: X s`, `First inference time cost: X
  ms`, `Total inference requests: N`, `Average inference time cost[ total]: X ms` (" total" since 1.20),
  `Peak working set size: N bytes` and, with -s, `Min/Max/P50/P90/P95/P99/P999 Latency: X s`. Old builds
  (2020) print `cost:X` without the space.
- Errors: ONNX Runtime status text (`[ONNXRuntimeError] : 7 : INVALID_PROTOBUF ...`); a model that is not
  ONNX prints `Failed to load model because protobuf parsing failed.` (core/graph/model.cc).
- Profile: `-p PREFIX` makes onnxruntime write `PREFIX_<date>.json` (core/common/profiler.cc); the host
  pulls it after the run (probes/native.py).
"""

from __future__ import annotations

import re

from .base import (
    KILLED,
    NativeOptions,
    NativeResult,
    NativeToolError,
    crash_reason,
    first_error_line,
    killed_from_outside,
    number,
)

_PERCENTILES = {
    "min": "Min",
    "max": "Max",
    "p50": "P50",
    "p90": "P90",
    "p95": "P95",
    "p99": "P99",
    "p999": "P999",
}
_ERRORS = (
    "Failed to load model",
    "[ONNXRuntimeError]",
    "is not supported in this build",
    "failed:",
    "not supported",
    "Error",
    "error:",
)
PROVIDERS = (
    "cpu", "cuda", "dnnl", "openvino", "tensorrt", "qnn", "snpe", "nnapi", "vsinpu", "coreml", "dml",
    "acl", "migraphx", "xnnpack", "vitisai", "webgpu", "nvtensorrtrtx", "armnn", "rocm",
)  # fmt: skip
# EP -> (option for fp16, option for fp32 or None where fp32 is the EP's default)
_PRECISION = {
    "nnapi": ("NNAPI_FLAG_USE_FP16", None),
    "qnn": ("enable_htp_fp16_precision|1", "enable_htp_fp16_precision|0"),
    "tensorrt": ("trt_fp16_enable|true", None),
}


class OrtPerfTest:
    name = "onnxruntime_perf_test"
    runtime = "onnxruntime"
    model_suffix = ".onnx"
    needs_model_dir = False
    profile_to_file = True  # -p PREFIX: PREFIX_<date>.json

    def argv(self, binary: str, model: str, opts: NativeOptions) -> list[str]:
        ep = opts.delegate or "cpu"
        if ep not in PROVIDERS:
            raise NativeToolError(
                self.name, f"unknown execution provider '{ep}' (use {', '.join(PROVIDERS)})", kind="usage"
            )
        # -I: generated inputs (free dimensions as 1), -S: seeded random values (without it, zeros);
        # -s: latency percentiles; -m times -r N: a fixed count.
        args = [binary, "-I", "-S", str(opts.seed), "-s", "-m", "times", "-r", str(opts.runs), "-e", ep]
        if opts.threads:
            args += ["-x", str(opts.threads)]
        option = _precision_option(ep, opts.precision, self.name)
        if option:
            args += ["-i", option]
        if opts.profile and opts.profile_path:
            args += ["-p", opts.profile_path]
        args.append(model)
        return args

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult:
        count = number(r"Total inference requests:\s*(\d+)", output)
        avg = number(r"Average inference time cost(?: total)?:\s*([\d.e+-]+)\s*ms", output)
        if returncode != 0 or count is None or avg is None:
            raise NativeToolError(self.name, *_failure(output, returncode))
        ep = opts.delegate or "cpu"
        result = NativeResult(aggregates={"mean": avg}, count=int(count), path=ep)
        for stat, label in _PERCENTILES.items():
            seconds = number(rf"^\s*{label} Latency(?::| is)\s*([\d.e+-]+)\s*s", output, re.MULTILINE)
            if seconds is not None:
                result.aggregates[stat] = seconds * 1e3
        create_s = number(r"Session creation time cost:\s*([\d.e+-]+)\s*s", output)
        result.load_ms = create_s * 1e3 if create_s is not None else None
        result.first_ms = number(r"First inference time cost:\s*([\d.e+-]+)\s*ms", output)
        peak = number(r"Peak working set size:\s*(\d+)\s*bytes", output)
        result.peak_memory_mb = peak / 2**20 if peak is not None else None
        result.warmup_count = 1  # `First inference time cost`: the one warm-up run (-m times)
        result.applied = {"delegate": ep, "precision": _precision_ran(ep, opts.precision)}
        result.notes = {"inputs": _inputs_note(output, opts, result.warnings), "warmup_runs": 1}
        _placement(result, output, ep, opts)
        if "p50" in result.aggregates:
            result.notes["percentile_method"] = "tool"
        result.warnings += _not_applied(opts)
        return result


_RANDOMISED = ("FLOAT", "INT8", "UINT8")  # FillTensorDataTyped's random branches; the rest are zeros
_NOT_RANDOM = "this type of data won't be random initialized"
_FALLBACK = re.compile(
    r"(?:\[W:onnxruntime:[^\]]*VerifyEachNodeIsAssignedToAnEp\]\s*)?"
    r"(Some nodes were not assigned to the preferred execution providers[^\n]*)"
)


def _inputs_note(output: str, opts: NativeOptions, warnings: list[str]) -> str:
    """What the generated inputs held: seeded random only where every input is float/int8/uint8."""
    told = output.count(_NOT_RANDOM)
    if not opts.input_types:
        if told:
            warnings.append(
                f"onnxruntime_perf_test filled {told} input(s) with zeros ('{_NOT_RANDOM}'): it randomises "
                "only float, int8 and uint8 inputs"
            )
            return (
                f"generated by the tool (-I): {told} input(s) zeros, the others random with seed {opts.seed}"
            )
        return (
            f"generated by the tool (-I), random with seed {opts.seed} (-S) where float, int8 or uint8 "
            "(the input types were not read: others would be zeros)"
        )
    zeros = [f"{name} ({kind.lower()})" for name, kind in opts.input_types if kind not in _RANDOMISED]
    if not zeros:
        return f"generated by the tool (-I), random with seed {opts.seed} (-S)"
    warnings.append(
        f"onnxruntime_perf_test ran {', '.join(zeros)} on zeros: it randomises only float, int8 and uint8 "
        "inputs (token ids and fp16 inputs need --inputs on a Python device)"
    )
    random = [name for name, kind in opts.input_types if kind in _RANDOMISED]
    rest = f"; {', '.join(random)} random with seed {opts.seed} (-S)" if random else ""
    return f"generated by the tool (-I): {', '.join(zeros)} zeros{rest}"


def _placement(result: NativeResult, output: str, ep: str, opts: NativeOptions) -> None:
    """Whether every node ran on the asked EP, from onnxruntime's own fallback warning."""
    if ep == "cpu":
        result.notes["delegated"] = "full"
        return
    fallback = _FALLBACK.search(output)
    if fallback is None:
        result.notes["delegated"] = "full"
        result.notes["placement_evidence"] = (
            "no VerifyEachNodeIsAssignedToAnEp warning at the tool's WARNING log level"
        )
        return
    evidence = fallback.group(0).strip()
    result.path = f"{ep}+cpu"
    result.notes["delegated"] = "partial"
    result.notes["placement_evidence"] = evidence
    if opts.require_backend:
        raise NativeToolError(
            "onnxruntime_perf_test",
            f"{ep} is required, but part of the graph ran on another execution provider: {evidence}",
            "delegate",
        )
    result.warnings.append(
        f"onnxruntime_perf_test: some nodes ran outside {ep} (the CPU): the run is {ep}+cpu, not {ep} alone"
    )


def _precision_option(ep: str, precision: str | None, tool: str) -> str | None:
    fp16 = precision in ("fp16", "low")
    if ep in _PRECISION:
        return _PRECISION[ep][0 if fp16 else 1]
    if fp16:
        raise NativeToolError(
            tool, f"execution provider '{ep}' has no fp16 option in onnxruntime_perf_test", kind="usage"
        )
    return None


def _precision_ran(ep: str, precision: str | None) -> str:
    return "fp16" if precision in ("fp16", "low") and ep in _PRECISION else "fp32"


def _not_applied(opts: NativeOptions) -> list[str]:
    """What the tool cannot honour, said once per invocation rather than silently dropped."""
    out = []
    if opts.warmup != 1:
        out.append(
            f"onnxruntime_perf_test runs exactly one warm-up inference; warmup={opts.warmup} not applied"
        )
    if opts.warmup_seconds > 0:
        out.append(
            f"onnxruntime_perf_test has no warm-up duration; warmup_seconds={opts.warmup_seconds:g} s "
            "cannot be honoured (one warm-up inference ran)"
        )
    if opts.min_seconds > 0:
        out.append(
            f"onnxruntime_perf_test runs a fixed count (-r {opts.runs}); min_seconds="
            f"{opts.min_seconds:g} s and max_seconds not applied"
        )
    return out


def _failure(output: str, returncode: int) -> tuple[str, str]:
    """(reason, kind) of a run without a result."""
    unsupported = re.search(r"([\w .-]+?) is not supported in this build", output)
    if unsupported:
        return f"{unsupported.group(1).strip()} is not supported in this build of the tool", "delegate"
    reason = first_error_line(output, _ERRORS)
    if reason:
        return reason, "delegate" if "provider" in reason.lower() else "model"
    crash = crash_reason(returncode)
    if killed := killed_from_outside(returncode):
        return killed, KILLED
    if crash and returncode != 255:
        return f"crashed ({crash}) without a message", "model"
    if re.search(r"onnxruntime_perf_test \[options", output) or "Usage" in output:
        return f"refused its arguments and printed its usage (exit {returncode})", "usage"
    return f"exited {returncode} without a result", "model"
