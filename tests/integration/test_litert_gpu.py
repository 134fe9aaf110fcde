"""LiteRT's GPU backend (ai-edge-litert's WebGPU accelerator over Vulkan) on a real driver, Mesa 25's lavapipe
fetched from bookworm-backports into a cache by the test (edgebench.testing.mesa), end to end through the
CLI on `local` lab devices whose descriptors carry that Mesa's environment:

- a model with an op the GPU lacks (LOG_SOFTMAX) recorded gpu+cpu with the ops named and counted, the
  count checked against the model the test built and which ops the GPU took checked numerically against
  a bare CompiledModel; strict mode refusing it in one line, losing nothing stored; a model the GPU takes
  whole passing strict mode;
- Debian's own Mesa 22.3 and a machine with no Vulkan driver: a one-line backend error, never "gpu";
- fp16 numerics (LiteRT's default on the GPU) against the CPU's fp32, `enforce_f32` (precision fp32)
  clearing them, the figures held to a bare CompiledModel and numpy computed here.

Run as a script, this file is that bare CompiledModel (`bare_outputs`): a process of its own with the
driver's environment, as the agent has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgebench.testing.cli import edgebench
from edgebench.testing.mesa import Mesa, MesaUnavailable, fetch_mesa, system_lavapipe_env

pytestmark = pytest.mark.integration
pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install -e .)")

BENCH = ["--runs", "10", "--min-seconds", "0", "--warmup", "1", "--timeout", "300", "--threads", "1"]
WIDTH = 64
PARTIAL = ["FULLY_CONNECTED", "FULLY_CONNECTED", "LOG_SOFTMAX", "FULLY_CONNECTED"]
WHOLE = ["FULLY_CONNECTED", "SIN", "FULLY_CONNECTED", "FULLY_CONNECTED"]
NUMERIC = ["FULLY_CONNECTED"] * 3


def build(kinds: list[str], path: Path, seed: int = 1) -> list[np.ndarray]:
    """A .tflite of `kinds` in a chain on [1, WIDTH] (FULLY_CONNECTED with seeded weights, zero bias, no
    activation; other ops with no options), written with the wheel's flatbuffer schema; returns each FC's
    weights ([in, out]) for numpy."""
    from edgebench.models.tflite_builtin import _Graph, _schema

    s, rng, weights = _schema(), np.random.default_rng(seed), []
    g = _Graph(s)
    prev = x = g.tensor("x", [1, WIDTH])
    for i, kind in enumerate(kinds):
        out = g.tensor(f"t{i}", [1, WIDTH])
        if kind == "FULLY_CONNECTED":
            w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
            weights.append(w)
            wt = g.tensor(f"w{i}", [WIDTH, WIDTH], w.T)  # FULLY_CONNECTED keeps [out, in]
            bt = g.tensor(f"b{i}", [WIDTH], np.zeros(WIDTH, np.float32))
            fc = s.BuiltinOperator.FULLY_CONNECTED
            g.op(
                fc, [prev, wt, bt], [out], s.BuiltinOptions.FullyConnectedOptions, s.FullyConnectedOptionsT()
            )
        else:
            g.op(getattr(s.BuiltinOperator, kind), [prev], [out], 0, None)
        prev = out
    path.write_bytes(g.finish("chain", [x], [prev]))
    return weights


def numpy_chain(kinds: list[str], weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The chain in float64: the exact reference."""
    y, ws = x.astype(np.float64), iter(weights)
    for kind in kinds:
        if kind == "FULLY_CONNECTED":
            y = y @ next(ws).astype(np.float64)
        elif kind == "LOG_SOFTMAX":
            y = y - y.max() - np.log(np.exp(y - y.max()).sum())
        elif kind == "SIN":
            y = np.sin(y)
    return y


def bare_outputs(model: str, x: np.ndarray, gpu: bool, enforce_f32: bool) -> np.ndarray:
    """The model's one output from LiteRT's CompiledModel driven directly (nothing of edgebench): on
    GPU|CPU or the CPU alone, run once and read back."""
    from ai_edge_litert.compiled_model import CompiledModel, GpuOptions, HardwareAccelerator, Options

    units = HardwareAccelerator.GPU | HardwareAccelerator.CPU if gpu else HardwareAccelerator.CPU
    options = Options(hardware_accelerators=units, gpu_options=GpuOptions(enforce_f32=enforce_f32))
    compiled = CompiledModel.from_file(model, options=options)
    ins, outs = compiled.create_input_buffers(0), compiled.create_output_buffers(0)
    ins[0].write(np.ascontiguousarray(x, np.float32))
    compiled.run_by_index(0, ins, outs)
    return np.asarray(outs[0].read(x.size, np.float32)).reshape(x.shape)


def bare(model: Path, x: np.ndarray, env: dict[str, str], gpu: bool = True, f32: bool = False) -> np.ndarray:
    """`bare_outputs` in a fresh process with `env` (the driver's), in a session of its own."""
    folder = model.parent
    np.save(folder / "bare_in.npy", x)
    argv = [sys.executable, __file__, str(model), str(folder / "bare_in.npy"), str(folder / "bare_out.npy")]
    argv += ["gpu" if gpu else "cpu", "f32" if f32 else "default"]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert res.returncode == 0, res.stderr[-2000:]
    return np.load(folder / "bare_out.npy")


@pytest.fixture(scope="module")
def mesa() -> Mesa:
    """Mesa 25's lavapipe, fetched into the cache the first time (a few seconds from the Debian mirror)."""
    try:
        return fetch_mesa()
    except MesaUnavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Mesa 25 cannot be fetched here: {exc}")


@pytest.fixture(scope="module")
def lab(mesa: Mesa, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Local devices: `mesa25` (its driver's environment), `mesa22` (Debian's own lavapipe, where the host
    has it) and `nogpu` (a Vulkan loader pointed at no driver)."""
    root = tmp_path_factory.mktemp("lab")
    folder = root / "devices"
    folder.mkdir()
    system = system_lavapipe_env({})
    envs = {"mesa25": mesa.env({}), "nogpu": {"VK_ICD_FILENAMES": str(root / "none.json")}}
    if system is not None:
        envs["mesa22"] = system
    for name, env in envs.items():
        table = ", ".join(f"{key} = {json.dumps(value)}" for key, value in sorted(env.items()))
        (folder / f"{name}.toml").write_text(
            f'name = "{name}"\ntransport = "local"\nworkdir = "{root / name}"\nenv = {{{table}}}\n'
        )
    return folder


def run_json(*argv: object, cwd: Path, code: int = 0) -> dict:
    res = edgebench(*argv, "--json", cwd=cwd)
    assert res.returncode == code, res.stderr[-3000:]
    return json.loads(res.stdout)


def p50_of(doc: dict) -> dict:
    return next(r for r in doc["records"] if r["metric"] == "latency_ms" and r["params"].get("stat") == "p50")


def error_lines(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in res.stderr.splitlines() if "error:" in line]


def test_partial_model_names_the_op_the_gpu_lacks_and_strict_mode_refuses_it(
    mesa: Mesa, lab: Path, tmp_path: Path
) -> None:
    weights = build(PARTIAL, tmp_path / "partial.tflite")
    store = ["--store", str(tmp_path / "s.db")]
    on = ["--runtime", "litert", "--device", "mesa25", "--lab", lab]
    kept = run_json("bench", "builtin:mlp.tflite", "--runtime", "litert", *BENCH, *store, cwd=tmp_path)[
        "records"
    ]

    res = edgebench(
        "bench", tmp_path / "partial.tflite", *on, "--backend", "gpu", *BENCH, *store, "--json", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    p50 = p50_of(json.loads(res.stdout))
    placement = p50["annotations"]["placement"]
    assert p50["params"]["backend"] == "gpu" and p50["annotations"]["backend_actual"] == "gpu+cpu"
    # LiteRT takes one partition, the longest run of ops it supports: the two FCs before LOG_SOFTMAX
    assert placement["ops_by_unit"] == {"gpu": 2, "cpu": 2}, placement
    assert placement["fallback_ops"] == ["t2 (LOG_SOFTMAX)", "t3 (FULLY_CONNECTED)"], placement
    assert placement["partitions"] == 2
    assert "llvmpipe" in placement["evidence"] and "LOG_SOFTMAX" in placement["evidence"]
    assert placement["precision"]["mode"] == "fp16"
    assert "warning: mesa25: asked for gpu, ran on gpu+cpu" in res.stderr, res.stderr

    # which ops the GPU took, checked by the numbers: the bare model equals its first two FCs on the GPU
    # (fp16) followed by LOG_SOFTMAX and the last FC in float64, far closer than the whole chain in float64
    x = np.random.default_rng(3).standard_normal((1, WIDTH)).astype(np.float32)
    got = bare(tmp_path / "partial.tflite", x, mesa.env())
    build(PARTIAL[:2], tmp_path / "head.tflite")
    head = bare(tmp_path / "head.tflite", x, mesa.env())
    tail = numpy_chain(PARTIAL[2:], weights[2:], head)
    exact = numpy_chain(PARTIAL, weights, x)
    off_tail, off_exact = float(np.abs(got - tail).max()), float(np.abs(got - exact).max())
    assert off_tail < off_exact / 20, (off_tail, off_exact)
    print(f"\npartial: GPU head + float64 tail {off_tail:.3g} off, the float64 chain {off_exact:.3g} off")

    res = edgebench(
        "bench", tmp_path / "partial.tflite", *on, "--backend", "gpu", "--require-backend", *BENCH, *store,
        cwd=tmp_path,
    )  # fmt: skip
    errors = error_lines(res)
    assert res.returncode == 1 and len(errors) == 1, res.stderr
    assert "mesa25" in errors[0] and "t2 (LOG_SOFTMAX)" in errors[0] and "2 of 4 ops" in errors[0], errors[0]
    after = run_json("results", *store, "--run", kept[0]["run_id"], cwd=tmp_path)["records"]
    assert len(after) == len(kept)


def test_a_model_the_gpu_takes_whole_passes_strict_mode(lab: Path, tmp_path: Path) -> None:
    build(WHOLE, tmp_path / "whole.tflite")
    doc = run_json(
        "bench", tmp_path / "whole.tflite", "--runtime", "litert", "--device", "mesa25", "--lab", lab,
        "--backend", "gpu", "--require-backend", *BENCH, "--no-store", cwd=tmp_path,
    )  # fmt: skip
    placement = p50_of(doc)["annotations"]["placement"]
    assert placement["actual"] == "gpu" and placement["ops_by_unit"] == {"gpu": len(WHOLE)}, placement
    assert placement["partitions"] == 1 and placement["fallback_ops"] == []
    assert "is_fully_accelerated()" in placement["evidence"] and "llvmpipe" in placement["evidence"]


@pytest.mark.parametrize("device", ["mesa22", "nogpu"])
def test_without_mesa_25_the_gpu_backend_fails_in_one_line_never_gpu(
    device: str, lab: Path, tmp_path: Path
) -> None:
    if not (lab / f"{device}.toml").exists():
        pytest.skip("this host has no lavapipe of its own (Debian's mesa-vulkan-drivers)")
    build(WHOLE, tmp_path / "whole.tflite")
    # the reference: LiteRT itself, in a process with that device's environment, cannot compile it
    env = {**os.environ, **_device_env(lab / f"{device}.toml")}
    argv = [sys.executable, __file__, str(tmp_path / "whole.tflite"), "-", "-", "gpu", "default"]
    probe = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode != 0 and "No adapters found" in probe.stderr, probe.stderr[-2000:]

    on = ["--runtime", "litert", "--device", device, "--lab", lab, "--backend", "gpu"]
    for strict in ([], ["--require-backend"]):
        res = edgebench(
            "bench", tmp_path / "whole.tflite", *on, *strict, *BENCH, "--json", "--no-store", cwd=tmp_path
        )
        errors = error_lines(res)
        assert res.returncode == 1 and len(errors) == 1, res.stderr
        assert f"{device}: LiteRT's GPU backend (WebGPU over Vulkan) could not be opened" in errors[0]
        assert "No adapters found" in errors[0], errors[0]
        assert not any(
            r["annotations"].get("backend_actual") == "gpu" for r in json.loads(res.stdout)["records"]
        )


def _device_env(descriptor: Path) -> dict[str, str]:
    import tomllib

    return dict(tomllib.loads(descriptor.read_text())["env"])


def test_gpu_fp16_numerics_are_measured_and_fp32_clears_them(mesa: Mesa, lab: Path, tmp_path: Path) -> None:
    model = tmp_path / "fc3.tflite"
    weights = build(NUMERIC, model)
    x = np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    on = ["--runtime", "litert", "--device", "mesa25", "--lab", lab, "--backend", "gpu"]
    res = edgebench(
        "accuracy", model, *on, "--inputs", tmp_path / "x.npz", "--no-store", "--json", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    records = json.loads(res.stdout)["records"]
    asked = {r["metric"]: r for r in records if r["params"].get("output") and not r["params"].get("remedy")}
    fixed = {r["metric"]: r for r in records if r["params"].get("output") and r["params"].get("remedy")}

    exact = numpy_chain(NUMERIC, weights, x)
    cpu = bare(model, x, mesa.env(), gpu=False)
    gpu16, gpu32 = bare(model, x, mesa.env()), bare(model, x, mesa.env(), f32=True)
    assert np.abs(cpu - exact).max() < 1e-5  # LiteRT's CPU is fp32: numpy's answer to its rounding
    want16, want32 = float(np.abs(gpu16 - cpu).max()), float(np.abs(gpu32 - cpu).max())
    assert want16 > 1e-3 > 1e-5 > want32, (want16, want32)  # fp16's resolution, and fp32's
    assert asked["max_abs_err"]["value"] == pytest.approx(want16, rel=0.05), (asked["max_abs_err"], want16)
    assert asked["max_abs_err"]["annotations"]["placement"]["precision"]["mode"] == "fp16"
    assert asked["max_abs_err"]["annotations"]["backend_actual"] == "gpu"
    assert fixed["max_abs_err"]["params"]["remedy"] == "precision=fp32"
    assert fixed["max_abs_err"]["annotations"]["remedy_restores"] is True
    assert fixed["max_abs_err"]["annotations"]["placement"]["precision"]["enforce_f32"] is True
    assert fixed["max_abs_err"]["value"] == pytest.approx(want32, abs=1e-6)
    assert fixed["max_abs_err"]["value"] < asked["max_abs_err"]["value"] / 100
    assert "running it in fp32 (precision=fp32) restores them" in res.stderr, res.stderr

    doc = run_json(
        "accuracy",
        model,
        *on,
        "--precision",
        "fp32",
        "--inputs",
        tmp_path / "x.npz",
        "--no-store",
        cwd=tmp_path,
    )
    err = next(r for r in doc["records"] if r["metric"] == "max_abs_err" and not r["params"].get("remedy"))
    assert err["value"] == pytest.approx(want32, abs=1e-6) and err["params"].get("precision") == "fp32", err
    assert err["annotations"]["placement"]["precision"]["mode"] == "fp32"
    print(
        f"\nfp16 max_abs_err {want16:.3g} (edgebench {asked['max_abs_err']['value']:.3g}); fp32 {want32:.3g}"
    )


if __name__ == "__main__":  # the bare CompiledModel: MODEL IN.npy OUT.npy gpu|cpu f32|default
    _model, _in, _out, _unit, _precision = sys.argv[1:6]
    _x = np.load(_in) if _in != "-" else np.zeros((1, WIDTH), np.float32)
    _y = bare_outputs(_model, _x, _unit == "gpu", _precision == "f32")
    if _out != "-":
        np.save(_out, _y)
