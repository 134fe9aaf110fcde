"""Built-in Llama GGUF models for llama.cpp, and what a GGUF file holds, read from its own tensor table.

`builtin:llama:layers=L,hidden=H,ffn=F,heads=N,kv_heads=K,vocab=V,dtype=D[,ctx=C]` is a llama-architecture
GGUF written with the `gguf` package (no downloads): seeded random weights (every tensor from its own seeded
generator, so the same spec gives the same bytes, hence the same content hash, and the four dtypes hold the
same weights), every tensor llama.cpp's llama loader asks for (token_embd; per layer attn_norm, attn_q/k/v,
attn_output, ffn_norm, ffn_gate/up/down; output_norm, output: an untied LM head), the `llama.*` hyper-
parameters, and a SentencePiece ("llama") tokenizer table of `vocab` entries: <unk>, <s>, </s>, the 256 byte
fallbacks <0x00>..<0xFF>, then pieces built from shorter ones (each scored by its rank), so the table is one
a SPM tokenizer can use. Its identity in the store is `llama-lL-hH-fF-aN-kvK-vV-D` (`-cC` when ctx is not
2048).

dtype says how the 2-D weights are stored; norms stay F32 in all of them, as llama.cpp's converter and
llama-quantize leave them:
  f16     F16.
  q8_0    Q8_0 (blocks of 32, one f16 scale), quantized by `gguf.quants.quantize`.
  q4_0    Q4_0 (blocks of 32, 4-bit codes, one f16 scale), quantized by `gguf.quants.quantize`.
  q4_k_m  the f16 file quantized by llama.cpp's own `llama-quantize IN OUT Q4_K_M` (the `gguf` package has no
          K-quant writer): its mix (Q4_K, with Q6_K for the LM head and some attn_v / ffn_down) is the tool's.
K-quants pack 256 values per block along a row, so q4_k_m asks hidden and ffn to be multiples of 256
(llama-quantize would otherwise fall back to other types and the file would not be what its name says);
q8_0 and q4_0 ask multiples of 32.

`read_gguf` reads architecture, sizes and every tensor's stored bytes from the file itself, never from its
name: what the decode floor (weight bytes read per token, plus the KV cache at a depth) is computed from.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ModelError
from .cache import written_once

if TYPE_CHECKING:  # gguf is imported only where a GGUF file is written or read
    import gguf

GGUF_REVISION = 1  # bump when the writer changes, so caches regenerate
LLAMA_PREFIX = "llama"
DTYPES = ("f16", "q8_0", "q4_0", "q4_k_m")
SEED = 46
WEIGHT_STD = 0.02  # the usual transformer init scale: activations stay finite through the layers
RMS_EPS = 1e-5
ROPE_BASE = 10000.0
N_SPECIAL = 3  # <unk>, <s>, </s>
N_BYTES = 256  # SPM byte fallbacks <0x00>..<0xFF>
MIN_VOCAB = N_SPECIAL + N_BYTES + 1
PIECE_ALPHABET = "\u2581etaoinshrdlucmfwypvbgkjqxz"  # SPM's word-start mark, then letters by frequency
QUANTIZE_TOOL = "llama-quantize"
QUANTIZE_TIMEOUT_S = 600.0
_BLOCK = {"f16": 1, "q8_0": 32, "q4_0": 32, "q4_k_m": 256}  # values per quantization block along a row
_LAYER_PARTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up")


# ---- the spec ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaSpec:
    """The sizes of a built-in Llama; `ffn` 0 is Llama's rule (8/3 x hidden, rounded up to 256), `kv_heads` 0
    is `heads` (no grouped-query attention)."""

    layers: int = 2
    hidden: int = 256
    ffn: int = 0
    heads: int = 4
    kv_heads: int = 0
    vocab: int = 512
    dtype: str = "f16"
    ctx: int = 2048

    @property
    def ffn_size(self) -> int:
        return self.ffn or -(-8 * self.hidden // (3 * 256)) * 256

    @property
    def kv_head_count(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def name(self) -> str:
        """The model's identity in the store: readable, one per configuration."""
        ctx = f"-c{self.ctx}" if self.ctx != LlamaSpec.ctx else ""
        sizes = f"l{self.layers}-h{self.hidden}-f{self.ffn_size}-a{self.heads}-kv{self.kv_head_count}"
        return f"llama-{sizes}-v{self.vocab}{ctx}-{self.dtype}"

    def check(self) -> None:
        """Refuse a spec llama.cpp could not load or that would not be what its name says: one line."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "dtype" and (value < 0 or (value == 0 and f.name not in ("ffn", "kv_heads"))):
                raise ModelError(f"builtin:llama: {f.name} must be positive, got {value}")
        if self.dtype not in DTYPES:
            raise ModelError(f"builtin:llama: dtype '{self.dtype}' is not one of {', '.join(DTYPES)}")
        if self.hidden % self.heads or self.head_dim % 2:
            raise ModelError(
                f"builtin:llama: heads {self.heads} must divide hidden {self.hidden} into an even head size "
                "(RoPE turns pairs)"
            )
        if self.heads % self.kv_head_count:
            raise ModelError(
                f"builtin:llama: kv_heads {self.kv_head_count} does not divide heads {self.heads}"
            )
        if self.vocab < MIN_VOCAB:
            raise ModelError(
                f"builtin:llama: vocab {self.vocab} is under {MIN_VOCAB} (3 special tokens, 256 byte "
                "fallbacks and one piece)"
            )
        block = _BLOCK[self.dtype]
        for field_name, value in (("hidden", self.hidden), ("ffn", self.ffn_size)):
            if value % block:
                raise ModelError(
                    f"builtin:llama: {self.dtype} packs blocks of {block} along a row: {field_name} {value} "
                    f"is not a multiple of {block}"
                )


def parse_llama_spec(text: str) -> LlamaSpec:
    """`llama:layers=2,hidden=256,...` (with or without `builtin:`) -> its checked spec; a key left out takes
    its default, a bad key or value is a one-line ModelError naming it."""
    key = text.removeprefix("builtin:")
    head, _, spec = key.partition(":")
    if head != LLAMA_PREFIX:
        raise ModelError(f"{text}: not a builtin:llama spec")
    known = [f.name for f in fields(LlamaSpec)]
    values: dict[str, Any] = {}
    for item in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ModelError(f"builtin:llama: '{item}' is not KEY=VALUE with KEY one of {', '.join(known)}")
        if name in values:
            raise ModelError(f"builtin:llama: {name} given twice")
        if name == "dtype":
            values[name] = raw.strip().lower()
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            raise ModelError(f"builtin:llama: {name}={raw!r} is not a whole number") from None
    config = replace(LlamaSpec(), **values)
    config.check()
    return config


# ---- the writer -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaTensor:
    """One tensor to write: name, numpy shape (rows, row length) and whether it stays F32 (norms)."""

    name: str
    shape: tuple[int, ...]
    norm: bool = False


def llama_tensors(spec: LlamaSpec) -> Iterator[LlamaTensor]:
    """Every tensor of the llama graph, in graph order; shapes in numpy order (GGUF stores dims reversed:
    token_embd is {hidden, vocab} there, llama.cpp's own notation)."""
    h, f, q, kv = spec.hidden, spec.ffn_size, spec.heads * spec.head_dim, spec.kv_head_count * spec.head_dim
    yield LlamaTensor("token_embd.weight", (spec.vocab, h))
    for i in range(spec.layers):
        shapes = {
            "attn_norm": (h,),
            "attn_q": (q, h),
            "attn_k": (kv, h),
            "attn_v": (kv, h),
            "attn_output": (h, q),
            "ffn_norm": (h,),
            "ffn_gate": (f, h),
            "ffn_up": (f, h),
        }
        for part in _LAYER_PARTS:
            yield LlamaTensor(f"blk.{i}.{part}.weight", shapes[part], norm=part.endswith("_norm"))
        yield LlamaTensor(f"blk.{i}.ffn_down.weight", (h, f))
    yield LlamaTensor("output_norm.weight", (h,), norm=True)
    yield LlamaTensor("output.weight", (spec.vocab, h))


def _values(spec: LlamaSpec, index: int, tensor: LlamaTensor) -> np.ndarray:
    """The fp32 values of one tensor: ones for norms, N(0, 0.02) from the tensor's own seeded generator."""
    if tensor.norm:
        return np.ones(tensor.shape, dtype=np.float32)
    rng = np.random.default_rng([SEED, index])
    return rng.standard_normal(tensor.shape, dtype=np.float32) * np.float32(WEIGHT_STD)


def _stored_type(spec: LlamaSpec, tensor: LlamaTensor) -> gguf.GGMLQuantizationType:
    import gguf

    if tensor.norm:
        return gguf.GGMLQuantizationType.F32
    return {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}.get(
        spec.dtype, gguf.GGMLQuantizationType.F16
    )


def spm_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a SentencePiece table of `size` entries: the specials, the 256 byte
    fallbacks, then every piece over PIECE_ALPHABET of length 1, then 2, ..., so each longer piece is a
    merge of shorter ones present; scored -rank as SPM scores them (earlier merges win)."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(N_BYTES))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * N_BYTES
    scores = [0.0] * len(tokens)
    layer = [""]
    while len(tokens) < size:
        layer = [p + c for p in layer for c in PIECE_ALPHABET]
        for piece in layer[: size - len(tokens)]:
            scores.append(-float(len(tokens) - N_SPECIAL - N_BYTES))
            tokens.append(piece)
            types.append(gguf.TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def _file_type(spec: LlamaSpec) -> int:
    import gguf

    names = {"f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0", "q4_k_m": "MOSTLY_Q4_K_M"}
    return int(gguf.LlamaFileType[names[spec.dtype]])


def _add_metadata(writer: gguf.GGUFWriter, spec: LlamaSpec, name: str) -> None:
    """The general.*, llama.* and tokenizer.ggml.* keys llama.cpp's llama loader reads."""
    import gguf

    writer.add_name(name)
    writer.add_file_type(_file_type(spec))
    if spec.dtype != "f16":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(spec.vocab)
    writer.add_context_length(spec.ctx)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.ffn_size)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_head_count)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(ROPE_BASE)
    tokens, scores, types = spm_vocab(spec.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def _write_direct(spec: LlamaSpec, path: Path, name: str) -> None:
    """Write an f16 / q8_0 / q4_0 file, one tensor in memory at a time: the tensor table first (each
    tensor's type and byte size are known from its shape), then each tensor generated, stored and dropped,
    so a GB-sized model needs no GB of memory."""
    import gguf

    writer = gguf.GGUFWriter(path, LLAMA_PREFIX)
    try:
        _add_metadata(writer, spec, name)
        plan = list(llama_tensors(spec))
        for tensor in plan:
            qtype = _stored_type(spec, tensor)
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            nbytes = int(np.prod(tensor.shape)) // block * size
            writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, tensor in enumerate(plan):
            writer.write_tensor_data(
                gguf.quants.quantize(_values(spec, index, tensor), _stored_type(spec, tensor))
            )
    finally:
        writer.close()


def _quantize_k(spec: LlamaSpec, path: Path, quantize_tool: Path | None) -> None:
    """q4_k_m: the f16 file (a temporary beside `path`) quantized by llama.cpp's own llama-quantize."""
    if quantize_tool is None or not Path(quantize_tool).is_file():
        where = quantize_tool or f"{QUANTIZE_TOOL} on PATH"
        raise ModelError(f"builtin:llama: dtype q4_k_m needs llama.cpp's {QUANTIZE_TOOL}: {where} not found")
    source = path.with_name(f".{path.name}.f16")
    try:
        _write_direct(replace(spec, dtype="f16"), source, spec.name)  # llama-quantize keeps the name
        argv = [str(quantize_tool), str(source), str(path), "Q4_K_M"]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=QUANTIZE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModelError(f"builtin:llama: {quantize_tool} did not run: {exc}") from None
        if res.returncode != 0:
            lines = [ln.strip() for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
            said = next((ln for ln in reversed(lines) if "error" in ln.lower() or "fail" in ln.lower()), None)
            tail = said or (lines[-1] if lines else "no output")
            raise ModelError(
                f"builtin:llama: {quantize_tool} exited {res.returncode} on {source.name}: {tail}"
            )
    finally:
        source.unlink(missing_ok=True)


def write_llama_gguf(spec: LlamaSpec, path: Path, quantize_tool: Path | None = None) -> Path:
    """Write the Llama GGUF `spec` describes to `path` (f16 / q8_0 / q4_0 by the `gguf` package; q4_k_m
    through `quantize_tool`, llama.cpp's llama-quantize) and return the path."""
    spec.check()
    path = Path(path)
    if spec.dtype == "q4_k_m":
        _quantize_k(spec, path, quantize_tool)
    else:
        _write_direct(spec, path, spec.name)
    return path


def llama_model(
    key: str, cache_dir: Path | None = None, quantize_tool: Path | None = None
) -> tuple[str, Path]:
    """(identity, path) of the built-in Llama `key` ("llama:layers=..."), written once into the cache.
    q4_k_m needs llama-quantize: `quantize_tool`, else the one on PATH."""
    spec = parse_llama_spec(key)
    tool = quantize_tool
    if spec.dtype == "q4_k_m" and tool is None:
        found = shutil.which(QUANTIZE_TOOL)
        tool = Path(found) if found else None
    write = partial(_write_to, spec, quantize_tool=tool)
    return spec.name, written_once(cache_dir, f"{spec.name}.r{GGUF_REVISION}.gguf", write)


def _write_to(spec: LlamaSpec, path: Path, quantize_tool: Path | None) -> None:
    write_llama_gguf(spec, path, quantize_tool)


# ---- the reader -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GgufTensor:
    """One tensor as the file stores it: ggml type name (F16, Q8_0, Q4_K...), dims in GGUF order (row length
    first), element count and stored bytes."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file holds, read from its own metadata and tensor table."""

    path: Path
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    context_length: int
    vocab: int
    file_type: str  # llama.cpp's name (MOSTLY_Q8_0...), or "unset" when the file says none
    tensors: tuple[GgufTensor, ...]

    @property
    def parameter_count(self) -> int:
        """Every tensor's elements: what llama.cpp calls model_n_params."""
        return sum(t.n_elements for t in self.tensors)

    @property
    def tensor_bytes(self) -> int:
        """Every tensor's stored bytes (alignment padding excluded): what llama-bench calls model_size."""
        return sum(t.n_bytes for t in self.tensors)

    def tensor(self, name: str) -> GgufTensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    def weight_bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: every tensor but the token embedding, plus the one row of it
        the token looks up. A model with no `output.weight` ties its LM head to the embedding, which is then
        read whole."""
        embd = self.tensor("token_embd.weight")
        if embd is None or self.tensor("output.weight") is None:
            return self.tensor_bytes
        rows = embd.shape[-1]  # GGUF order: {hidden, rows}
        return self.tensor_bytes - embd.n_bytes + embd.n_bytes // rows

    def kv_cache_bytes(self, depth: int, cache_type_bytes: float = 2) -> int:
        """Bytes of K and V cached for `depth` positions: 2 x layers x kv_heads x head_dim x depth x bytes
        (2 for llama.cpp's default f16 cache)."""
        return int(2 * self.layers * self.kv_heads * self.head_dim * depth * cache_type_bytes)

    def bytes_per_token(self, depth: int, cache_type_bytes: float = 2) -> int:
        """Bytes one decode step at `depth` reads: the weights' share plus the whole KV cache so far."""
        return self.weight_bytes_per_token() + self.kv_cache_bytes(depth, cache_type_bytes)


_READ_ERRORS = (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError)


def _open_reader(path: Path) -> gguf.GGUFReader:
    """The gguf package's reader on `path`, or a one-line ModelError: empty, not GGUF, truncated."""
    import gguf

    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read model: {exc.strerror}") from None
    if size == 0:
        raise ModelError(f"{path}: model file is empty")
    if magic != b"GGUF":
        raise ModelError(f"{path}: not a GGUF file (no GGUF magic)")
    try:
        reader = gguf.GGUFReader(path)
    except _READ_ERRORS as exc:
        raise ModelError(f"{path}: not a readable GGUF file (truncated or corrupt: {exc})") from None
    ends = [t.data_offset + t.n_bytes for t in reader.tensors]
    if ends and max(ends) > size:
        raise ModelError(
            f"{path}: truncated GGUF file: its tensors end at byte {max(ends)}, the file at {size}"
        )
    return reader


def _whole(reader: gguf.GGUFReader, path: Path, key: str, default: int | None = None) -> int:
    """A whole-number metadata value (an array's first entry: per-layer values such as head counts); a
    missing one is `default`, or, with none, a ModelError naming the key, as is one of another type."""
    field = reader.get_field(key)
    if field is None or not field.types:
        if default is None:
            raise ModelError(f"{path}: GGUF metadata has no {key}")
        return default
    value = field.contents(0) if len(field.types) > 1 else field.contents()
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{path}: GGUF metadata {key} is {value!r}, not a whole number")
    return value


def _text(reader: gguf.GGUFReader, path: Path, key: str) -> str:
    """A string metadata value, or a ModelError naming the key."""
    field = reader.get_field(key)
    value = field.contents() if field is not None and field.types else None
    if not isinstance(value, str):
        raise ModelError(f"{path}: GGUF metadata has no {key}")
    return value


def read_gguf(path: Path) -> GgufInfo:
    """What the GGUF file at `path` holds (sizes from its metadata, every tensor's type and stored bytes from
    its tensor table); a file that is empty, not GGUF, truncated or missing a key the decode floor needs is a
    one-line ModelError naming the file (and the key)."""
    import gguf

    path = Path(path)
    reader = _open_reader(path)
    arch = _text(reader, path, "general.architecture")
    layers = _whole(reader, path, f"{arch}.block_count")
    hidden = _whole(reader, path, f"{arch}.embedding_length")
    heads = _whole(reader, path, f"{arch}.attention.head_count")
    if heads <= 0 or layers <= 0 or hidden <= 0:
        raise ModelError(f"{path}: GGUF metadata gives layers {layers}, hidden {hidden}, heads {heads}")
    kv_heads = _whole(reader, path, f"{arch}.attention.head_count_kv", heads)  # llama.cpp's default
    head_dim = _whole(reader, path, f"{arch}.attention.key_length", hidden // heads)
    ctx = _whole(reader, path, f"{arch}.context_length")
    tensors = tuple(
        GgufTensor(
            t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_elements), int(t.n_bytes)
        )
        for t in reader.tensors
    )
    vocab = _vocab(reader, path, arch, tensors)
    file_type = "unset"
    if reader.get_field("general.file_type") is not None:
        value = _whole(reader, path, "general.file_type")
        file_type = {int(v): v.name for v in gguf.LlamaFileType}.get(value, f"unknown({value})")
    del reader  # drop the memory map now, not at some later collection
    return GgufInfo(path, arch, layers, hidden, heads, kv_heads, head_dim, ctx, vocab, file_type, tensors)


def _vocab(reader: gguf.GGUFReader, path: Path, arch: str, tensors: tuple[GgufTensor, ...]) -> int:
    """The vocabulary size: `{arch}.vocab_size`, else the tokenizer's token count, else token_embd's rows."""
    if reader.get_field(f"{arch}.vocab_size") is not None:
        return _whole(reader, path, f"{arch}.vocab_size")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    if tokens is not None:
        return len(tokens.data)
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embd is None or len(embd.shape) < 2:
        raise ModelError(f"{path}: GGUF has no {arch}.vocab_size, no tokenizer.ggml.tokens and no token_embd")
    return embd.shape[1]


__all__ = [
    "DTYPES",
    "GgufInfo",
    "GgufTensor",
    "LlamaSpec",
    "LlamaTensor",
    "llama_model",
    "llama_tensors",
    "parse_llama_spec",
    "read_gguf",
    "spm_vocab",
    "write_llama_gguf",
]


def check_architecture(info: GgufInfo, path: Path) -> None:
    """Refuse a GGUF whose architecture llama.cpp does not know (as the `gguf` package of its source lists
    them), in one line naming the file, before anything is pushed; a device whose llama.cpp is older than
    the list still says so when it loads it."""
    import gguf

    known = set(gguf.MODEL_ARCH_NAMES.values())
    if info.architecture not in known:
        raise ModelError(
            f"{path}: architecture '{info.architecture}' is not one llama.cpp knows ({len(known)} known to "
            "gguf, e.g. llama, qwen2, gemma3, phi3)"
        )
