"""Task `decode`: an LLM decode loop on the device. Prefill P prompt tokens, then T decode steps, each
feeding the previous step's KV cache (`present.*`) back as `past_key_values.*` and picking the next token
by argmax of the logits (greedy). Everything between two tokens (feeds, run, argmax) is timed here.

The model convention (Optimum and onnxruntime-genai decoder exports):
  inputs   input_ids [batch, seq]; attention_mask [batch, past + seq]; position_ids [batch, seq] (optional);
           use_cache_branch [1] (optional, Optimum's merged decoders: true once there is a past);
           one key and one value cache per layer [batch, heads, past, head_dim], named
           `past_key_values.N.key|value` (Optimum, onnxruntime-genai) or `past.N.key|value`
  outputs  logits [batch, seq, vocab]; `present.N.key|value` [batch, heads, past + seq, head_dim]
Anything else (a misnamed cache, a layer missing its value, a present without its past) is one line naming
the tensor. A run is: a first prefill (cold), warm-up rounds (prefill and a few steps) by count and time,
then rounds until `rounds` and `min_seconds` (never past `max_seconds` once one round is done). Each round
restarts from the same seeded prompt, so every round must produce the same tokens. Once at the end the
whole sequence is run again without a cache and its argmax tokens are set against the cached decode's:
the cache was fed back as meant only if they agree.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bench import pin
from .main import TaskError
from .session import InputInfo, ModelLoadError, RuntimeMissing, _dist_version, _first_line
from .session_onnxruntime import OrtSession
from .timing import current_rss_mb, peak_rss_mb

# Accepted names of the KV cache tensors: (pattern, family); the family of the inputs picks the outputs'.
PAST_NAMES = (
    (re.compile(r"past_key_values\.(\d+)\.(key|value)"), "past_key_values.{}.{}"),
    (re.compile(r"past\.(\d+)\.(key|value)"), "past.{}.{}"),
)
PRESENT_NAME = "present.{}.{}"
ACCEPTED = "past_key_values.N.key|value or past.N.key|value"
IDS, MASK, POSITIONS, BRANCH = "input_ids", "attention_mask", "position_ids", "use_cache_branch"
WARMUP_STEPS = 2  # decode steps after each warm-up prefill: the step's kernels warm up too


@dataclass(frozen=True)
class CacheSlot:
    """One layer's key or value cache: the input it is fed through and the output it comes back on."""

    layer: int
    part: str  # key | value
    past: str
    present: str
    heads: int
    head_dim: int
    dtype: str


@dataclass(frozen=True)
class DecoderIO:
    """Which model tensors play which role."""

    mask: str
    positions: str | None
    branch: str | None
    logits: str
    cache: tuple[CacheSlot, ...]
    ids_dtype: str
    mask_dtype: str

    @property
    def layers(self) -> int:
        return len({s.layer for s in self.cache})


def _kv_dims(info: InputInfo) -> tuple[int, int]:
    shape = info.shape
    if len(shape) != 4 or not all(isinstance(shape[i], int) and shape[i] > 0 for i in (1, 3)):
        raise TaskError(
            "model",
            f"input '{info.name}' is {shape}: a KV cache is [batch, heads, past, head_dim] with fixed heads "
            "and head_dim",
        )
    return int(shape[1]), int(shape[3])


def _cache_name(name: str) -> tuple[int, str, str] | None:
    for pattern, family in PAST_NAMES:
        m = pattern.fullmatch(name)
        if m:
            return int(m.group(1)), m.group(2), family
    return None


def _looks_like_cache(name: str) -> bool:
    low = name.lower()
    return low.startswith(("past", "cache", "kv")) or "key" in low or "value" in low


def find_io(inputs: list[InputInfo], outputs: list[str]) -> DecoderIO:
    """The decoder's tensors by role; a missing or misnamed one is a TaskError naming it."""
    by_name = {i.name: i for i in inputs}
    for required in (IDS, MASK):
        if required not in by_name:
            raise TaskError("model", f"missing input '{required}' (inputs: {', '.join(by_name)})")
    slots: dict[tuple[int, str], InputInfo] = {}
    families = set()
    for info in inputs:
        if info.name in (IDS, MASK, POSITIONS, BRANCH):
            continue
        parsed = _cache_name(info.name)
        if parsed is None:
            what = "is not a KV cache input" if _looks_like_cache(info.name) else "is not a decoder input"
            raise TaskError(
                "model",
                f"input '{info.name}' {what} (accepted: {IDS}, {MASK}, {POSITIONS}, {BRANCH}, {ACCEPTED})",
            )
        layer, part, family = parsed
        slots[(layer, part)] = info
        families.add(family)
    if not slots:
        raise TaskError("model", f"no KV cache inputs (expected {ACCEPTED}; inputs: {', '.join(by_name)})")
    if len(families) > 1:
        raise TaskError("model", f"KV cache inputs mix two namings ({' and '.join(sorted(families))})")
    family = families.pop()
    layers = max(layer for layer, _ in slots) + 1
    if "logits" not in outputs:
        raise TaskError("model", f"missing output 'logits' (outputs: {', '.join(outputs)})")
    cache = []
    for layer in range(layers):
        for part in ("key", "value"):
            name = family.format(layer, part)
            if (layer, part) not in slots:
                raise TaskError(
                    "model", f"missing input '{name}' (the model has {layers} layers of KV cache)"
                )
            present = PRESENT_NAME.format(layer, part)
            if present not in outputs:
                raise TaskError("model", f"missing output '{present}' for input '{name}'")
            info = slots[(layer, part)]
            heads, head_dim = _kv_dims(info)
            cache.append(CacheSlot(layer, part, name, present, heads, head_dim, info.dtype))
    return DecoderIO(
        mask=MASK,
        positions=POSITIONS if POSITIONS in by_name else None,
        branch=BRANCH if BRANCH in by_name else None,
        logits="logits",
        cache=tuple(cache),
        ids_dtype=by_name[IDS].dtype,
        mask_dtype=by_name[MASK].dtype,
    )


# ---- runtimes: one call, feeds in, named outputs out ------------------------------------------------
class OrtDecoder:
    """onnxruntime session: the runtime's own run(), outputs by name."""

    runtime = "onnxruntime"

    def __init__(self, path: str, threads: int) -> None:
        self.session = OrtSession(path, threads)
        self.version = self.session.version
        self.inputs = self.session.inputs
        self.outputs = self.session.output_names
        meta = self.session.session.get_modelmeta().custom_metadata_map or {}
        self.max_positions = (
            int(meta["edgebench.max_positions"]) if "edgebench.max_positions" in meta else None
        )

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self.outputs, self.session.session.run(self.outputs, feeds), strict=True))


class MnnDecoder:
    """MNN Module API (MNN.nn), shape-mutable: the cache grows every step, so the graph is resized each
    call (the Interpreter's fixed session does not fit a growing KV cache)."""

    runtime = "mnn"

    def __init__(self, path: str, threads: int) -> None:
        try:
            import MNN
        except ImportError as exc:
            raise RuntimeMissing("MNN is not installed") from exc
        self.np = __import__("numpy")
        self.F = MNN.expr
        self.version = _dist_version("mnn")
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise ModelLoadError(f"cannot read MNN model {path}")
        try:
            probe = MNN.nn.load_module_from_file(path, [], [], shape_mutable=True)
            info = probe.get_info()
            names, self.outputs = list(info["inputNames"]), list(info["outputNames"])
            self.module = MNN.nn.load_module_from_file(
                path, names, self.outputs, shape_mutable=True, thread_num=threads or 1
            )
        except Exception as exc:  # noqa: BLE001 - MNN raises its own types
            raise ModelLoadError(f"MNN could not load the model: {_first_line(exc)}") from None
        kinds = {self.F.float: "float32", self.F.int: "int32"}
        self.inputs = [
            InputInfo(n, [d if d > 0 else None for d in v.shape], kinds.get(v.dtype, "float32"))
            for n, v in zip(names, info["inputs"], strict=True)
        ]
        self.names = names
        self.max_positions = None

    def _var(self, array: Any) -> Any:
        F, np = self.F, self.np
        if array.dtype.kind in "iub":
            return F.const(np.ascontiguousarray(array, np.int32), list(array.shape), F.NCHW, F.int)
        return F.const(np.ascontiguousarray(array, np.float32), list(array.shape), F.NCHW, F.float)

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        out = self.module.forward([self._var(feeds[n]) for n in self.names])
        # read() is a view the next run overwrites: copy.
        return {n: self.np.array(v.read(), copy=True) for n, v in zip(self.outputs, out, strict=True)}


# runtime -> its decoder: onnxruntime's session, MNN's Module API (stateful KV inputs and outputs)
DECODERS: dict[str, type[OrtDecoder] | type[MnnDecoder]] = {"onnxruntime": OrtDecoder, "mnn": MnnDecoder}


def open_decoder(runtime: str, path: str, threads: int) -> OrtDecoder | MnnDecoder:
    decoder = DECODERS.get(runtime)
    if decoder is None:
        raise TaskError("usage", f"decode runs {' or '.join(DECODERS)}, not {runtime!r}")
    try:
        return decoder(path, threads)
    except ModelLoadError as exc:
        raise TaskError("model", str(exc)) from None
    except RuntimeMissing as exc:
        raise TaskError("runtime", str(exc)) from None


# ---- the loop --------------------------------------------------------------------------------------------
class Loop:
    """Feeds, steps and greedy picks of one decoder."""

    def __init__(self, model: OrtDecoder | MnnDecoder, io: DecoderIO) -> None:
        import numpy as np

        self.np, self.model, self.io = np, model, io
        self.empty = {s.past: np.zeros((1, s.heads, 0, s.head_dim), s.dtype) for s in io.cache}

    def feeds(self, ids: list[int], past: dict[str, Any], past_len: int) -> dict[str, Any]:
        np, io = self.np, self.io
        n = len(ids)
        f = {
            IDS: np.array([ids], io.ids_dtype),
            io.mask: np.ones((1, past_len + n), io.mask_dtype),
        }
        if io.positions:
            f[io.positions] = np.arange(past_len, past_len + n, dtype=io.ids_dtype)[None]
        if io.branch:
            f[io.branch] = np.array([past_len > 0])
        for s in io.cache:
            f[s.past] = past[s.present] if past_len else self.empty[s.past]
        return f

    def step(self, ids: list[int], past: dict[str, Any], past_len: int) -> tuple[int, dict[str, Any]]:
        """One call: the next greedy token and the outputs (whose presents are the next past)."""
        out = self.model.run(self.feeds(ids, past, past_len))
        return int(out[self.io.logits][0, -1].argmax()), out

    def generate(self, prompt: list[int], steps: int, clock: Callable[[], int]) -> dict[str, Any]:
        """Prefill then `steps` decode steps; each interval in ms, the tokens, the final cache."""
        t0 = clock()
        token, out = self.step(prompt, {}, 0)
        ttft = (clock() - t0) / 1e6
        tokens, times, length = [token], [], len(prompt)
        for _ in range(steps):
            t0 = clock()
            token, out = self.step([token], out, length)
            times.append((clock() - t0) / 1e6)
            tokens.append(token)
            length += 1
        check_cache(out, self.io, length)
        return {"ttft_ms": ttft, "step_ms": times, "tokens": tokens, "out": out}


def check_cache(out: dict[str, Any], io: DecoderIO, length: int) -> None:
    """The presents hold exactly `length` positions: the cache was fed back and grew by one per step."""
    for s in io.cache:
        got = list(out[s.present].shape)
        if len(got) != 4 or got[2] != length or got[1] != s.heads or got[3] != s.head_dim:
            raise TaskError(
                "model",
                f"output '{s.present}' is {got} after {length} positions; expected "
                f"[1, {s.heads}, {length}, {s.head_dim}] (is it the cache of '{s.past}'?)",
            )


def cache_bytes(out: dict[str, Any], io: DecoderIO) -> int:
    return sum(int(out[s.present].nbytes) for s in io.cache)


def verify(loop: Loop, prompt: list[int], tokens: list[int], last_logits: Any) -> dict[str, Any]:
    """The whole sequence once without a cache: do its argmax tokens match the cached decode's?"""
    np = loop.np
    sequence = prompt + tokens[:-1]
    out = loop.model.run(loop.feeds(sequence, {}, 0))
    logits = out[loop.io.logits][0]
    full = [int(t) for t in logits[len(prompt) - 1 :].argmax(axis=-1)]
    agree = sum(int(a == b) for a, b in zip(full, tokens, strict=True))
    ref = logits[-1].astype(np.float64)
    diff = float(np.abs(ref - last_logits.astype(np.float64)).max() / max(float(np.abs(ref).max()), 1e-30))
    return {"tokens": len(tokens), "tokens_agree": agree, "last_logits_rel_diff": diff}


def prompt_ids(seed: int, count: int, vocab: int) -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, size=count)]


def run(task: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    affinity = pin(task.get("affinity"))
    prompt_n, steps = int(task["prompt_tokens"]), int(task["new_tokens"])
    rss_before = current_rss_mb()
    start = time.perf_counter_ns()
    model = open_decoder(task.get("runtime", "onnxruntime"), task["model"], int(task.get("threads", 0)))
    load_ms = (time.perf_counter_ns() - start) / 1e6
    rss_loaded = current_rss_mb()
    io = find_io(model.inputs, model.outputs)
    if model.max_positions and prompt_n + steps > model.max_positions:
        raise TaskError(
            "usage",
            f"prompt_tokens + new_tokens = {prompt_n + steps} is over the model's {model.max_positions} "
            "positions",
        )
    loop = Loop(model, io)
    clock = time.perf_counter_ns
    try:
        t0 = clock()
        _, first = loop.step([0] * prompt_n, {}, 0)
        first_ms = (clock() - t0) / 1e6
    except TaskError:
        raise
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"prefill failed: {_first_line(exc)}") from None
    vocab = int(first[io.logits].shape[-1])
    prompt = prompt_ids(int(task.get("seed", 0)), prompt_n, vocab)
    warm_rounds, warm_s = warm_up(loop, prompt, task, clock)
    rounds = measure_rounds(loop, prompt, steps, task, clock, warnings)
    last = rounds[-1]
    check = (
        verify(loop, prompt, last["tokens"], last["out"][io.logits][0, -1])
        if task.get("verify", True)
        else None
    )
    distinct = {tuple(r["tokens"]) for r in rounds}
    if len(distinct) > 1:
        warnings.append(f"the {len(rounds)} rounds generated {len(distinct)} different token sequences")
    kv_end = cache_bytes(last["out"], io)
    return {
        "runtime": model.runtime,
        "runtime_version": model.version,
        "threads": int(task.get("threads", 0)),
        "affinity": affinity,
        "load_ms": load_ms,
        "first_prefill_ms": first_ms,
        "warmup": warm_rounds,
        "warmup_seconds": warm_s,
        "prompt_tokens": prompt_n,
        "new_tokens": steps,
        "vocab": vocab,
        "layers": io.layers,
        "cache_inputs": [s.past for s in io.cache][:2],
        "position_ids": io.positions is not None,
        "ttft_ms": [r["ttft_ms"] for r in rounds],
        "step_ms": [r["step_ms"] for r in rounds],
        "tokens": last["tokens"],
        "rounds_agree": len(distinct) == 1,
        "kv_cache_bytes": kv_end,
        "kv_bytes_per_position": kv_end // (prompt_n + steps),
        "check": check,
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_load_mb": rss_before,
        "rss_after_load_mb": rss_loaded,
    }, warnings


def warm_up(loop: Loop, prompt: list[int], task: dict, clock: Callable[[], int]) -> tuple[int, float]:
    """Prefill plus a few steps, at least `warmup` times and `warmup_seconds` (bounded by max_seconds)."""
    start = time.perf_counter()
    count, least, least_s = 0, int(task.get("warmup", 1)), float(task.get("warmup_seconds", 0.5))
    while count < least or time.perf_counter() - start < least_s:
        loop.generate(prompt, min(WARMUP_STEPS, int(task["new_tokens"])), clock)
        count += 1
        if time.perf_counter() - start > float(task.get("max_seconds", 600.0)):
            break
    return count, time.perf_counter() - start


def measure_rounds(
    loop: Loop, prompt: list[int], steps: int, task: dict, clock: Callable[[], int], warnings: list[str]
) -> list[dict[str, Any]]:
    """Whole rounds until `rounds` and `min_seconds`; no new round once `max_seconds` has passed."""
    want, min_s, max_s = (
        int(task.get("rounds", 3)),
        float(task.get("min_seconds", 0)),
        float(task.get("max_seconds", 600)),
    )
    start = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    while True:
        rounds.append(loop.generate(prompt, steps, clock))
        elapsed = time.perf_counter() - start
        if len(rounds) >= want and elapsed >= min_s:
            return rounds
        if elapsed >= max_s:
            if len(rounds) < want:
                warnings.append(f"stopped at max_seconds={max_s:g} after {len(rounds)} of {want} rounds")
            return rounds
