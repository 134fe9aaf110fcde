"""The per-op profiles the kernel predictor's integration tests share: the built-ins, PP-OCR's det/rec/cls
from the rapidocr wheel at two input sizes each and silero-vad from its wheel (its If-free export, one
frame as it streams), with the kernel samples of `suites/calibrate.toml`, profiled by one `edgebench run`
of `profile` jobs on `local` (one thread) per runtime and test session, with the memory hierarchy swept
at that thread count (the tests only read the store)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from edgebench.models.builtin import BUILTINS, builtin_model
from edgebench.models.kernel_samples import CALIBRATION, parse_sample, sample_model
from edgebench.testing.cli import edgebench

# The reference p50 is the profile job's plain runs: at 5 of them it read up to 1.9x the p50 of 30 on this
# host (convnet 6.8 against 3.7 ms, the DRAM-sized mlp 3.6 against 1.3: still warming caches); 20 settle it.
RUNS, WARMUP = 20, 2
SWEEP = "sweep = true, threads = 1, sweep_max_mb = 128, trials = 7, max_seconds = 20"
BUILTIN_SHAPES = {"mlp": {"x": [1, 1024]}}  # its batch is dynamic
OCR = {
    "ch_PP-OCRv4_det_infer": ([1, 3, 320, 320], [1, 3, 640, 640]),
    "ch_PP-OCRv4_rec_infer": ([1, 3, 48, 160], [1, 3, 48, 320]),
    "ch_ppocr_mobile_v2.0_cls_infer": ([1, 3, 48, 96], [1, 3, 48, 192]),
}

# silero_vad.onnx wraps its 16 and 8 kHz networks in an If, which MNN runs without per-op callbacks; the
# wheel's sequence export is the 16 kHz network alone (Conv front end, LSTM, head) with float inputs only
SILERO = {"silero_vad_16k_sequence": {"input": [1, 576]}}  # one 32 ms frame and its 4 ms of context

# Kernel samples a runtime cannot run, by op: pnnx writes an ONNX LSTM whose initial states are graph
# inputs as an LSTM layer ncnn refuses to load (its weights as blobs); the refusal is tested in
# tests/unit/test_ncnn_session.py
CANNOT_RUN = {"ncnn": ("lstm",)}


def calibration_samples(runtime: str) -> list[str]:
    """The kernel samples of `suites/calibrate.toml` the runtime runs."""
    return [k for k in CALIBRATION if parse_sample(k).op not in CANNOT_RUN.get(runtime, ())]


def wheel_models(package: str, folder: str, names: Iterable[str]) -> dict[str, Path]:
    """name -> the ONNX file a wheel ships in `folder` (skipped where the wheel is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (scripts/install-test-deps.sh installs it)")
    root = Path(list(spec.submodule_search_locations)[0], folder)
    return {name: root / f"{name}.onnx" for name in names}


def ocr_models() -> dict[str, Path]:
    return wheel_models("rapidocr_onnxruntime", "models", OCR)


def _probe(models: list[str], runtime: str, shapes: dict | None = None) -> str:
    names = ", ".join(json.dumps(m) for m in models)
    params = f'threads = 1, runs = {RUNS}, warmup = {WARMUP}, runtime = "{runtime}"'
    if shapes:
        params += ", shapes = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in shapes.items()) + " }"
    return f'[[probe]]\nkind = "profile"\nmodels = [{names}]\nparams = {{ {params} }}\n'


def loo_suite(runtime: str, folder: Path) -> tuple[Path, dict[str, Path]]:
    """A suite profiling every model of the cross-validation once on `local`."""
    sources: dict[str, Path] = {name: builtin_model(name) for name in BUILTINS}
    sources.update(ocr_models())
    sources.update(wheel_models("silero_vad", "data", SILERO))
    sources.update(sample_model(key) for key in calibration_samples(runtime))
    probes = [_probe([n for n in BUILTINS if n not in BUILTIN_SHAPES], runtime)]
    probes += [_probe([n], runtime, s) for n, s in BUILTIN_SHAPES.items()]
    probes += [_probe([n], runtime, {"x": dims}) for n in OCR for dims in OCR[n]]
    probes += [_probe([n], runtime, shapes) for n, shapes in SILERO.items()]
    # the kernel samples calibrate every kernel kind over sizes no model covers alone (never held out)
    probes.append(_probe([parse_sample(k).name for k in calibration_samples(runtime)], runtime))
    # the memory hierarchy at the profiles' thread count: each kernel's bytes are charged at its level
    probes.append(f'[[probe]]\nkind = "bandwidth"\nparams = {{ {SWEEP} }}\n')
    models = [f"builtin:{n}" for n in BUILTINS] + [str(p) for n, p in sources.items() if n not in BUILTINS]
    models += [f"builtin:{k}" for k in calibration_samples(runtime)]
    text = f'name = "loo-{runtime}"\ndevices = ["local"]\nmodels = {json.dumps(models)}\n\n'
    path = folder / f"loo-{runtime}.toml"
    path.write_text(text + "\n".join(probes))
    return path, sources


def profile_store(runtime: str, folder: Path) -> tuple[Path, dict[str, Path]]:
    """Profile every model of `loo_suite` into a store in `folder`: (the store, model name -> file)."""
    suite, sources = loo_suite(runtime, folder)
    store = folder / "profiles.db"
    res = edgebench("run", suite, "--store", store, cwd=folder)
    assert res.returncode == 0, res.stderr[-3000:]
    return store, sources
