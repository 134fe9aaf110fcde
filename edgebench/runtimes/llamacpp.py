"""llama.cpp as the host knows it: GGUF models (LLMs as they ship), decoded on the device by its own
`llama-bench` (pushed over adb/ssh, run with `-o json`), the floor per token read from the GGUF's tensor
table on the host. It runs `probe decode` only: llama-bench measures prefill and generation, nothing else."""

from __future__ import annotations

from .base import KernelRules, Runtime

RUNTIME = Runtime(
    name="llama.cpp",
    display="llama.cpp",
    python_module="llama_cpp",  # llama-cpp-python, optional: the decode itself runs llama-bench
    formats=("gguf",),
    model_noun="a GGUF model",
    native_tool=None,  # not a bench runner: its tool is `decode_tool`
    kernels=KernelRules(),
    probes=("decode",),
    decode_tool="llama_bench",
    decodes=True,
)
