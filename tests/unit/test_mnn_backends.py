"""MNN's backends: the precision mode asked of pymnn, the arithmetic it computed in, where a session ran
(agent.session_mnn), and `benchmark.out`'s placement lines read from real captures of the lab's
OpenCL+Vulkan build (native/fixtures/mnn_benchmark.*_3.6.1.txt name their commands)."""

from __future__ import annotations

from importlib import resources

import pytest

from edgebench.agent.session import BackendError
from edgebench.agent.session_mnn import BACKENDS, computed_in, mnn_precision, placement_of
from edgebench.native import MnnBenchmark, NativeOptions, NativeToolError
from edgebench.native.base import NativeResult
from edgebench.runtimes.mnn import RUNTIME

SAID_OPENCL = "MNN use low precision\nCan't Find type=3 backend, use 0 instead\n"
FP32 = {"mode": "fp32", "mnn_precision": "normal"}


def test_the_runtime_entry_offers_what_the_session_opens() -> None:
    assert RUNTIME.backends == tuple(BACKENDS) and RUNTIME.backends[0] == "cpu"


# ---- mnn_precision ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("asked", "backend", "mode"),
    [
        (None, "cpu", "normal"),  # MNN's default: fp32 on the CPU, fp16 on GPU backends
        (None, "vulkan", "normal"),
        ("fp32", "cpu", "normal"),
        ("fp32", "opencl", "high"),  # Normal is fp16 on a GPU backend
        ("fp16", "cpu", "low"),
        ("low", "vulkan", "low"),
        ("bf16", "cpu", "Low_BF16"),
        ("high", "cpu", "high"),  # MNN's own names pass through
        ("Low_BF16", "cpu", "Low_BF16"),
    ],
)
def test_mnn_precision_maps_what_was_asked(asked: str | None, backend: str, mode: str) -> None:
    assert mnn_precision(asked, backend) == mode


def test_mnn_precision_refuses_what_mnn_cannot_compute_in_one_line() -> None:
    with pytest.raises(BackendError, match="bf16 on its CPU backend only, not on vulkan"):
        mnn_precision("bf16", "vulkan")
    with pytest.raises(BackendError, match="fp32, fp16, bf16 or low.*not 'int4'") as info:
        mnn_precision("int4", "cpu")
    assert "\n" not in str(info.value)


# ---- computed_in ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("unit", "forward", "mode", "machine", "arithmetic"),
    [
        ("cpu", 13, "normal", "x86_64", "fp32"),
        ("cpu", 13, "low", "x86_64", "fp32"),  # x86 has no fp16 kernels: AVX2 (13) at every precision
        ("cpu", 13, "low", "aarch64", "fp16"),  # ARMv8.2's fp16 backend
        ("cpu", 0, "low", "aarch64", "fp32"),  # a CPU without fp16: the plain backend
        ("cpu", 13, "Low_BF16", "aarch64", "bf16"),
        ("cpu", 0, "Low_BF16", "aarch64", "fp32"),
        ("cpu", 13, "Low_BF16", "x86_64", "unknown"),  # 13 is x86's AVX2 backend too
        ("cpu", None, "low", "aarch64", "unknown"),  # no type reported: cannot tell
        ("vulkan", 7, "high", "x86_64", "fp32"),
        ("vulkan", 7, "normal", "x86_64", "unknown"),  # fp16 where the device has it: not visible
        ("opencl", 3, "low", "aarch64", "unknown"),
    ],
)
def test_computed_in_follows_mnns_rules(
    unit: str, forward: int | None, mode: str, machine: str, arithmetic: str
) -> None:
    assert computed_in(unit, forward, mode, machine) == arithmetic


# ---- placement_of --------------------------------------------------------------------------------------------
def test_a_fallback_line_is_the_cpu_with_the_line_as_evidence() -> None:
    p = placement_of("opencl", 13, SAID_OPENCL, FP32, 4)
    assert p.requested == "opencl" and p.actual == "cpu" and not p.full and p.partitions == 1
    assert "'Can't Find type=3 backend, use 0 instead' printed by MNN" in p.evidence
    assert "getSessionInfo BACKENDS = 13 (cpu)" in p.evidence and p.precision == FP32
    assert "the CPU ran 4 threads (the GPU mode taken as a count)" in p.evidence
    asked_one = placement_of("opencl", 13, SAID_OPENCL, FP32, 4, threads=1).evidence
    assert "the CPU ran 4 threads (the GPU mode taken as a count, not the 1 asked)" in asked_one
    shortfall = p.shortfall()
    assert shortfall is not None and "opencl was asked for; the model ran on cpu" in shortfall
    # The line wins over a report that contradicts it, and over no report: never the backend asked for
    assert placement_of("vulkan", 7, "Can't Find type=7 backend, use 0 instead", FP32).actual == "cpu"
    assert placement_of("vulkan", None, "Can't Find type=7 backend, use 0 instead", FP32).actual == "cpu"


def test_without_a_fallback_line_the_reported_type_is_what_ran() -> None:
    cpu = placement_of("cpu", 13, "", FP32)
    assert cpu.full and cpu.actual == "cpu" and cpu.shortfall() is None
    gpu = placement_of("vulkan", 7, "", {"mode": "unknown"}, 4)
    assert gpu.full and gpu.actual == "vulkan" and gpu.partitions is None  # ops not reported
    assert "no fallback printed (GPU mode 4)" in gpu.evidence and "not reported" in gpu.evidence
    moved = placement_of("vulkan", 0, "", FP32)  # reported the CPU though nothing was printed
    assert moved.actual == "cpu" and not moved.full


def test_no_report_and_no_line_is_unknown_except_on_the_cpu() -> None:
    assert placement_of("cpu", None, "", FP32).actual == "cpu"
    p = placement_of("opencl", None, "", FP32)
    assert p.actual == "unknown" and not p.full and "unknown" in (p.shortfall() or "")


# ---- benchmark.out's placement lines, parsed from real 3.6.1 captures -----------------------------------------
def fixture(name: str) -> str:
    text = resources.files("edgebench.native").joinpath("fixtures", name).read_text()
    assert text.startswith("# source:"), f"{name} must say where it came from"
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("# "))


def parse(name: str, **opts: object) -> NativeResult:
    return MnnBenchmark().parse(fixture(name), 0, NativeOptions(model_name="convnet.mnn", **opts))  # type: ignore[arg-type]


def test_parser_vulkan_on_lavapipe_is_recorded_as_vulkan() -> None:
    r = parse("mnn_benchmark.vulkan_lavapipe_3.6.1.txt", delegate="vulkan", runs=10, warmup=2)
    assert r.path == "vulkan" and r.applied == {"backend": "vulkan", "precision": "fp32"}
    assert "no 'Can't Find type=7 backend' line" in r.notes["placement_evidence"]
    assert r.notes["precision_mode"] == "high" and r.notes["gpu_mode"] == 4
    assert r.aggregates["mean"] == pytest.approx(155.122) and r.count == 10
    assert not any("recorded as" in w for w in r.warnings)
    strict = parse("mnn_benchmark.vulkan_lavapipe_3.6.1.txt", delegate="vulkan", require_backend=True)
    assert strict.path == "vulkan"  # strict mode passes the run that really was on Vulkan


@pytest.mark.parametrize(
    ("name", "asked", "reason"),
    [
        ("mnn_benchmark.vulkan_no_loader_3.6.1.txt", "vulkan", "Load vulkan library error: libvulkan.so"),
        ("mnn_benchmark.vulkan_no_icd_3.6.1.txt", "vulkan", "Invalide device for support vulkan"),
        ("mnn_benchmark.opencl_init_error_3.6.1.txt", "opencl", "OpenCL init error, fallback"),
    ],
)
def test_parser_a_backend_that_cannot_start_is_recorded_as_the_cpu(
    name: str, asked: str, reason: str
) -> None:
    r = parse(name, delegate=asked, runs=10, warmup=2)
    assert r.path == "cpu" and r.applied == {"backend": "cpu", "precision": "fp32"}
    code = {"vulkan": 7, "opencl": 3}[asked]
    evidence = r.notes["placement_evidence"]
    assert reason in evidence and f"Can't Find type={code} backend, use 0 instead" in evidence
    [warning] = [w for w in r.warnings if "recorded as cpu" in w]
    assert f"asked for {asked}" in warning and "at 4 threads" in warning
    with pytest.raises(
        NativeToolError, match=f"{asked} is required, but libMNN has no {asked} backend"
    ) as info:
        parse(name, delegate=asked, require_backend=True)
    assert info.value.kind == "delegate" and reason in str(info.value) and "\n" not in str(info.value)


def test_parser_the_cpu_on_the_gpu_build_is_the_cpu() -> None:
    """The fallback runs time what the CPU backend times (avg 3.69 ms at 4 threads) and the lavapipe run
    155 ms: the captures are of the runs they name."""
    vulkan = parse("mnn_benchmark.vulkan_lavapipe_3.6.1.txt", delegate="vulkan").aggregates["mean"]
    for name, asked in (
        ("vulkan_no_loader", "vulkan"),
        ("vulkan_no_icd", "vulkan"),
        ("opencl_init_error", "opencl"),
    ):
        fell = parse(f"mnn_benchmark.{name}_3.6.1.txt", delegate=asked).aggregates["mean"]
        assert fell * 10 < vulkan, name
