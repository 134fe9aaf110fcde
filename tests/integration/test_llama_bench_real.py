"""The real llama.cpp `llama-bench` and `llama-quantize` (../shared/lab-tools/llama.cpp-20261001-linux-x86_64,
BUILD.md there) on the built-in Llama GGUFs of every dtype: f16, q8_0 and q4_0 written by the `gguf`
package, q4_k_m made from the f16 file by the real llama-quantize.

llama.cpp loading each file is the check that its metadata and SPM tokenizer table are valid. The adapter's
parse is held to the files: llama-bench's `model_size` is llama.cpp's llama_model_size(), the sum of
ggml_nbytes over the model's tensors, so it equals read_gguf's total tensor bytes exactly (the file is larger
by its header and the 32-byte alignment padding); `model_n_params` (the sum of ggml_nelements) equals its
parameter count; and each decode sample is exactly its per-token time x n_gen (integer nanoseconds).

The tools are looked for in $EDGEBENCH_LAB_TOOLS, then in shared/lab-tools beside the repository or any folder
above it (edgebench.testing.labtools); without them these tests skip, saying so, except under CI.
Small dims (2 layers, 256 wide, 512 tokens: 1-4 MB): each llama-bench call takes well under a second.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from edgebench.errors import ModelError
from edgebench.models.gguf_models import GgufInfo, llama_model, read_gguf
from edgebench.native.llama_bench import (
    LlamaBenchCrash,
    LlamaBenchLoadError,
    LlamaBenchTest,
    llama_bench_argv,
    parse_llama_bench,
)
from edgebench.testing.labtools import tool_or_skip

pytestmark = pytest.mark.integration

TOOL_DIR = "llama.cpp-20261001-linux-x86_64"
SPEC = "llama:layers=2,hidden=256,heads=4,kv_heads=2,vocab=512,dtype="
DTYPES = ("f16", "q8_0", "q4_0", "q4_k_m")
MODEL_TYPE = {"f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K - Medium"}  # llama.cpp's words
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def tools() -> Path:
    folder = tool_or_skip(
        Path(__file__).resolve().parents[2], TOOL_DIR, "llama-bench", "llama.cpp llama-bench"
    )
    assert (folder / "llama-quantize").is_file(), f"{folder} has llama-bench but no llama-quantize"
    return folder


@pytest.fixture(scope="module")
def models(tools: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """dtype -> the built-in Llama GGUF, written once for the module (q4_k_m by the real llama-quantize)."""
    cache = tmp_path_factory.mktemp("gguf")
    return {d: llama_model(SPEC + d, cache, tools / "llama-quantize")[1] for d in DTYPES}


def bench(tools: Path, model: Path, **kw: object) -> list[LlamaBenchTest]:
    argv = llama_bench_argv(str(tools / "llama-bench"), str(model), **kw)  # type: ignore[arg-type]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    return parse_llama_bench(res.stdout, res.stderr, res.returncode, str(model), argv)


def check_against_file(tests: list[LlamaBenchTest], info: GgufInfo, dtype: str) -> None:
    for t in tests:
        assert t.model_size == info.tensor_bytes < info.path.stat().st_size
        assert t.model_n_params == info.parameter_count
        assert t.model_type == f"llama ?B {MODEL_TYPE[dtype]}" and t.model_filename == str(info.path)
        if t.kind == "decode":
            assert [round(ms * t.n_gen * 1_000_000) for ms in t.per_token_ms] == list(t.samples_ns)
        assert len(t.samples_ns) == 2 and all(s > 0 for s in t.samples_ns)


@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_cpp_loads_every_dtype_and_its_counts_are_read_gguf_s(
    dtype: str, tools: Path, models: dict[str, Path]
) -> None:
    info = read_gguf(models[dtype])
    tests = bench(tools, models[dtype], prompt=16, gen=8, depths=(0, 32), threads=(1,), repetitions=2)
    assert {(t.kind, t.n_depth) for t in tests} == {(k, d) for k in ("prefill", "decode") for d in (0, 32)}
    check_against_file(tests, info, dtype)
    assert info.file_type == f"MOSTLY_{dtype.upper()}"


def test_q4_k_m_is_llama_quantize_s_mix_and_as_stable_as_the_others(
    tools: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    info = read_gguf(models["q4_k_m"])
    assert {t.type_name for t in info.tensors} == {"F32", "Q4_K", "Q6_K"}
    assert info.tensor("output.weight").type_name == "Q6_K"  # type: ignore[union-attr]
    assert info.parameter_count == read_gguf(models["f16"]).parameter_count  # the same tensors, requantized
    _, again = llama_model(SPEC + "q4_k_m", tmp_path, tools / "llama-quantize")
    assert again.read_bytes() == models["q4_k_m"].read_bytes()  # the same spec, the same bytes


def test_two_thread_counts_are_two_tests(tools: Path, models: dict[str, Path]) -> None:
    tests = bench(tools, models["q4_0"], prompt=0, gen=8, threads=(1, 2), repetitions=2, repack=False)
    assert [(t.n_threads, t.repack) for t in tests] == [(1, False), (2, False)]
    check_against_file(tests, read_gguf(models["q4_0"]), "q4_0")


def test_a_truncated_file_is_refused_by_both_sides_naming_it(
    tools: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(models["q8_0"].read_bytes()[:600_000])
    with pytest.raises(LlamaBenchLoadError) as info:
        bench(tools, cut, prompt=8, gen=4, threads=(1,), repetitions=1, verbose=True)
    assert str(cut) in str(info.value) and "not within the file bounds" in str(info.value)
    with pytest.raises(ModelError, match="truncated") as mine:
        read_gguf(cut)
    assert str(cut) in str(mine.value)


def test_a_tool_killed_by_a_signal_is_a_crash_naming_the_model(tools: Path, models: dict[str, Path]) -> None:
    model = str(models["q4_0"])
    argv = llama_bench_argv(
        str(tools / "llama-bench"), model, prompt=0, gen=64, threads=(1,), repetitions=1000
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    proc.send_signal(signal.SIGSEGV)
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == -signal.SIGSEGV
    with pytest.raises(LlamaBenchCrash) as info:
        parse_llama_bench(out, err, proc.returncode, model, argv)
    assert (
        info.value.signal_name == "SIGSEGV" and model in str(info.value) and "--repack 0" in str(info.value)
    )
