"""fit on GGUF LLMs (edgebench.analysis.llm_fit): llama.cpp's buffer lines read as the lab's build prints them,
the memory and decode arithmetic against counts made here from the file with `gguf`'s own reader, the
evidence an efficiency is taken from, and the refusals (over the device's memory, nothing to predict from)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from edgebench.analysis import llm_fit as lf
from edgebench.analysis.bandwidth import DramBandwidth
from edgebench.analysis.budgets import parse_budgets
from edgebench.analysis.fit_result import NO_FIT, UNCERTAIN, FitResult, verdict_exit_code
from edgebench.descriptors import load_lab
from edgebench.errors import UserError
from edgebench.models.gguf_models import read_gguf
from edgebench.models.refs import resolve_model
from edgebench.records import Record

Q8 = "builtin:llama:layers=2,hidden=256,heads=4,kv_heads=2,vocab=512,dtype=q8_0"
Q4 = "builtin:llama:layers=2,hidden=256,heads=4,kv_heads=2,vocab=512,dtype=q4_0"
MIB = 2**20

# llama-bench -m llama-l2-h256-f768-a4-kv2-v512-q4_0.gguf -p 0 -n 1 -d 4095 -r 0 --no-warmup -t 1 --repack 1
# -ctk f16 -ctv f16 -v -o json: its stderr (the lab's build, 0c1e570), the lines read and some around them
REAL_LOG = """\
load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
load_tensors:   CPU_Mapped model buffer size =     0.92 MiB
load_tensors:   CPU_REPACK model buffer size =     0.91 MiB
llama_context: constructing llama_context
llama_context: n_seq_max             = 1
llama_context: n_ctx                 = 4096
llama_context: n_ctx_seq             = 4096
llama_context: n_batch               = 2048
llama_context: n_ubatch              = 512
llama_context: flash_attn            = auto
llama_context: n_ctx_seq (4096) > n_ctx_train (2048) -- possible training context overflow
llama_context:        CPU  output buffer size =     0.00 MiB
llama_kv_cache:        CPU KV buffer size =     4.00 MiB
llama_kv_cache: size =    4.00 MiB (  4096 cells,   2 layers,  1/1 seqs), K (f16):    2.00 MiB, V (f16):    2.00 MiB
sched_reserve: worst-case: n_tokens = 512, n_seqs = 1, n_outputs = 1
resolve_fused_ops: Flash Attention enabled
sched_reserve:        CPU compute buffer size =    10.51 MiB
sched_reserve: graph: nodes = 68, splits = 1, input objects = 4, input tensors = 6
~llama_context:        CPU compute buffer size is  10.5137 MiB, matches expectation of  10.5137 MiB
"""


def buffers(n_ctx: int = 4096, compute: float = 10.5137, output: float = 0.0) -> lf.LlamaBuffers:
    return lf.LlamaBuffers(n_ctx, {"CPU": compute}, {"CPU": output}, {"CPU": 4.0}, {}, "enabled", ("x",))


def test_the_buffers_are_read_from_the_lines_llama_cpp_prints() -> None:
    got = lf.parse_buffers(REAL_LOG, ["llama-bench"])
    assert got.n_ctx == 4096
    assert got.compute_mb == {"CPU": 10.5137}  # the teardown's 4 decimals, not sched_reserve's 10.51
    assert got.output_mb == {"CPU": 0.0} and got.kv_mb == {"CPU": 4.0}
    assert got.model_mb == {"CPU_Mapped": 0.92, "CPU_REPACK": 0.91}  # shown, never added
    assert got.buffers_mb == pytest.approx(10.5137) and got.flash_attn == "enabled"
    no_teardown = "\n".join(ln for ln in REAL_LOG.splitlines() if not ln.startswith("~"))
    assert lf.parse_buffers(no_teardown, []).compute_mb == {"CPU": 10.51}
    for cut, said in (("n_ctx    ", "n_ctx = N"), ("compute buffer", "compute buffer size")):
        with pytest.raises(ValueError, match=said):
            lf.parse_buffers("\n".join(ln for ln in REAL_LOG.splitlines() if cut not in ln), [])


def test_the_argv_allocates_the_context_and_computes_nothing() -> None:
    argv = lf.buffers_argv("/bin/llama-bench", "m.gguf", 4096)
    flags = {flag: argv[argv.index(flag) + 1] for flag in ("-p", "-n", "-d", "-r", "-ctk", "-ctv")}
    assert flags["-p"] == "0" and flags["-n"] == "1" and flags["-d"] == "4095"  # n_ctx = p + n + d
    assert flags["-r"] == "0" and "--no-warmup" in argv and "-v" in argv  # no repetition: no prefill of d
    assert flags["-ctk"] == flags["-ctv"] == "f16"
    with pytest.raises(UserError, match="--context 1"):
        lf.buffers_argv("b", "m.gguf", 1)


def test_memory_is_the_files_tensors_plus_the_kv_of_the_cells_plus_the_buffers() -> None:
    path = resolve_model(Q8).path
    reader = gguf.GGUFReader(path)
    tensors = sum(int(t.n_bytes) for t in reader.tensors)  # counted here, by gguf's own reader
    kv_per_cell = 2 * 2 * 2 * (256 // 4) * 2  # K and V x layers x kv_heads x head_dim x f16 bytes
    need = lf.memory_need(read_gguf(path), 1000, buffers(n_ctx=1024, output=0.01))
    assert need.weights_mb == pytest.approx(tensors / MIB)
    assert need.kv_cache_mb == pytest.approx(kv_per_cell * 1024 / MIB)  # llama.cpp pads 1000 to 1024 cells
    assert need.memory_mb == pytest.approx((tensors + kv_per_cell * 1024) / MIB + 10.5137 + 0.01)
    assert lf.kv_disagreement(need) is not None  # llama.cpp's 4.00 MB KV here is not this file's 1.00


def point(model: str, eff: float, run: str = "r1", threads: int = 1, depth: int = 64, **kw) -> Record:
    return Record(
        run,
        kw.get("device", "dev"),
        "decode",
        model,
        kw.get("runtime", "llama.cpp"),
        "decode_efficiency",
        eff,
        "ratio",
        {"threads": threads, "depth": depth, "new_tokens": 16, "prompt_tokens": 16},
        annotations={"regime": "dram", "model_type": kw.get("model_type", "llama ?B Q8_0")},
    )


def test_decode_is_the_median_efficiency_times_bandwidth_over_the_bytes_of_a_step() -> None:
    path = resolve_model(Q8).path
    reader = gguf.GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    rows = int(next(t for t in reader.tensors if t.name == "token_embd.weight").shape[-1])
    depth = 300
    per_token = sum(sizes.values()) - sizes["token_embd.weight"] * (rows - 1) // rows
    per_token += 2 * 2 * 2 * 64 * 2 * depth  # the KV cache a step at that depth reads
    records = [point("a", 0.5), point("b", 0.6), point("c", 0.8)]
    q8 = lf.Quantization("MOSTLY_Q8_0", "Q8_0")
    ev = lf.efficiency_evidence(records, dict.fromkeys("abc", q8), ("dev", "llama.cpp", "x"), q8, depth, 1)
    bw = DramBandwidth(10.0, "bw", "store", "read", 1)
    got = lf.predict_decode(read_gguf(path), depth, ev, bw)
    assert got.bytes_per_token == pytest.approx(per_token, abs=1)
    assert got.p50 == pytest.approx(0.6 * 10e9 / per_token, rel=1e-6)
    assert (got.low, got.high) == pytest.approx((0.5 * 10e9 / per_token, 0.8 * 10e9 / per_token), rel=1e-6)
    assert got.interval == "min-max of 3 models"
    assert got.to_dict()["evidence"]["models"] == ["a", "b", "c"]
    many = [point(f"m{i}", 0.5 + i / 100) for i in range(20)]
    ev = lf.efficiency_evidence(many, {f"m{i}": q8 for i in range(20)}, ("dev", "llama.cpp", "x"), q8, 300)
    assert lf.predict_decode(read_gguf(path), depth, ev, bw).interval.startswith("conformal 80% of 20")


def test_the_evidence_is_other_models_of_the_same_quantization_latest_run_nearest_depth() -> None:
    q8, q4 = lf.Quantization("MOSTLY_Q8_0", "Q8_0"), lf.Quantization("MOSTLY_Q4_0", "Q4_0")
    records = [
        point("a", 0.5, run="old"),
        point("a", 0.7, run="new", depth=0),
        point("a", 0.9, run="new", depth=512),
        point("self", 0.1),  # the model asked: never its own evidence
        point("four", 0.2, model_type="llama ?B Q4_0"),
        point("b", 0.4, threads=2),
        point("c", 0.6, device="other"),
        point("d", 0.6, runtime="onnxruntime"),
    ]
    quants = {"a": q8, "self": q8, "four": q4, "b": q8, "c": q8, "d": q8}
    ev = lf.efficiency_evidence(records, quants, ("dev", "llama.cpp", "self"), q8, 100, 1, ["old", "new"])
    assert [(p.model, p.run_id, p.depth, p.efficiency) for p in ev.points] == [("a", "new", 0, 0.7)]
    at_four = lf.efficiency_evidence(
        records, quants, ("dev", "llama.cpp", "self"), q8, 100, 4, ["old", "new"]
    )
    assert {p.model for p in at_four.points} == {"a", "b"} and "at 4 threads" in at_four.notes[0]
    none = lf.efficiency_evidence(
        records, quants, ("dev", "llama.cpp", "self"), lf.Quantization("MOSTLY_F16"), 1
    )
    assert (
        not none.points
        and "no other F16 GGUF decoded on dev" in none.why_none
        and "four (Q4_0)" in none.why_none
    )


def test_quantization_from_the_file_or_from_what_llama_bench_printed() -> None:
    q8_file = lf.quantization_of(read_gguf(resolve_model(Q8).path))
    assert q8_file == lf.Quantization("MOSTLY_Q8_0", "Q8_0")
    printed = lf.quantization_from_model_type("llama ?B Q8_0")
    assert printed is not None and printed.same_as(q8_file) and q8_file.same_as(printed)
    assert not q8_file.same_as(lf.quantization_of(read_gguf(resolve_model(Q4).path)))
    km = lf.quantization_from_model_type("llama 1B Q4_K - Medium")
    assert km == lf.Quantization("MOSTLY_Q4_K_M") and km.label == "Q4_K_M"
    assert lf.quantization_from_model_type("llama") is None
    # no file type in either: the type holding most bytes decides
    assert lf.Quantization("unset", "Q8_0").same_as(lf.Quantization("MOSTLY_Q8_0", "Q8_0"))


def need_of(mb_weights: float) -> lf.MemoryNeed:
    return lf.MemoryNeed(4096, mb_weights, 4.0, buffers())


def prediction(p50: float | None = 100.0, why: str = "") -> lf.DecodePrediction:
    ev = lf.Evidence((), 1)
    if p50 is None:
        return lf.DecodePrediction(2048, 1, 1000, ev, unknown=why)
    return lf.DecodePrediction(2048, 1, 1000, ev, None, 0.7, p50, p50 * 0.8, p50 * 1.2, "min-max of 2 models")


def test_a_model_over_the_devices_memory_is_refused_with_the_numbers() -> None:
    got = lf.judge_llm(
        ("phone", "llama.cpp", "big"), need_of(5000.0), lf.DeviceMemory(3800.0, "r"), prediction()
    )
    assert got.verdict == NO_FIT and got.fits is False
    assert "needs 5014.5 MB (weights 5000.0 + f16 KV 4.0 at 4096 cells + llama.cpp buffers 10.5)" in got.why
    assert "> the device's memory 3800.0 MB" in got.why
    verdict = got.to_verdict()
    assert verdict_exit_code([verdict]) == 1 and verdict.ratios["memory_mb"] == pytest.approx(
        5014.5137 / 3800
    )
    back = FitResult.from_records(FitResult(budgets=(), verdicts=[verdict]).to_records("run")).verdicts[0]
    assert back.verdict == NO_FIT and back.why == got.why and back.limits == {"memory_mb": 3800.0}
    ok = lf.judge_llm(("phone", "llama.cpp", "m"), need_of(100.0), lf.DeviceMemory(3800.0, "r"), prediction())
    assert ok.verdict == "fits" and "decode 100 tokens/s [80-120" in ok.why
    assert json.dumps(ok.to_dict())  # the JSON fit prints


def test_budgets_and_unknowns() -> None:
    budgets = parse_budgets(["memory_mb=50", "decode_tokens_per_s_min=90", "latency_p99_ms=3"])
    got = lf.judge_llm(("d", "llama.cpp", "m"), need_of(30.0), lf.DeviceMemory(3800.0), prediction(), budgets)
    assert got.limits == {"memory_mb": 50.0, "decode_tokens_per_s_min": 90.0}  # the lower memory limit wins
    assert got.verdict == UNCERTAIN and "straddles 90" in got.why and got.unchecked == ("latency_p99_ms",)
    too_slow = lf.judge_llm(
        ("d", "llama.cpp", "m"), need_of(30.0), lf.DeviceMemory(3800.0), prediction(50.0), budgets
    )
    assert too_slow.verdict == NO_FIT and "< 90" in too_slow.why
    unknown = prediction(None, "no other Q8_0 GGUF decoded on d")
    blind = lf.judge_llm(("d", "llama.cpp", "m"), need_of(30.0), lf.DeviceMemory(None), unknown)
    assert blind.verdict == UNCERTAIN and "no memory size in the store" in blind.why
    assert blind.to_dict()["decode_tokens_per_s"]["p50"] is None
    assert blind.to_dict()["decode_tokens_per_s"]["unknown"] == "no other Q8_0 GGUF decoded on d"
    path = resolve_model(Q8).path
    ev = lf.Evidence((lf.EfficiencyPoint("a", "r", 1, 0, 7.5, 0.7, "Q8_0"),), 1)
    no_bw = lf.predict_decode(read_gguf(path), 10, ev, None)
    assert no_bw.p50 is None and "no read bandwidth of the device at 1 threads" in no_bw.unknown


def test_the_device_memory_is_its_latest_fingerprints() -> None:
    info = [
        {"run_id": "r2", "device": "d", "fingerprint": {"memory_mb": 16.0}},
        {"run_id": "r1", "device": "d", "fingerprint": {"memory_mb": 8000.0}},
        {"run_id": "r3", "device": "d", "fingerprint": {"kernel": "no memory here"}},
        {"run_id": "r4", "device": "e", "fingerprint": {"memory_mb": 1.0}},
    ]
    assert lf.device_memory(info, "d", ["r1", "r2", "r3", "r4"]) == lf.DeviceMemory(16.0, "r2")
    assert lf.device_memory(info, "x", []) == lf.DeviceMemory(None)


def test_the_buffers_are_run_once_per_key(tmp_path: Path) -> None:
    cache = tmp_path / "c" / "llama-buffers.json"
    calls = []

    def measure() -> lf.LlamaBuffers:
        calls.append(1)
        return buffers()

    assert lf.cached_buffers(cache, "k", measure) == (buffers(), False)
    assert lf.cached_buffers(cache, "k", measure) == (buffers(), True) and len(calls) == 1
    cache.write_text("{not json")
    assert lf.cached_buffers(cache, "k", measure) == (buffers(), False) and len(calls) == 2
    info = read_gguf(resolve_model(Q8).path)
    tool = tmp_path / "llama-bench"
    tool.write_text("#!/bin/sh\n")
    assert lf.buffers_key(info, 4096, tool) != lf.buffers_key(info, 2048, tool)
    assert lf.buffers_key(info, 4096, tool) != lf.buffers_key(read_gguf(resolve_model(Q4).path), 4096, tool)


def test_the_host_tool_is_a_local_devices_runner_else_path_else_a_line_saying_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = tmp_path / "bin" / "llama-bench"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "host.toml").write_text(
        f'name = "host"\ntransport = "local"\nworkdir = "{tmp_path / "w"}"\n'
        f'[runners]\nllama_bench = {{ path = "llama-bench", push = "{tool}", libs = ["{tmp_path}/lib/libx.so"] }}\n'
    )
    path, env, where = lf.host_llama_bench(load_lab(lab), ["host"], "llama_bench")
    assert path == tool and env["LD_LIBRARY_PATH"] == str(tmp_path / "lib") and "runners.llama_bench" in where
    monkeypatch.setenv("PATH", str(tool.parent))
    assert lf.host_llama_bench(load_lab(tmp_path / "none"), [], "llama_bench")[2] == "PATH"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(
        UserError, match=r"\[runners\] llama_bench = \"/path/to/llama-bench\"`, or put llama-bench on PATH"
    ):
        lf.host_llama_bench(load_lab(tmp_path / "none"), [], "llama_bench")
