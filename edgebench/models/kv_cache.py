"""llama.cpp's KV cache types and their sizes: what `--kv-type` takes and what a cached value costs.

Apart from the GGUF reader so that the command line, which offers the types as choices, imports nothing
heavy to build itself."""

from __future__ import annotations

# Bytes per cached value of llama.cpp's KV cache types (`-ctk`/`-ctv`; a q8_0 block holds 32 values in 34
# bytes). llama.cpp's default is f16.
KV_CACHE_TYPES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
DEFAULT_KV_CACHE_TYPE = "f16"
