"""Model references: a path (`models/enc.onnx`, `net.mnn`), `builtin:NAME`,
`builtin:decoder:layers=L,...` (models.decoders), `builtin:llama:layers=L,...` (a GGUF, models.gguf_models)
or `builtin:kernel:OP,...` (models.kernel_samples),
checked before anything is pushed to a device. Light on purpose: every layer holds ModelRefs, few need
onnx."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelError
from ..jobs import ModelRef, ncnn_weights_of
from .cache import models_cache_dir  # noqa: F401 - re-exported: callers find it beside the refs

BUILTIN_PREFIX = "builtin:"


def resolve_model(ref: str, base_dir: Path | None = None, name: str | None = None) -> ModelRef:
    """Turn a model reference into a checked ModelRef; a bad one is a one-line ModelError."""
    if ref.startswith(BUILTIN_PREFIX):
        key = ref[len(BUILTIN_PREFIX) :]
        from .tflite_builtin import is_tflite_builtin, tflite_builtin_model

        if is_tflite_builtin(key):
            builtin_name, tflite_path = tflite_builtin_model(key)
            return ModelRef(name or builtin_name, tflite_path)
        if key == "decoder" or key.startswith("decoder:"):
            from .decoders import decoder_model

            decoder_name, decoder_path = decoder_model(key)
            return ModelRef(name or decoder_name, decoder_path)
        if key == "llama" or key.startswith("llama:"):
            from .gguf_models import llama_model

            llama_name, gguf_path = llama_model(key)
            return ModelRef(name or llama_name, gguf_path)
        if key.startswith("kernel:"):
            from .kernel_samples import sample_model

            sample_name, sample_path = sample_model(key)
            return ModelRef(name or sample_name, sample_path)
        from .builtin import builtin_model

        return ModelRef(name or key, builtin_model(key))
    path = Path(os.path.expanduser(ref))
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if not path.exists():
        raise ModelError(f"{ref}: model file not found")
    if not path.is_file():
        raise ModelError(f"{ref}: not a file")
    check_model_file(path)
    return ModelRef(name or path.stem, path)


def check_model_file(path: Path) -> None:
    """Refuse empty, unreadable or corrupt models before anything is pushed to a device."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read model: {exc.strerror}") from None
    if size == 0 or not head:
        raise ModelError(f"{path}: model file is empty")
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        import onnx

        try:
            onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # noqa: BLE001 - protobuf raises many types for a corrupt file
            raise ModelError(f"{path}: not a valid ONNX model ({type(exc).__name__})") from None
    elif suffix == ".tflite":
        # A TFLite flatbuffer carries the file identifier "TFL3" at bytes 4-8.
        if len(head) < 8 or head[4:8] != b"TFL3":
            raise ModelError(f"{path}: not a TFLite model (no TFL3 flatbuffer identifier)")
    elif suffix == ".param":
        if head.split(b"\n")[0].strip() != b"7767517":
            raise ModelError(f"{path}: not an ncnn param file (its first line is not the magic 7767517)")
        weights = ncnn_weights_of(path)
        if not weights.is_file():
            raise ModelError(f"{path}: the ncnn weights file {weights.name} is missing beside it")
    elif suffix == ".gguf":
        from .gguf_models import read_gguf

        read_gguf(path)  # not GGUF, truncated, or without the sizes llama.cpp needs: one line naming the file
    elif suffix != ".mnn":
        raise ModelError(
            f"{path}: unknown model format '{suffix}' "
            "(expected .onnx, .mnn, .tflite, .gguf or an ncnn .param)"
        )
