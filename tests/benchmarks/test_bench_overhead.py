"""edgebench's p50 against a bare runtime loop on the same model, threads and kind of inputs, the two sides
alternated round by round in one pytest-benchmark run (edgebench.testing.bare: the runtime's own API,
nothing of the agent; the MNN loop copies its inputs in before every run, outside its timer; the loops run
in a session of their own, as the agent does).

- onnxruntime on the conv stack: goal within 2%, held to +-15%;
- MNN on the conv stack, the MLP and PP-OCR rec at a fixed shape: within +-15% (the copy-once defect was
  two orders of magnitude off);
- ncnn on the conv stack and the MLP (converted by pnnx, fp32, fp16 storage and arithmetic off on both
  sides): within 0.9-1.1; the conv stack on Vulkan (lavapipe) at ncnn's own precision there, likewise.

The ratio judged is each side's fastest round p50 against the other's (load only slows a side; a slow
stretch of the host can cover one whole side of a round with both CVs steady). A round is quiet when both
sides' back-to-back runs are steady (robust CV under 5%, the doctor's noise bound). Out of band more rounds
are measured until the verdict is conclusive (within BUDGET_S); with enough quiet rounds out of band fails,
beyond 2x it fails whatever the load, and on a machine never quiet the median of the rounds' ratios (both
sides of a round met the same load) must lie within 1.4x of 1: pass or fail, never a skip
(edgebench.testing.verdict.judge_band, until_conclusive).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgebench.descriptors import builtin_local
from edgebench.execution.oneshot import run_now
from edgebench.jobs import Job, ModelRef
from edgebench.models.convert import onnx_to_mnn
from edgebench.models.convert_ncnn import onnx_to_ncnn
from edgebench.models.refs import resolve_model
from edgebench.testing.bare import OwnSession, bare_mnn, bare_ncnn, bare_onnxruntime
from edgebench.testing.verdict import QUIET_CV, Rounds, judge_band, robust_cv, until_conclusive

ROUNDS = 5
BUDGET_S = 45.0  # more rounds, while another fits, when the first ROUNDS are not conclusive
RUNS = 200
CASE_RUNS = {"ppocr_rec": 60}  # ~15 ms a run: 60 give its p50 in a second, as 200 do for the small ones
BACKEND_RUNS = 40  # the conv stack on lavapipe takes ~60 ms a run: 40 give its p50 in 2.4 s a side
LOW, HIGH, BROKEN = 0.85, 1.15, 2.0
BAND = {"ncnn": (0.9, 1.1)}  # the band a runtime is held to, where not LOW-HIGH
BARE = {"onnxruntime": bare_onnxruntime, "mnn": bare_mnn, "ncnn": bare_ncnn}


def wheel_model(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (scripts/install-test-deps.sh installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        pytest.skip(f"{path} missing")
    return path


# name -> (model reference, input shapes): fixed shapes, the agent's own seeded uniform inputs.
CASES = {
    "convnet": ("builtin:convnet", {"image": (1, 3, 112, 112)}),
    "mlp": ("builtin:mlp", {"x": (1, 1024)}),
    "ppocr_rec": (("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx"), {"x": (1, 3, 48, 320)}),
}


def model_of(case: str) -> tuple[ModelRef, dict[str, tuple[int, ...]]]:
    ref, shapes = CASES[case]
    if isinstance(ref, tuple):
        return resolve_model(str(wheel_model(*ref))), shapes
    return resolve_model(ref), shapes


def inputs(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """What the agent feeds (seed 0, uniform in [-1, 1), float32, inputs in declaration order)."""
    rng = np.random.default_rng(0)
    return {name: rng.uniform(-1.0, 1.0, size=shape).astype(np.float32) for name, shape in shapes.items()}


def edgebench_p50(
    model: ModelRef, runtime: str, shapes: dict[str, tuple[int, ...]], runs: int, backend: str = "cpu"
) -> tuple[float, float]:
    """edgebench's p50 and the robust CV of its kept samples."""
    params = {"threads": 1, "runs": runs, "min_seconds": 0, "warmup_seconds": 0.5, "shapes": shapes}
    if backend != "cpu":
        params.update(backend=backend, require_backend=True)
    shot = run_now(builtin_local(), [Job("local", "bench", model, runtime, params)], None, "bench")
    shot.raise_first_error()
    p50 = next(r.value for r in shot.records if r.metric == "latency_ms" and r.params.get("stat") == "p50")
    [samples] = [s for s in shot.outcomes[0].samples if s.metric == "latency_ms"]
    return p50, robust_cv(list(samples.values))


@pytest.fixture(scope="module")
def bare_side() -> Iterator[OwnSession]:
    """The bare loops run in a session of their own, as the agent does (edgebench.testing.bare)."""
    with OwnSession() as session:
        yield session


def compare(benchmark, case: str, runtime: str, bare_side: OwnSession, backend: str = "cpu") -> None:  # type: ignore[no-untyped-def]
    model, shapes = model_of(case)
    feeds = inputs(shapes)
    converted = {"mnn": onnx_to_mnn, "ncnn": onnx_to_ncnn}
    path = str(converted[runtime](model.path)) if runtime in converted else str(model.path)
    bare_loop = BARE[runtime]
    low, high = BAND.get(runtime, (LOW, HIGH))
    rounds = Rounds()
    runs = CASE_RUNS.get(case, RUNS) if backend == "cpu" else BACKEND_RUNS
    # ncnn on Vulkan: both sides at ncnn's own precision there (fp16 storage and arithmetic on lavapipe)
    on_backend = {"vulkan": True, "fp16": None} if backend == "vulkan" else {}
    ours_ms: list[float] = []
    bare_ms: list[float] = []

    def one_round() -> None:  # alternate the two sides so drifting machine load hits both alike
        ours, ours_cv = edgebench_p50(model, runtime, shapes, runs, backend)
        bare = bare_side.call(bare_loop, path, feeds, threads=1, runs=runs, **on_backend)
        ours_ms.append(ours)
        bare_ms.append(bare.p50)
        rounds.add(ours, bare.p50, max(ours_cv, robust_cv(list(bare.ms))) < QUIET_CV)

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    name = f"{runtime} {case} {backend} p50 edgebench / bare loop"
    verdict, extra = until_conclusive(
        one_round, lambda final: judge_band(name, rounds, low, high, BROKEN, final), BUDGET_S, min_rounds=0
    )
    print(
        f"\n{verdict.reason}; rounds {ROUNDS} + {extra}; edgebench p50 {np.median(ours_ms):.3f} ms, "
        f"bare {np.median(bare_ms):.3f} ms; per round " + ", ".join(f"{r:.3f}" for r in rounds.ratios)
    )
    benchmark.extra_info.update(
        {"edgebench_p50_ms": ours_ms, "bare_p50_ms": bare_ms, "ratio": verdict.ratio, "basis": verdict.basis}
    )
    assert verdict.outcome == "pass", verdict.reason


def test_bench_p50_matches_bare_onnxruntime(benchmark, bare_side: OwnSession) -> None:  # type: ignore[no-untyped-def]
    compare(benchmark, "convnet", "onnxruntime", bare_side)


@pytest.mark.parametrize("case", list(CASES))
def test_mnn_p50_matches_a_bare_mnn_loop_that_refreshes_its_inputs(
    benchmark, case: str, bare_side: OwnSession
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("MNN")
    compare(benchmark, case, "mnn", bare_side)


@pytest.mark.parametrize("case", ["convnet", "mlp"])
def test_ncnn_p50_matches_a_bare_ncnn_loop(benchmark, case: str, bare_side: OwnSession) -> None:  # type: ignore[no-untyped-def]
    compare(benchmark, case, "ncnn", bare_side)


def test_ncnn_vulkan_p50_matches_a_bare_vulkan_loop(benchmark, bare_side: OwnSession) -> None:  # type: ignore[no-untyped-def]
    """ncnn on Vulkan (Mesa's lavapipe: the GPU API on the CPU), every layer on it (require_backend),
    held to the bare Vulkan loop, whose extract downloads each output as the agent's does."""
    pytest.importorskip("ncnn")
    import ncnn

    assert ncnn.get_gpu_count() > 0, "no Vulkan device: install mesa-vulkan-drivers (lavapipe)"
    compare(benchmark, "convnet", "ncnn", bare_side, backend="vulkan")
