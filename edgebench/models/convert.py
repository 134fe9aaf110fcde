"""ONNX -> MNN conversion through MNN's native converter (`_tools.mnnconvert`), in a child process.

Never `MNN.tools` or the `mnn*` console scripts: they run `pip install` and send telemetry.
The converter prints from C and can abort on bad input, so it runs in its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from ..errors import ModelError, seconds
from ..files import seal
from ..lab.hashing import sha256_file
from .refs import models_cache_dir

_CONVERT = (
    "import sys, _tools\nok = _tools.mnnconvert(sys.argv[1:])\nsys.exit(0 if ok in (True, 0, None) else 1)\n"
)
_QUANT = (
    "import sys, _tools\nok = _tools.mnnquant(sys.argv[1:])\nsys.exit(0 if ok in (True, 0, None) else 1)\n"
)


def run_mnn_tool(args: Sequence[str], *, quant: bool = False, timeout: float = 900.0) -> str:
    """Run mnnconvert (or mnnquant) with argv; return its output, or raise ModelError with its last line."""
    code = _QUANT if quant else _CONVERT
    tool = "mnnquant" if quant else "mnnconvert"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, tool, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ModelError(f"{tool} timed out after {seconds(timeout)} s") from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 or "Converted Failed" in output:
        lines = [ln for ln in output.splitlines() if ln.strip()]
        if proc.returncode < 0:  # killed by a signal: the native tool crashed on this model
            last = f" after: {lines[-1].strip()}" if lines else ""
            raise ModelError(f"{tool} crashed (signal {-proc.returncode}){last}")
        raise ModelError(f"{tool} failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return output


def onnx_to_mnn(onnx_path: Path, out: Path | None = None, extra: Sequence[str] = ()) -> Path:
    """Convert once per (content, flags); the result is cached beside the built-in models."""
    cached = out is None
    if out is None:
        tag = sha256_file(onnx_path)[:16] + ("-" + "-".join(a.strip("-") for a in extra) if extra else "")
        out = models_cache_dir() / "mnn" / f"{onnx_path.stem}-{tag}.mnn"
        if out.exists():
            return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}")  # devices convert in parallel
    run_mnn_tool(
        [
            "-f",
            "ONNX",
            "--modelFile",
            str(onnx_path),
            "--MNNModel",
            str(tmp),
            "--bizCode",
            "edgebench",
            *extra,
        ]
    )
    if not tmp.exists() or tmp.stat().st_size == 0:
        raise ModelError(f"{onnx_path}: mnnconvert produced no model")
    if cached:
        seal(tmp)  # the cache's file is never rewritten (edgebench.files); one the caller named is theirs
    os.replace(tmp, out)
    return out
