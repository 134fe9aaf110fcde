"""Built-in decoder-only transformers for the decode probe, generated with onnx.helper (no downloads):
`builtin:decoder:layers=L,hidden=H,heads=A,vocab=V,ffn=F,dtype=D[,ctx=C]`, whose identity in the store is
`decoder-lL-hH-aA-fF-vV-D` (e.g. decoder-l4-h512-a8-f2048-v32000-int8; `-cC` when ctx is not 2048).

The graph is GPT-2 shaped and speaks the Optimum / onnxruntime-genai decoder convention:

  inputs   input_ids [batch, seq] int64, attention_mask [batch, total] int64, position_ids [batch, seq] int64,
           past_key_values.N.key / .value [batch, heads, past, head_dim] float32
  outputs  logits [batch, seq, vocab] float32, present.N.key / .value [batch, heads, total, head_dim]

Each layer: LayerNorm, one fused QKV projection, attention over the past keys plus the new ones (masked by
attention_mask and causally by position), output projection, residual; LayerNorm, GELU feed-forward,
residual. A final LayerNorm and an untied LM head. No biases.

dtype says how the projection and LM-head weights are stored (embeddings and LayerNorms stay fp32 in all of
them, as `quantize_dynamic` and onnxruntime-genai's model builder leave them):
  fp32  MatMul.
  int8  com.microsoft DynamicQuantizeMatMul: int8 weights, one fp32 scale per output column (symmetric,
        zero point 0); onnxruntime quantizes the activations per tensor at run time.
  int4  com.microsoft MatMulNBits: 4-bit codes in blocks of 32 along K, packed two per byte low nibble first,
        B shaped [N, K/32, 16], one fp32 scale per block ([N, K/32]), symmetric (no zero-point input: the
        default 8; scales by onnxruntime's own rule), accuracy_level 4 (int8 compute, what the model
        builder uses on CPU). onnxruntime has had MatMulNBits since 1.17 (this package asks for >=1.17);
        the tests check the packing byte for byte against onnxruntime's own packer.
Every weight comes from its own seeded generator, so the three dtypes quantize the same fp32 decoder.
Files are cached by name and generator revision (like the other built-ins); a big one is written once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ModelError
from ..files import seal
from .cache import models_cache_dir

DECODER_REVISION = 1  # bump when the builder changes, so caches regenerate
OPSET = 17
MS_DOMAIN = "com.microsoft"
DTYPES = ("fp32", "int8", "int4")
INT4_BLOCK = 32
SEED = 20
PROTOBUF_LIMIT = 2**31 - 64 * 2**20  # one ONNX file is one protobuf message: under 2 GiB with headroom
MAX_POSITIONS_KEY = "edgebench.max_positions"  # model metadata the agent reads to refuse a longer run


@dataclass(frozen=True)
class DecoderConfig:
    """The sizes of a built-in decoder; `ffn` 0 means 4 x hidden."""

    layers: int = 2
    hidden: int = 256
    heads: int = 4
    vocab: int = 1024
    ffn: int = 0
    dtype: str = "fp32"
    ctx: int = 2048

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def name(self) -> str:
        """The model's identity in the store: readable, one per configuration."""
        ctx = f"-c{self.ctx}" if self.ctx != DecoderConfig.ctx else ""
        h, a, f, v = self.hidden, self.heads, self.ffn_size, self.vocab
        return f"decoder-l{self.layers}-h{h}-a{a}-f{f}-v{v}{ctx}-{self.dtype}"

    def linears(self) -> Iterator[tuple[str, int, int]]:
        """(name, K, N) of every projection, in graph order."""
        h, f = self.hidden, self.ffn_size
        for i in range(self.layers):
            yield from ((f"l{i}.qkv", h, 3 * h), (f"l{i}.o", h, h), (f"l{i}.fc1", h, f), (f"l{i}.fc2", f, h))
        yield ("lm_head", h, self.vocab)

    def check(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "dtype" and (value < 0 or (value == 0 and f.name != "ffn")):
                raise ModelError(f"builtin:decoder: {f.name} must be positive, got {value}")
        if self.dtype not in DTYPES:
            raise ModelError(f"builtin:decoder: dtype '{self.dtype}' is not one of {', '.join(DTYPES)}")
        if self.hidden % self.heads:
            raise ModelError(f"builtin:decoder: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.dtype == "int4" and (self.hidden % INT4_BLOCK or self.ffn_size % INT4_BLOCK):
            raise ModelError(
                f"builtin:decoder: int4 packs blocks of {INT4_BLOCK} along K: hidden and ffn must be "
                f"multiples of {INT4_BLOCK}"
            )
        if stored_bytes(self) > PROTOBUF_LIMIT:
            raise ModelError(
                f"builtin:decoder: {self.name} holds {stored_bytes(self) / 2**30:.2f} GiB of weights, over "
                "what one ONNX file can hold (2 GiB): use fewer layers or a smaller hidden size"
            )


def parse_decoder(key: str) -> DecoderConfig:
    """`decoder` or `decoder:layers=4,hidden=512,...` -> its checked config; a bad key is one line."""
    _, _, spec = key.partition(":")
    known = {f.name: f for f in fields(DecoderConfig)}
    values: dict[str, int | str] = {}
    for item in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ModelError(f"builtin:decoder: '{item}' is not KEY=VALUE with KEY one of {', '.join(known)}")
        if name == "dtype":
            values[name] = text.strip()
            continue
        try:
            values[name] = int(text)
        except ValueError:
            raise ModelError(f"builtin:decoder: {name}={text!r} is not a whole number") from None
    config = replace(DecoderConfig(), **values)  # type: ignore[arg-type]
    config.check()
    return config


# ---- exact byte counts (what the builder writes; the tests hold the probe's counter to these) ---------
def linear_bytes(k: int, n: int, dtype: str) -> int:
    """Bytes of one projection's weights as stored: codes plus scales."""
    if dtype == "int8":
        return k * n + 4 * n
    if dtype == "int4":
        blocks = k // INT4_BLOCK
        return n * blocks * (INT4_BLOCK // 2) + 4 * n * blocks
    return 4 * k * n


# Shape and scalar constants of the graph: the mask's (two int64 scalars, two axes lists, two floats) and
# each layer's (three head-split shapes, the QKV split, the merge shape, four float scalars).
GRAPH_CONSTANT_BYTES = 8 + 8 + 8 + 16 + 4 + 4
LAYER_CONSTANT_BYTES = 3 * 32 + 24 + 24 + 4 * 4


def stored_bytes(c: DecoderConfig) -> int:
    """Every initializer byte of the model (embeddings and position table included)."""
    tables = 4 * c.hidden * (c.vocab + c.ctx)
    return tables + per_token_bytes(c) - 2 * 4 * c.hidden


def per_token_bytes(c: DecoderConfig) -> int:
    """Weight bytes one decode step must read: every projection, the LayerNorms, the constants and one
    row of each table (the token's embedding, its position's)."""
    norms = 4 * 4 * c.hidden * c.layers + 2 * 4 * c.hidden
    constants = GRAPH_CONSTANT_BYTES + LAYER_CONSTANT_BYTES * c.layers
    projections = sum(linear_bytes(k, n, c.dtype) for _, k, n in c.linears())
    return projections + norms + constants + 2 * 4 * c.hidden


def kv_bytes_per_position(c: DecoderConfig) -> int:
    return 2 * c.layers * c.hidden * 4


# ---- weights ---------------------------------------------------------------------------------------------
def weight(c: DecoderConfig, slot: int, k: int, n: int) -> np.ndarray:
    """The fp32 weight [K, N] of slot `slot`: the same numbers in every dtype of this configuration."""
    rng = np.random.default_rng([SEED, c.layers, c.hidden, c.ffn_size, c.vocab, slot])
    w = rng.standard_normal((k, n), dtype=np.float32)
    w *= np.float32(1.0 / np.sqrt(k))
    return w


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-column int8: (codes [K, N] int8, scales [N] fp32)."""
    scale = np.abs(w).max(axis=0) / 127.0
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return codes, scale.astype(np.float32)


def quantize_int4(w: np.ndarray, block: int = INT4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric blockwise 4-bit as MatMulNBits reads it: (B [N, K/block, block/2] uint8, scales
    [N, K/block] fp32). onnxruntime's own rule (its `quantize_matmul_4bits`, symmetric): the block's
    element of largest magnitude maps to code 0, i.e. scale = that element / -8, codes = round(w / scale)
    + 8 clipped to 0..15, so the full signed range -8..7 is used."""
    k, n = w.shape
    blocks = w.T.reshape(n, k // block, block)
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], 2)[..., 0]
    scale = (largest / -8.0).astype(np.float32)
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint(blocks / scale[..., None]) + 8, 0, 15).astype(np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(packed), scale


def dequantize_int4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The fp32 [K, N] weight MatMulNBits computes with (for the tests and the accuracy notes)."""
    n, kb, half = packed.shape
    codes = np.empty((n, kb, 2 * half), np.float32)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return ((codes - 8.0) * scale[..., None]).reshape(n, kb * 2 * half).T


# ---- graph -------------------------------------------------------------------------------------------
class _Builder:
    """Nodes and initializers of one decoder graph."""

    def __init__(self, c: DecoderConfig) -> None:
        self.c = c
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.slot = 0

    def node(self, op: str, inputs: list[str], output: str, domain: str = "", **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, domain=domain, **attrs))
        return output

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def linear(self, x: str, name: str, k: int, n: int) -> str:
        """x [.., K] @ W [K, N] in the configuration's dtype."""
        w = weight(self.c, self.slot, k, n)
        self.slot += 1
        if self.c.dtype == "fp32":
            return self.node("MatMul", [x, self.const(f"{name}.weight", w)], f"{name}/out")
        if self.c.dtype == "int8":
            codes, scale = quantize_int8(w)
            del w
            inputs = [x, self.const(f"{name}.weight_q", codes), self.const(f"{name}.scale", scale)]
            return self.node("DynamicQuantizeMatMul", inputs, f"{name}/out", domain=MS_DOMAIN)
        packed, scale = quantize_int4(w)
        del w
        inputs = [x, self.const(f"{name}.weight_q4", packed), self.const(f"{name}.scale", scale)]
        return self.node(
            "MatMulNBits",
            inputs,
            f"{name}/out",
            domain=MS_DOMAIN,
            K=k,
            N=n,
            bits=4,
            block_size=INT4_BLOCK,
            accuracy_level=4,
        )

    def layer_norm(self, x: str, name: str) -> str:
        h = self.c.hidden
        g = self.const(f"{name}.gamma", np.ones(h, np.float32))
        b = self.const(f"{name}.beta", np.zeros(h, np.float32))
        return self.node("LayerNormalization", [x, g, b], f"{name}/out", axis=-1, epsilon=1e-5)

    def attention_bias(self) -> str:
        """[batch, 1, seq, total] additive mask: 0 where a query may see a key, -1e9 elsewhere.
        A query at position past+i sees keys 0..past+i that attention_mask keeps."""
        one = self.const("one_i64", np.array(1, np.int64))
        zero = self.const("zero_i64", np.array(0, np.int64))
        seq = self.node("Gather", [self.node("Shape", ["input_ids"], "ids_shape"), one], "seq_len")
        total = self.node("Gather", [self.node("Shape", ["attention_mask"], "mask_shape"), one], "total_len")
        past = self.node("Sub", [total, seq], "past_len")
        q_pos = self.node("Range", [past, total, one], "q_pos")
        k_pos = self.node("Range", [zero, total, one], "k_pos")
        q_col = self.node("Unsqueeze", [q_pos, self.const("axis_1", np.array([1], np.int64))], "q_col")
        causal = self.node("LessOrEqual", [k_pos, q_col], "causal")
        keep = self.node("Cast", ["attention_mask"], "mask_bool", to=TensorProto.BOOL)
        keep4 = self.node("Unsqueeze", [keep, self.const("axes_12", np.array([1, 2], np.int64))], "mask4")
        allowed = self.node("And", [keep4, causal], "allowed")
        zero_f = self.const("zero_f", np.array(0.0, np.float32))
        neg = self.const("neg_inf", np.array(-1e9, np.float32))
        return self.node("Where", [allowed, zero_f, neg], "attn_bias")

    def heads(self, x: str, name: str) -> str:
        c = self.c
        shape = self.const(f"{name}.split_shape", np.array([0, 0, c.heads, c.head_dim], np.int64))
        return self.node(
            "Transpose", [self.node("Reshape", [x, shape], f"{name}4")], f"{name}h", perm=[0, 2, 1, 3]
        )

    def attention(self, x: str, i: int, bias: str) -> str:
        c = self.c
        qkv = self.linear(self.layer_norm(x, f"l{i}.ln1"), f"l{i}.qkv", c.hidden, 3 * c.hidden)
        split = self.const(f"l{i}.split", np.array([c.hidden] * 3, np.int64))
        parts = [f"l{i}.q", f"l{i}.k", f"l{i}.v"]
        self.nodes.append(helper.make_node("Split", [qkv, split], parts, name=f"l{i}.split", axis=-1))
        q, k, v = (self.heads(p, p) for p in parts)
        key = self.node("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
        value = self.node("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
        kt = self.node("Transpose", [key], f"l{i}.kt", perm=[0, 1, 3, 2])
        scores = self.node("MatMul", [q, kt], f"l{i}.scores")
        scale = self.const(f"l{i}.scale_qk", np.array(1.0 / np.sqrt(c.head_dim), np.float32))
        biased = self.node("Add", [self.node("Mul", [scores, scale], f"l{i}.scaled"), bias], f"l{i}.biased")
        probs = self.node("Softmax", [biased], f"l{i}.probs", axis=-1)
        ctx = self.node("MatMul", [probs, value], f"l{i}.ctx")
        merged = self.node("Transpose", [ctx], f"l{i}.ctx_t", perm=[0, 2, 1, 3])
        flat = self.const(f"l{i}.merge_shape", np.array([0, 0, c.hidden], np.int64))
        out = self.linear(self.node("Reshape", [merged, flat], f"l{i}.merged"), f"l{i}.o", c.hidden, c.hidden)
        return self.node("Add", [x, out], f"l{i}.res1")

    def feed_forward(self, x: str, i: int) -> str:
        c = self.c
        f = self.linear(self.layer_norm(x, f"l{i}.ln2"), f"l{i}.fc1", c.hidden, c.ffn_size)
        # GELU written out with Erf so every runtime and opset takes it.
        g0 = self.node(
            "Mul", [f, self.const(f"l{i}.rsqrt2", np.array(1 / np.sqrt(2), np.float32))], f"l{i}.g0"
        )
        g1 = self.node(
            "Add",
            [self.node("Erf", [g0], f"l{i}.g1"), self.const(f"l{i}.one", np.array(1.0, np.float32))],
            f"l{i}.g2",
        )
        g = self.node(
            "Mul",
            [self.node("Mul", [f, g1], f"l{i}.g3"), self.const(f"l{i}.half", np.array(0.5, np.float32))],
            f"l{i}.gelu",
        )
        out = self.linear(g, f"l{i}.fc2", c.ffn_size, c.hidden)
        return self.node("Add", [x, out], f"l{i}.res2")


def build_decoder(c: DecoderConfig) -> onnx.ModelProto:
    """The decoder graph of config `c` with its seeded weights."""
    b = _Builder(c)
    table_rng = np.random.default_rng([SEED, c.layers, c.hidden, c.vocab, c.ctx])
    wte = b.const("wte", (table_rng.standard_normal((c.vocab, c.hidden), dtype=np.float32) * 0.02))
    wpe = b.const("wpe", (table_rng.standard_normal((c.ctx, c.hidden), dtype=np.float32) * 0.01))
    x = b.node(
        "Add",
        [b.node("Gather", [wte, "input_ids"], "tok_emb"), b.node("Gather", [wpe, "position_ids"], "pos_emb")],
        "emb",
    )
    bias = b.attention_bias()
    for i in range(c.layers):
        x = b.feed_forward(b.attention(x, i, bias), i)
    b.linear(b.layer_norm(x, "ln_f"), "lm_head", c.hidden, c.vocab)
    b.nodes[-1].output[0] = "logits"
    kv = ["batch", c.heads, "past_sequence_length", c.head_dim]
    present = ["batch", c.heads, "total_sequence_length", c.head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch", "total_sequence_length"]
        ),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence_length"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence_length", c.vocab])
    ]
    for i in range(c.layers):
        for part in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{part}", TensorProto.FLOAT, kv))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{part}", TensorProto.FLOAT, present))
    graph = helper.make_graph(b.nodes, c.name, inputs, outputs, b.inits)
    opsets = [helper.make_opsetid("", OPSET)]
    if c.dtype != "fp32":
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="edgebench")
    model.ir_version = 8
    helper.set_model_props(model, {MAX_POSITIONS_KEY: str(c.ctx), "edgebench.builtin": c.name})
    return model


def decoder_model(key: str, cache_dir: Path | None = None) -> tuple[str, Path]:
    """(identity, path) of the built-in decoder `key` ("decoder:layers=..."), written once into the cache."""
    config = parse_decoder(key)
    folder = cache_dir or models_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{config.name}.r{DECODER_REVISION}.onnx"
    if not path.exists():
        model = build_decoder(config)
        if stored_bytes(config) < 256 * 2**20:
            onnx.checker.check_model(model)  # the checker serializes a copy: skipped on the big ones
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        onnx.save(model, tmp)
        del model
        seal(tmp)
        os.replace(tmp, path)
    return config.name, path
