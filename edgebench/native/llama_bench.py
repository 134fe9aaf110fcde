"""llama.cpp `llama-bench` (tools/llama-bench/llama-bench.cpp; the lab's build is commit 0c1e570, 2026-10-01,
../shared/lab-tools/llama.cpp-20261001-linux-*, BUILD.md there).

Rules, each read from the lab's binary (the captures in edgebench/native/fixtures/llama_bench/, README.md
there names each command) and from the tool's source where it says more:

- argv: `-m MODEL -p P -n N -d D -t T -r R [--repack 0|1] [--no-warmup] ... -o json`. Each of -p, -n, -d, -t
  takes a comma list; the tool runs the cross product: one prefill test (n_prompt P, n_gen 0) per P > 0 and
  one decode test (n_prompt 0, n_gen N) per N > 0, at every depth D and thread count T. `-o json` is always
  passed: the markdown table (the default) rounds t/s to two decimals and drops the samples; it is never
  read here. A warm-up run precedes each test's `-r` timed repetitions unless `--no-warmup`.
- Output: one JSON array on stdout (`[`, the objects as each test ends, `]`), nothing on stderr unless
  `-v`. Each object: the build (`build_commit`, `build_number`, `cpu_info`, `gpu_info`, `backends`), the
  model (`model_filename`, `model_type` e.g. "llama ?B Q8_0", `model_size` = the tensors' stored bytes,
  `model_n_params` = their elements), the test's parameters (`n_batch`, `n_ubatch`, `n_threads`,
  `cpu_mask`, `cpu_strict`, `poll`, `type_k`, `type_v` (KV cache types), `n_gpu_layers`, `n_cpu_moe`,
  `split_mode`, `main_gpu`, `no_kv_offload`, `flash_attn` (-1 auto, 0, 1), `devices`, `tensor_split`,
  `tensor_buft_overrides`, `load_mode`, `lazy_mode`, `embeddings`, `no_op_offload`, `no_host`, `repack`
  (a bool: the key is `repack`, not `use_repack`), `fit_target`, `fit_min_ctx`, `n_prompt`, `n_gen`,
  `n_depth`), `test_time`, and the timings: `avg_ns`, `stddev_ns`, `avg_ts`, `stddev_ts`, `samples_ns`
  (one integer per repetition: the whole prompt, or the whole generation, warm-up excluded) and
  `samples_ts`. A decode test's per-token time is a sample / n_gen; a prefill test's sample is the prompt.
  The fields kept typed are those below; every other key is kept in `raw`, so a newer build's keys are not
  lost.
- Failures: a model it cannot load prints `[` on stdout and `llama_bench: error: failed to load model
  'FILE'` on stderr, exit 1 (with `-v`, llama.cpp's reason before it: `llama_model_load: error loading
  model: ...`); a flag it does not take prints `error: invalid parameter for argument: X` on stderr and its
  usage on stdout, exit 1; `-p 0 -n 0` prints an empty array, exit 0. A native build on an AMX CPU was seen
  to crash (SIGSEGV) in the CPU repack path with Q8_0 / Q4_0 (BUILD.md): a SIGILL or SIGSEGV suggests
  `--repack 0`.
"""

from __future__ import annotations

import json
import shlex
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .base import KILLED, NativeToolError

TOOL = "llama-bench"
NS_PER_MS = 1_000_000
_LOAD_FAILED = "failed to load model"
_LOAD_REASONS = ("error loading model:", "invalid magic", "failed to open", "failed to read")
_USAGE = "error: invalid parameter for argument"
_REPACK_SIGNALS = ("SIGILL", "SIGSEGV")


# ---- errors -----------------------------------------------------------------------------------------------
class LlamaBenchError(NativeToolError):
    """llama-bench ran and measured nothing: carries the model, argv, exit code and stderr."""

    def __init__(
        self, message: str, *, kind: str, model: str, argv: Sequence[str], returncode: int, stderr: str
    ) -> None:
        super().__init__(TOOL, message, kind)
        self.model = model
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class LlamaBenchCrash(LlamaBenchError):
    """llama-bench died by a signal; `signal_name` is SIGSEGV, SIGILL, ..."""

    def __init__(self, message: str, *, signal_name: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.signal_name = signal_name


class LlamaBenchLoadError(LlamaBenchError):
    """llama.cpp could not load the model file (not GGUF, truncated, unknown architecture, missing)."""


class LlamaBenchOutputError(LlamaBenchError):
    """llama-bench exited without a usable JSON array (empty, garbled, or a field missing)."""


# ---- argv -------------------------------------------------------------------------------------------------
def _counts(value: int | Sequence[int]) -> list[int]:
    return [value] if isinstance(value, int) else list(value)


def _csv(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def llama_bench_argv(
    binary: str,
    model: str,
    *,
    prompt: int | Sequence[int],
    gen: int | Sequence[int],
    depths: Sequence[int] = (0,),
    threads: Sequence[int],
    repetitions: int,
    repack: bool | None = None,
    warmup: bool = True,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    batch: int | None = None,
    ubatch: int | None = None,
    verbose: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """llama-bench's argv for `model`: prefill of each `prompt` length and decode of each `gen` count (0 runs
    none), at each context depth and thread count (none given: the tool's default, its physical cores),
    `repetitions` timed runs each, always `-o json`.

    `repack` None leaves the tool's default (on); `verbose` adds `-v`, whose log names why a model did not
    load; `extra` is passed as is, before `-o json`. A value the tool would reject or misread is a usage
    error here, before anything runs."""
    prompts, gens, ds, ts = _counts(prompt), _counts(gen), list(depths), list(threads)
    if not any(n > 0 for n in prompts + gens):
        raise NativeToolError(
            TOOL, "nothing to measure: give a prompt length or a token count above 0", "usage"
        )
    for label, values, low in (
        ("prompt", prompts, 0),
        ("gen", gens, 0),
        ("depths", ds, 0),
        ("threads", ts, 1),
    ):
        if (not values and label != "threads") or any(v < low for v in values):
            raise NativeToolError(
                TOOL, f"{label} must be one or more whole numbers >= {low}, got {values}", "usage"
            )
    if repetitions < 1:
        raise NativeToolError(TOOL, f"repetitions must be >= 1, got {repetitions}", "usage")
    if any(a in ("-o", "--output") for a in extra):
        raise NativeToolError(
            TOOL, "extra flags may not set the output format: it is always -o json", "usage"
        )
    argv = [binary, "-m", model, "-p", _csv(prompts), "-n", _csv(gens), "-d", _csv(ds)]
    argv += ["-t", _csv(ts)] if ts else []  # none given: the tool's own default (its physical cores)
    argv += ["-r", str(repetitions)]
    if repack is not None:
        argv += ["--repack", "1" if repack else "0"]
    if not warmup:
        argv.append("--no-warmup")
    for flag, value in (("-ctk", cache_type_k), ("-ctv", cache_type_v), ("-b", batch), ("-ub", ubatch)):
        if value is not None:
            argv += [flag, str(value)]
    if verbose:
        argv.append("-v")
    return [*argv, *extra, "-o", "json"]


# ---- one test ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaBenchTest:
    """One llama-bench test (one JSON object): its parameters, the tool's timings, and every other key in
    `raw`. `per_token_ms` (decode tests) and `ms` are derived from `samples_ns`, never from `avg_ts`."""

    n_prompt: int
    n_gen: int
    n_depth: int
    n_threads: int
    avg_ns: int
    stddev_ns: int
    avg_ts: float
    samples_ns: tuple[int, ...]
    samples_ts: tuple[float, ...]
    model_size: int
    model_n_params: int
    stddev_ts: float | None = None
    model_filename: str | None = None
    model_type: str | None = None
    type_k: str | None = None
    type_v: str | None = None
    backends: str | None = None
    repack: bool | None = None
    flash_attn: int | bool | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_gpu_layers: int | None = None
    build_commit: str | None = None
    build_number: int | None = None
    cpu_info: str | None = None
    gpu_info: str | None = None
    test_time: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)  # every key not typed above, as the tool wrote it

    @property
    def kind(self) -> str:
        """decode (n_prompt 0), prefill (n_gen 0), or prefill+decode (`-pg`: one sample covers both)."""
        if self.n_prompt == 0:
            return "decode"
        return "prefill" if self.n_gen == 0 else "prefill+decode"

    @property
    def ms(self) -> tuple[float, ...]:
        """Each repetition's whole time in ms: the prompt for prefill, all n_gen tokens for decode."""
        return tuple(s / NS_PER_MS for s in self.samples_ns)

    @property
    def per_token_ms(self) -> tuple[float, ...]:
        """Each decode repetition's time per generated token in ms (sample / n_gen); empty for other kinds."""
        if self.kind != "decode":
            return ()
        return tuple(s / self.n_gen / NS_PER_MS for s in self.samples_ns)

    @property
    def label(self) -> str:
        """How llama-bench's own table names the test: pp512, tg128, pp512+tg128, with `@ d64` for depth."""
        name = {"decode": f"tg{self.n_gen}", "prefill": f"pp{self.n_prompt}"}.get(
            self.kind, f"pp{self.n_prompt}+tg{self.n_gen}"
        )
        return f"{name} @ d{self.n_depth}" if self.n_depth else name


# the fields a measurement needs; every other typed field is None where a build does not print it
_WHOLE = ("n_prompt", "n_gen", "n_depth", "n_threads", "avg_ns", "stddev_ns", "model_size", "model_n_params")
_REQUIRED = (*_WHOLE, "avg_ts", "samples_ns", "samples_ts")
_TYPED = {f.name for f in fields(LlamaBenchTest)} - {"raw"}


def _test_from(obj: Mapping[str, Any]) -> LlamaBenchTest:
    """A LlamaBenchTest from one JSON object; KeyError/TypeError/ValueError on a missing or mistyped field."""
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise KeyError(missing[0])
    typed: dict[str, Any] = {k: obj[k] for k in _TYPED if k in obj}
    for key in _WHOLE:
        typed[key] = _whole(obj[key], key)
    typed["avg_ts"] = float(obj["avg_ts"])
    typed["samples_ns"] = tuple(_whole(s, "samples_ns") for s in obj["samples_ns"])
    typed["samples_ts"] = tuple(float(s) for s in obj["samples_ts"])
    if not typed["samples_ns"]:
        raise ValueError("samples_ns is empty")
    if len(typed["samples_ns"]) != len(typed["samples_ts"]):
        raise ValueError("samples_ns and samples_ts differ in length")
    if typed["n_gen"] < 0 or typed["n_prompt"] < 0 or typed["n_prompt"] + typed["n_gen"] == 0:
        raise ValueError(f"n_prompt {typed['n_prompt']} and n_gen {typed['n_gen']} measure nothing")
    return LlamaBenchTest(**typed, raw={k: v for k, v in obj.items() if k not in _TYPED})


def _whole(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{key} is {value!r}, not a whole number")
    return value


# ---- parsing ----------------------------------------------------------------------------------------------
def _flags(argv: Sequence[str], model: str) -> str:
    """The flags of an invocation (binary and `-m MODEL` left out: the message names the model)."""
    rest, skip = [], False
    for i, arg in enumerate(argv[1:], start=1):
        if skip:
            skip = False
            continue
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] == model:
            skip = True
            continue
        rest.append(arg)
    return shlex.join(rest)


def _signal_of(returncode: int) -> tuple[int, str] | None:
    """(N, name) of the signal that ended the tool: subprocess reports -N, a shell (sh, ssh, adb) 128 + N."""
    number = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 128 + 65 else 0
    if not number:
        return None
    try:
        return number, signal.Signals(number).name
    except ValueError:
        return number, f"signal {number}"


def _repack_off(argv: Sequence[str]) -> bool:
    """True when the invocation already asked for no repacking (`--repack 0`)."""
    return any(a == "--repack" and b == "0" for a, b in zip(argv, argv[1:], strict=False))


def _crash(returncode: int, model: str, argv: Sequence[str], stderr: str) -> LlamaBenchCrash | None:
    died = _signal_of(returncode)
    if died is None:
        return None
    number, name = died
    what = f"{model}: killed by signal {number} ({name}, exit {returncode}) with flags {_flags(argv, model)}"
    if name == "SIGKILL":
        what += (
            ": from outside the tool (a low-memory killer, a watchdog, its shell going away); run it again"
        )
    elif name in _REPACK_SIGNALS and not _repack_off(argv):
        what += ": try --repack 0 (llama.cpp's CPU weight repacking has crashed builds on some CPUs)"
    kind = KILLED if name == "SIGKILL" else "crash"
    return LlamaBenchCrash(
        what, signal_name=name, kind=kind, model=model, argv=argv, returncode=returncode, stderr=stderr
    )


def _load_error(output: str) -> str | None:
    """The most specific line saying why llama.cpp did not load the model (with -v its reason, else the
    tool's own `failed to load model` line), or None."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if not any(_LOAD_FAILED in ln for ln in lines):
        return None
    reason = next((ln for ln in lines if any(r in ln for r in _LOAD_REASONS)), None)
    return reason or next(ln for ln in lines if _LOAD_FAILED in ln)


def _json_array(stdout: str) -> Any:
    """The JSON document on stdout; where logs share the stream (a shell that merges stderr, as adb without
    shell v2 does), the array from its `[` line to its last `]` line. ValueError if there is none."""
    try:
        return json.loads(stdout)
    except ValueError:
        lines = stdout.splitlines()
        starts = [i for i, ln in enumerate(lines) if ln.strip() == "["]
        ends = [i for i, ln in enumerate(lines) if ln.strip() == "]"]
        if not starts or not ends or ends[-1] < starts[0]:
            raise
        return json.loads("\n".join(lines[starts[0] : ends[-1] + 1]))


def parse_llama_bench(
    stdout: str, stderr: str, returncode: int, model: str, argv: Sequence[str]
) -> list[LlamaBenchTest]:
    """Every test of one llama-bench invocation (`-o json`), in the order it ran them; an invocation that
    measured nothing (death by a signal, a model it could not load, a flag it refused, no or broken JSON)
    is a one-line LlamaBenchError naming the model."""
    kw: dict[str, Any] = {"model": model, "argv": argv, "returncode": returncode, "stderr": stderr}
    crash = _crash(returncode, model, argv, stderr)
    if crash is not None:
        raise crash
    both = f"{stderr}\n{stdout}"
    load = _load_error(both)
    if load is not None:
        raise LlamaBenchLoadError(f"{model}: llama.cpp could not load it: '{load}'", kind="model", **kw)
    usage = next((ln.strip() for ln in both.splitlines() if ln.strip().startswith(_USAGE)), None)
    if usage is not None:
        raise LlamaBenchError(
            f"{model}: the arguments were not taken: '{usage}' (flags {_flags(argv, model)})",
            kind="usage",
            **kw,
        )
    if returncode != 0:
        tail = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "nothing on stderr")
        raise LlamaBenchError(f"{model}: exited {returncode}: '{tail}'", kind="model", **kw)
    return _tests(stdout, model, kw)


def _tests(stdout: str, model: str, kw: dict[str, Any]) -> list[LlamaBenchTest]:
    """The JSON array's objects as tests; anything else is a one-line LlamaBenchOutputError."""
    if not stdout.strip():
        raise LlamaBenchOutputError(
            f"{model}: llama-bench printed nothing on stdout (no JSON)", kind="output", **kw
        )
    try:
        doc = _json_array(stdout)
    except ValueError as exc:
        raise LlamaBenchOutputError(
            f"{model}: llama-bench printed no valid JSON ({' '.join(str(exc).split())})", kind="output", **kw
        ) from None
    if not isinstance(doc, list) or not all(isinstance(o, dict) for o in doc):
        raise LlamaBenchOutputError(
            f"{model}: llama-bench's JSON is not an array of tests", kind="output", **kw
        )
    if not doc:
        raise LlamaBenchOutputError(f"{model}: llama-bench ran no test (an empty array)", kind="output", **kw)
    tests = []
    for index, obj in enumerate(doc):
        try:
            tests.append(_test_from(obj))
        except KeyError as exc:
            raise LlamaBenchOutputError(
                f"{model}: llama-bench's test {index} has no '{exc.args[0]}'", kind="output", **kw
            ) from None
        except (TypeError, ValueError) as exc:
            raise LlamaBenchOutputError(
                f"{model}: llama-bench's test {index} is not usable: {exc}", kind="output", **kw
            ) from None
    return tests


__all__ = [
    "LlamaBenchCrash",
    "LlamaBenchError",
    "LlamaBenchLoadError",
    "LlamaBenchOutputError",
    "LlamaBenchTest",
    "llama_bench_argv",
    "parse_llama_bench",
]
