"""Built-in decoders: readable identities, one-line errors, the int8 / int4 packing against onnxruntime's
own packer and kernels, the fp32 graph against a numpy transformer, and the exact byte counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebench.errors import ModelError
from edgebench.models.decoders import (
    DTYPES,
    DecoderConfig,
    decoder_model,
    dequantize_int4,
    kv_bytes_per_position,
    parse_decoder,
    per_token_bytes,
    quantize_int4,
    quantize_int8,
    stored_bytes,
    weight,
)
from edgebench.models.refs import resolve_model
from edgebench.probes.decode import weight_read_bytes

SMALL = "decoder:layers=2,hidden=64,heads=4,vocab=97,ffn=128"


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def one_node(op: str, inits: list[onnx.TensorProto], k: int, n: int, **attrs: object) -> onnx.ModelProto:
    node = helper.make_node(op, ["a", *(i.name for i in inits)], ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def run_one(model: onnx.ModelProto, a: np.ndarray, tmp_path: Path) -> np.ndarray:
    path = tmp_path / "one.onnx"
    onnx.save(model, path)
    return session(path).run(["y"], {"a": a})[0]


# ---- names and errors ---------------------------------------------------------------------------------
def test_identity_is_readable_and_names_every_size() -> None:
    c = parse_decoder("decoder:layers=4,hidden=512,heads=8,vocab=32000,ffn=2048,dtype=int8")
    assert c.name == "decoder-l4-h512-a8-f2048-v32000-int8"
    assert parse_decoder("decoder").name == "decoder-l2-h256-a4-f1024-v1024-fp32"  # ffn defaults to 4x hidden
    assert parse_decoder("decoder:ctx=512").name.endswith("-c512-fp32")


def test_resolve_model_gives_the_readable_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ref = resolve_model(f"builtin:{SMALL},dtype=int4")
    assert ref.name == "decoder-l2-h64-a4-f128-v97-int4"
    assert ref.path.parent == tmp_path / "edgebench" / "models" and ref.path.exists()
    again = resolve_model(f"builtin:{SMALL},dtype=int4")
    assert again.path == ref.path and again.path.stat().st_mtime == ref.path.stat().st_mtime  # written once


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("decoder:layers=two", "layers='two' is not a whole number"),
        ("decoder:depth=2", "'depth=2' is not KEY=VALUE with KEY one of layers, hidden"),
        ("decoder:dtype=fp16", "dtype 'fp16' is not one of fp32, int8, int4"),
        ("decoder:hidden=100,heads=3", "hidden 100 is not a multiple of heads 3"),
        ("decoder:hidden=48,heads=4,dtype=int4", "multiples of 32"),
        ("decoder:layers=0", "layers must be positive"),
        ("decoder:layers=40,hidden=2048,vocab=8000", "over what one ONNX file can hold (2 GiB)"),
    ],
)
def test_bad_keys_are_one_line_errors(key: str, message: str) -> None:
    with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        parse_decoder(key)
    assert "\n" not in str(info.value)


# ---- quantization against onnxruntime ------------------------------------------------------------------
def test_int4_packing_is_onnxruntimes_byte_for_byte() -> None:
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    w = np.random.default_rng(3).standard_normal((256, 40)).astype(np.float32)
    packed = np.zeros((40, 8, 16), np.uint8)
    scales = np.zeros((40, 8), np.float32)
    zero_points = np.zeros((40, 4), np.uint8)
    quantize_matmul_4bits(packed, w, scales, zero_points, 32, 40, 256, True)
    ours, our_scales = quantize_int4(w)
    assert ours.shape == packed.shape and np.array_equal(ours, packed)
    assert np.array_equal(our_scales, scales)


def test_matmulnbits_computes_with_the_dequantized_weight(tmp_path: Path) -> None:
    k, n = 128, 24
    w = np.random.default_rng(4).standard_normal((k, n)).astype(np.float32)
    packed, scale = quantize_int4(w)
    inits = [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scale, "s")]
    model = one_node("MatMulNBits", inits, k, n, K=k, N=n, bits=4, block_size=32)
    a = np.random.default_rng(5).standard_normal((3, k)).astype(np.float32)
    want = a @ dequantize_int4(packed, scale)
    got = run_one(model, a, tmp_path)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)
    # Half a step inside the range; up to one step where the far end clips at code 15 (+7 x scale).
    step = np.repeat(np.abs(scale), 32, axis=1).T  # [K, N], each block's scale
    assert np.all(np.abs(dequantize_int4(packed, scale) - w) <= step + 1e-6)


def test_dynamic_quantize_matmul_is_int8_per_column(tmp_path: Path) -> None:
    k, n = 64, 16
    w = np.random.default_rng(6).standard_normal((k, n)).astype(np.float32)
    codes, scale = quantize_int8(w)
    inits = [numpy_helper.from_array(codes, "b"), numpy_helper.from_array(scale, "s")]
    a = np.random.default_rng(7).standard_normal((3, k)).astype(np.float32)
    got = run_one(one_node("DynamicQuantizeMatMul", inits, k, n), a, tmp_path)
    # The reference: DynamicQuantizeLinear's uint8 activations (per tensor), integer matmul, both scales.
    a_scale = (max(0.0, a.max()) - min(0.0, a.min())) / 255.0
    zero = np.clip(np.rint(-min(0.0, a.min()) / a_scale), 0, 255)
    qa = np.clip(np.rint(a / a_scale) + zero, 0, 255)
    want = ((qa - zero) @ codes.astype(np.float64)) * a_scale * scale
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


# ---- the graph ---------------------------------------------------------------------------------------
def numpy_decoder(c: DecoderConfig, ids: list[int]) -> np.ndarray:
    """An independent fp32 forward of the same decoder (no cache): logits [seq, vocab]."""
    table = np.random.default_rng([20, c.layers, c.hidden, c.vocab, c.ctx])
    wte = table.standard_normal((c.vocab, c.hidden), dtype=np.float32) * 0.02
    wpe = table.standard_normal((c.ctx, c.hidden), dtype=np.float32) * 0.01
    x = (wte[ids] + wpe[: len(ids)]).astype(np.float64)

    def norm(v: np.ndarray) -> np.ndarray:
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)

    from scipy.special import erf

    s, a, d = len(ids), c.heads, c.head_dim
    causal = np.tril(np.ones((s, s), bool))
    for i in range(c.layers):
        qkv = norm(x) @ weight(c, 4 * i, c.hidden, 3 * c.hidden)
        q, k, v = (p.reshape(s, a, d).transpose(1, 0, 2) for p in np.split(qkv, 3, axis=-1))
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(d), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + (probs @ v).transpose(1, 0, 2).reshape(s, c.hidden) @ weight(c, 4 * i + 1, c.hidden, c.hidden)
        f = norm(x) @ weight(c, 4 * i + 2, c.hidden, c.ffn_size)
        x = x + (0.5 * f * (1 + erf(f / np.sqrt(2)))) @ weight(c, 4 * i + 3, c.ffn_size, c.hidden)
    return norm(x) @ weight(c, 4 * c.layers, c.hidden, c.vocab)


def feeds(c: DecoderConfig, ids: list[int], past: dict[str, np.ndarray] | None, start: int) -> dict:
    f = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, start + len(ids)), np.int64),
        "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None],
    }
    for i in range(c.layers):
        for part in ("key", "value"):
            empty = np.zeros((1, c.heads, 0, c.head_dim), np.float32)
            f[f"past_key_values.{i}.{part}"] = past[f"present.{i}.{part}"] if past else empty
    return f


def test_fp32_graph_is_the_numpy_transformer(tmp_path: Path) -> None:
    c = parse_decoder(SMALL)
    _, path = decoder_model(SMALL, tmp_path)
    onnx.checker.check_model(onnx.load(str(path)))
    ids = [int(t) for t in np.random.default_rng(8).integers(0, c.vocab, 9)]
    logits = session(path).run(["logits"], feeds(c, ids, None, 0))[0][0]
    want = numpy_decoder(c, ids)
    assert np.allclose(logits, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cache_fed_back_gives_the_logits_of_the_whole_sequence(dtype: str, tmp_path: Path) -> None:
    key = f"{SMALL},dtype={dtype}"
    c = parse_decoder(key)
    sess = session(decoder_model(key, tmp_path)[1])
    names = [o.name for o in sess.get_outputs()]
    prompt = [int(t) for t in np.random.default_rng(9).integers(0, c.vocab, 6)]
    out = dict(zip(names, sess.run(names, feeds(c, prompt, None, 0)), strict=True))
    tokens = prompt + [int(out["logits"][0, -1].argmax())]
    for _ in range(4):
        out = dict(zip(names, sess.run(names, feeds(c, tokens[-1:], out, len(tokens) - 1)), strict=True))
        tokens.append(int(out["logits"][0, -1].argmax()))
    assert out["present.1.value"].shape == (1, c.heads, len(tokens) - 1, c.head_dim)
    whole = sess.run(["logits"], feeds(c, tokens[:-1], None, 0))[0][0]
    # int8 quantizes activations per tensor, so a prefill's scale differs from a single step's.
    tolerance = 0.05 if dtype == "int8" else 1e-4
    assert np.abs(whole[-1] - out["logits"][0, -1]).max() <= tolerance * np.abs(whole[-1]).max()


def test_the_three_dtypes_quantize_the_same_weights() -> None:
    c = parse_decoder(SMALL)
    w = weight(c, 2, c.hidden, c.ffn_size)
    codes, scale = quantize_int8(w)
    assert np.abs(codes * scale - w).max() <= scale.max() / 2 + 1e-7
    assert np.abs(dequantize_int4(*quantize_int4(w)) - w).max() < 0.2 * np.abs(w).max()
    assert np.array_equal(w, weight(parse_decoder(f"{SMALL},dtype=int4"), 2, c.hidden, c.ffn_size))


@pytest.mark.parametrize("dtype", DTYPES)
def test_byte_counts_are_exact(dtype: str, tmp_path: Path) -> None:
    key = f"{SMALL},dtype={dtype}"
    c = parse_decoder(key)
    _, path = decoder_model(key, tmp_path)
    counted = weight_read_bytes(onnx.load(str(path)))
    stored = sum(numpy_helper.to_array(t).nbytes for t in onnx.load(str(path)).graph.initializer)
    assert counted.stored == stored == stored_bytes(c)
    assert counted.per_token == per_token_bytes(c)
    assert set(counted.gathered) == {"wte", "wpe"}
    assert kv_bytes_per_position(c) == 2 * c.layers * c.heads * c.head_dim * 4
    if dtype != "fp32":
        assert counted.custom_ops == (
            ("com.microsoft:DynamicQuantizeMatMul",) if dtype == "int8" else ("com.microsoft:MatMulNBits",)
        )
