"""Built-in Llama GGUFs: the spec and its one-line errors; small files written with the `gguf` package and
read back by `read_gguf`, held to counts made here independently (element and byte counts from the
spec's dimensions, the bytes on disk, the weights dequantized); broken files refused naming the file.

llama.cpp itself loads these files, and llama-quantize makes the q4_k_m one, in
tests/integration/test_llama_bench_real.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgebench.errors import ModelError
from edgebench.models.gguf_models import (
    GgufInfo,
    GgufTensor,
    LlamaSpec,
    llama_model,
    parse_llama_spec,
    read_gguf,
    spm_vocab,
    write_llama_gguf,
)
from edgebench.models.refs import resolve_model

SMALL = "llama:layers=2,hidden=64,ffn=96,heads=4,kv_heads=2,vocab=300"
ALIGN = 32  # GGUF's default data alignment


def small(dtype: str) -> LlamaSpec:
    return parse_llama_spec(f"{SMALL},dtype={dtype}")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- the spec ----------------------------------------------------------------------------------------------
def test_defaults_fill_what_is_left_out_and_the_identity_names_every_size() -> None:
    spec = parse_llama_spec("builtin:llama")
    assert spec == LlamaSpec() and spec.dtype == "f16" and spec.kv_head_count == spec.heads
    assert spec.ffn_size == 768  # Llama's rule: 8/3 x 256 rounded up to a multiple of 256
    assert parse_llama_spec("llama:hidden=4096").ffn_size == 11008  # LLaMA-7B's feed-forward width
    full = parse_llama_spec(
        "llama:layers=3, hidden=128,ffn=256,heads=8,kv_heads=2,vocab=1000,dtype=Q8_0,ctx=512"
    )
    assert (full.layers, full.hidden, full.ffn_size, full.heads, full.kv_head_count) == (3, 128, 256, 8, 2)
    assert full.name == "llama-l3-h128-f256-a8-kv2-v1000-c512-q8_0" and full.head_dim == 16


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("llama:layers=0", "layers"),
        ("llama:hidden=abc", "hidden"),
        ("llama:bogus=1", "bogus"),
        ("llama:layers", "layers"),
        ("llama:layers=2,layers=3", "layers"),
        ("llama:dtype=q5_0", "dtype"),
        ("llama:hidden=96,heads=5", "heads"),
        ("llama:heads=4,kv_heads=3", "kv_heads"),
        ("llama:vocab=100", "vocab"),
        ("llama:hidden=48,heads=4,ffn=64,dtype=q8_0", "hidden"),
        ("llama:hidden=64,heads=4,ffn=80,dtype=q4_0", "ffn"),
        ("llama:hidden=128,heads=4,ffn=256,dtype=q4_k_m", "hidden"),
        ("decoder:layers=2", "builtin:llama"),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ModelError) as info:
        parse_llama_spec(text)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_the_tokenizer_table_is_a_sentencepiece_one() -> None:
    tokens, scores, types = spm_vocab(300)
    assert len(tokens) == len(scores) == len(types) == 300 and len(set(tokens)) == 300
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and tokens[3 + 0x0A] == "<0x0A>"  # the newline byte
    assert types[:4] == [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        gguf.TokenType.BYTE,
    ]
    normal = tokens[259:]
    assert all(types[i] == gguf.TokenType.NORMAL for i in range(259, 300))
    # every longer piece is a merge of two pieces in the table (so SPM can reach it), ranked after them
    rank = {piece: i for i, piece in enumerate(tokens)}
    assert all(p[:-1] in rank and p[-1] in rank and rank[p[:-1]] < rank[p] for p in normal if len(p) > 1)
    assert scores[259:] == sorted(scores[259:], reverse=True)


# ---- files written and read back -----------------------------------------------------------------------
def expected_counts(spec: LlamaSpec) -> tuple[int, int]:
    """(matrix elements, norm elements) of a Llama, from its dimensions alone."""
    h, f, v, hd = spec.hidden, spec.ffn_size, spec.vocab, spec.hidden // spec.heads
    q, kv = spec.heads * hd, spec.kv_head_count * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * f
    return 2 * v * h + spec.layers * per_layer, (2 * spec.layers + 1) * h


# bytes per stored matrix element: F16 2; Q8_0 34 per 32 (f16 scale + 32 int8); Q4_0 18 per 32 (scale + 16)
BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


@pytest.mark.parametrize("dtype", ["f16", "q8_0", "q4_0"])
def test_read_gguf_matches_counts_made_from_the_spec_and_the_file(dtype: str, tmp_path: Path) -> None:
    spec = small(dtype)
    path = write_llama_gguf(spec, tmp_path / "m.gguf")
    info = read_gguf(path)
    matrices, norms = expected_counts(spec)
    assert info.parameter_count == matrices + norms
    assert info.tensor_bytes == int(matrices * BYTES_PER_ELEMENT[dtype]) + 4 * norms  # norms stay F32
    assert (info.architecture, info.layers, info.hidden, info.heads, info.kv_heads) == ("llama", 2, 64, 4, 2)
    assert (info.head_dim, info.context_length, info.vocab) == (16, 2048, 300)
    assert info.file_type == {"f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0"}[dtype]
    assert len(info.tensors) == 2 + 9 * spec.layers + 1
    norm_types = {t.type_name for t in info.tensors if t.name.endswith("norm.weight")}
    assert norm_types == {"F32"} and {t.type_name for t in info.tensors} == {"F32", dtype.upper()}
    # on disk: the header, then each tensor padded to a 32-byte boundary (the writer pads the last one too)
    reader = gguf.GGUFReader(path)
    padded = sum(-(-t.n_bytes // ALIGN) * ALIGN for t in info.tensors)
    assert path.stat().st_size == reader.data_offset + padded
    embd_row = spec.hidden * BYTES_PER_ELEMENT[dtype]
    assert info.weight_bytes_per_token() == info.tensor_bytes - spec.vocab * embd_row + embd_row
    assert info.kv_cache_bytes(64) == 2 * 2 * 2 * 16 * 64 * 2  # K and V, layers, kv heads, head dim, f16
    assert info.kv_cache_bytes(64, cache_type_bytes=1) * 2 == info.kv_cache_bytes(64)
    assert info.bytes_per_token(64) == info.weight_bytes_per_token() + info.kv_cache_bytes(64)


def test_the_dtypes_store_the_same_seeded_weights_and_the_same_spec_the_same_bytes(tmp_path: Path) -> None:
    stored = {}
    for dtype in ("f16", "q8_0", "q4_0"):
        path = write_llama_gguf(small(dtype), tmp_path / f"{dtype}.gguf")
        again = write_llama_gguf(small(dtype), tmp_path / f"{dtype}-again.gguf")
        assert sha(path) == sha(again)  # stable content hash: the push cache and the store key on it
        reader = gguf.GGUFReader(path)
        stored[dtype] = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    reference = stored["f16"]["blk.1.ffn_down.weight"]
    assert reference.shape == (64, 96) and 0.015 < reference.std() < 0.025  # N(0, 0.02)
    for dtype, tolerance in (("q8_0", 0.01), ("q4_0", 0.15)):
        got = stored[dtype]["blk.1.ffn_down.weight"]
        assert np.abs(got - reference).max() / np.abs(reference).max() < tolerance, dtype
    assert np.all(stored["q4_0"]["output_norm.weight"] == 1.0)


def test_a_different_spec_is_a_different_file(tmp_path: Path) -> None:
    a = write_llama_gguf(small("q8_0"), tmp_path / "a.gguf")
    b = write_llama_gguf(parse_llama_spec(f"{SMALL},dtype=q8_0,ctx=4096"), tmp_path / "b.gguf")
    assert sha(a) != sha(b) and read_gguf(b).context_length == 4096


# ---- broken files -------------------------------------------------------------------------------------------
def test_truncated_non_gguf_and_empty_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    whole = write_llama_gguf(small("q8_0"), tmp_path / "whole.gguf").read_bytes()
    cases = {
        "cut-in-tensors.gguf": (whole[: len(whole) - 1000], "truncated"),
        "cut-in-header.gguf": (whole[:200], "truncated"),
        "text.gguf": (b"not a model at all\n", "not a GGUF file"),
        "empty.gguf": (b"", "empty"),
    }
    for name, (data, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ModelError) as info:
            read_gguf(path)
        assert str(path) in str(info.value) and words in str(info.value) and "\n" not in str(info.value), name


@pytest.mark.parametrize(
    ("block_count", "words"),
    [(None, "has no llama.block_count"), ("two", "llama.block_count is 'two', not a whole number")],
)
def test_a_missing_or_mistyped_key_the_floor_needs_is_named(
    block_count: str | None, words: str, tmp_path: Path
) -> None:
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    if block_count is not None:
        writer.add_string("llama.block_count", block_count)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_context_length(128)
    writer.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError) as info:
        read_gguf(path)
    assert str(path) in str(info.value) and words in str(info.value) and "\n" not in str(info.value)


# ---- resolution, caching, the quantizer -----------------------------------------------------------------
def test_builtin_llama_resolves_to_a_cached_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ref = resolve_model(f"builtin:{SMALL},dtype=q4_0")
    assert ref.format == "gguf" and ref.name == "llama-l2-h64-f96-a4-kv2-v300-q4_0"
    assert ref.path.suffix == ".gguf" and ref.path.is_relative_to(tmp_path / "cache")
    written = ref.path.stat().st_mtime_ns
    assert resolve_model(f"builtin:{SMALL},dtype=q4_0").path.stat().st_mtime_ns == written  # written once
    assert not [p for p in ref.path.parent.iterdir() if p.name.startswith(".")]  # no temporary left
    # a .gguf path is format "gguf" by its suffix, checked before use
    assert resolve_model(str(ref.path)).format == "gguf"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(ref.path.read_bytes()[:5000])
    with pytest.raises(ModelError, match="truncated"):
        resolve_model(str(broken))


def test_q4_k_m_without_llama_quantize_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_llama_spec("llama:hidden=256,heads=4,vocab=300,dtype=q4_k_m")
    with pytest.raises(ModelError) as info:
        write_llama_gguf(spec, tmp_path / "k.gguf", quantize_tool=tmp_path / "llama-quantize")
    assert str(tmp_path / "llama-quantize") in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv("PATH", str(tmp_path))  # none on PATH either
    with pytest.raises(ModelError, match="llama-quantize on PATH"):
        llama_model("llama:hidden=256,heads=4,vocab=300,dtype=q4_k_m", cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())  # neither the f16 source nor half a file is left
    assert not (tmp_path / "k.gguf").exists()


def test_a_failing_quantizer_is_one_line_with_its_words(tmp_path: Path) -> None:
    tool = tmp_path / "llama-quantize"
    tool.write_text("#!/bin/sh\necho 'main: failed to quantize: bad things' >&2\nexit 1\n")
    tool.chmod(0o755)
    spec = parse_llama_spec("llama:hidden=256,heads=4,vocab=300,dtype=q4_k_m")
    with pytest.raises(ModelError) as info:
        write_llama_gguf(spec, tmp_path / "k.gguf", quantize_tool=tool)
    assert "failed to quantize: bad things" in str(info.value) and "exited 1" in str(info.value)
    assert [p.name for p in tmp_path.iterdir()] == ["llama-quantize"]  # the f16 source was removed


def test_a_tied_lm_head_reads_the_whole_embedding_per_token() -> None:
    def info(*names: str) -> GgufInfo:
        tensors = tuple(GgufTensor(n, "Q8_0", (64, 300), 64 * 300, 64 * 300 * 34 // 32) for n in names)
        return GgufInfo(Path("x.gguf"), "llama", 1, 64, 4, 4, 16, 128, 300, "MOSTLY_Q8_0", tensors)

    untied = info("token_embd.weight", "output.weight")
    tied = info("token_embd.weight", "blk.0.attn_q.weight")
    row = 64 * 34 // 32
    assert untied.weight_bytes_per_token() == untied.tensor_bytes - 300 * row + row
    assert tied.weight_bytes_per_token() == tied.tensor_bytes  # the embedding is the LM head: read whole


def test_an_architecture_llama_cpp_does_not_know_is_named_before_anything_runs(tmp_path: Path) -> None:
    from edgebench.models.gguf_models import check_architecture

    path = tmp_path / "future.gguf"
    writer = gguf.GGUFWriter(path, "transformer9000")
    for key, value in (("block_count", 1), ("embedding_length", 64), ("context_length", 128)):
        writer.add_uint32(f"transformer9000.{key}", value)
    writer.add_uint32("transformer9000.attention.head_count", 4)
    writer.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = read_gguf(path)
    assert info.architecture == "transformer9000"
    with pytest.raises(
        ModelError, match=r"future\.gguf: architecture 'transformer9000' is not one llama.cpp"
    ):
        check_architecture(info, path)
    known = read_gguf(resolve_model("builtin:llama:layers=1,hidden=64,heads=2,vocab=300").path)
    check_architecture(known, path)  # llama is
