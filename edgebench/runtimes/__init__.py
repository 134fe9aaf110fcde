"""The runtimes, loaded by name: `runtime("mnn")` is the `RUNTIME` of `edgebench.runtimes.mnn`. Adding
a runtime is one module here and one line in `MODULES`; the rest of the harness asks it, not its name."""

from __future__ import annotations

import importlib

from .base import IsaFact, KernelRules, Runtime

__all__ = [
    "MODULES",
    "IsaFact",
    "KernelRules",
    "Runtime",
    "kernel_rules",
    "format_text",
    "names",
    "owner_of",
    "runtime",
    "runtimes_for",
]

# runtime name -> its module in this package
MODULES = {
    "onnxruntime": "onnxruntime",
    "mnn": "mnn",
    "litert": "litert",
    "ncnn": "ncnn",
    "llama.cpp": "llamacpp",
}

# What a graph is as no runtime runs it: the common fusions only, nothing folded.
NO_RUNTIME = KernelRules(folds_static_shapes=False)


# A format's files as a sentence names them, where that is not its name as a suffix.
_FORMAT_FILES = {"ncnn": ".param/.bin"}


def format_text(fmt: str) -> str:
    """How a sentence names a format's files: ".onnx", ".param/.bin" (an ncnn graph and its weights)."""
    return _FORMAT_FILES.get(fmt, f".{fmt}")


def names() -> tuple[str, ...]:
    return tuple(MODULES)


def target_label(runtime: str | None, backend: str | None) -> str | None:
    """How analysis names a runtime on one of its backends, a target of its own ("ncnn@vulkan": another
    unit, other speeds); the runtime's name alone on its CPU backend."""
    return runtime if runtime is None or backend in (None, "cpu") else f"{runtime}@{backend}"


def runtime(name: str) -> Runtime:
    """The runtime called `name` (or named first in a target label, "ncnn@vulkan"); a ValueError naming the
    known ones otherwise."""
    name = name.split("@", 1)[0]
    if name not in MODULES:
        raise ValueError(f"unknown runtime '{name}' (known: {', '.join(MODULES)})")
    found: Runtime = importlib.import_module(f"{__package__}.{MODULES[name]}").RUNTIME
    return found


def owner_of(fmt: str) -> Runtime | None:
    """The runtime whose own format `fmt` is (None: no runtime's)."""
    return next((rt for rt in map(runtime, MODULES) if rt.formats[0] == fmt), None)


def runtimes_for(fmt: str) -> list[str]:
    """The runtimes that run a model in format `fmt` (as it is or converted on the host)."""
    return [name for name in MODULES if fmt in runtime(name).formats]


def kernel_rules(name: str) -> KernelRules:
    """The kernel rules of a runtime; "" (no runtime) and unknown names get the common fusions only."""
    if name == "":
        return NO_RUNTIME
    return runtime(name).kernels if name in MODULES else KernelRules()
