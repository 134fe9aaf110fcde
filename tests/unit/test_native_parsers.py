"""Runner adapters parse real captured output of each tool (fixtures name where each came from)."""

from __future__ import annotations

from importlib import resources

import pytest

from edgebench.native import MnnBenchmark, NativeOptions, NativeToolError, OrtPerfTest, TfliteBenchmarkModel
from edgebench.native.base import NativeResult


def fixture(name: str) -> str:
    text = resources.files("edgebench.native").joinpath("fixtures", name).read_text()
    assert text.startswith("# source:"), f"{name} must say where it came from"
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("# "))


def parse(adapter, name: str, rc: int = 0, **opts) -> NativeResult:  # type: ignore[no-untyped-def]
    return adapter.parse(fixture(name), rc, NativeOptions(**opts))


def test_tflite_android() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.android.txt", threads=4)
    assert r.count == 50
    assert r.aggregates == {"min": 32.641, "max": 34.005, "mean": 33.2094, "std": 0.45}
    assert r.load_ms == pytest.approx(0.855) and r.first_ms == pytest.approx(49.06)
    assert r.peak_memory_mb == pytest.approx(12.8672)


def test_tflite_xnnpack_path_and_memory_delta() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.xnnpack.txt")
    assert r.path == "xnnpack" and r.count == 50 and r.aggregates["mean"] == pytest.approx(55.0432)
    assert r.peak_memory_mb == pytest.approx(18.7227) and r.load_ms == pytest.approx(18.777)


def test_tflite_delegate_failure_is_an_error_with_the_tools_message() -> None:
    with pytest.raises(NativeToolError, match="Failed to apply XNNPACK delegate") as info:
        parse(TfliteBenchmarkModel(), "benchmark_model.delegate_error.txt", rc=1)
    assert info.value.kind == "delegate"


def test_ort_perf_test_percentiles() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.acl.txt")
    assert r.count == 8 and r.load_ms == pytest.approx(27.3071) and r.first_ms == 20
    assert r.aggregates["p50"] == pytest.approx(16.7086) and r.aggregates["mean"] == pytest.approx(17.735)
    assert r.aggregates["min"] == pytest.approx(15.9831) and r.aggregates["p999"] == pytest.approx(23.2702)
    assert r.peak_memory_mb == pytest.approx(35299328 / 2**20)


def test_ort_perf_test_new_average_label() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.android_sme2.txt", threads=1)
    assert r.aggregates["mean"] == pytest.approx(98.961997) and r.count == 5
    assert r.aggregates["p99"] == pytest.approx(101.519)


def test_ort_perf_test_old_format_without_percentiles() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.windows_old.txt")
    assert r.aggregates == {"mean": 734.606} and r.load_ms == pytest.approx(1841.49) and r.first_ms is None


def test_ort_perf_test_load_error() -> None:
    with pytest.raises(NativeToolError, match="INVALID_PROTOBUF"):
        parse(OrtPerfTest(), "onnxruntime_perf_test.load_error.txt", rc=255)


@pytest.mark.parametrize("name", ["mnn_benchmark.rockpi.txt", "mnn_benchmark.android_old.txt"])
def test_mnn_benchmark_first_line(name: str) -> None:
    r = parse(MnnBenchmark(), name, runs=20)
    assert set(r.aggregates) == {"min", "max", "mean"} and r.path == "cpu"
    assert r.aggregates["min"] <= r.aggregates["mean"] <= r.aggregates["max"]
    assert r.load_ms is None and r.first_ms is None  # the tool does not print them


def test_mnn_benchmark_load_error() -> None:
    with pytest.raises(NativeToolError, match="Invalidate buffer"):
        parse(MnnBenchmark(), "mnn_benchmark.load_error.txt")


def test_argv_maps_options_onto_flags() -> None:
    opts = NativeOptions(
        threads=2, warmup=3, runs=40, min_seconds=2, delegate="nnapi", precision="fp16", profile=True
    )
    tfl = TfliteBenchmarkModel().argv("/bin/bm", "/m.tflite", opts)
    assert {
        "--graph=/m.tflite",
        "--num_threads=2",
        "--warmup_runs=3",
        "--num_runs=40",
        "--min_secs=2",
        "--use_nnapi=true",
        "--allow_fp16=true",
        "--enable_op_profiling=true",
    } <= set(tfl)
    ort = OrtPerfTest().argv("/bin/pt", "/m.onnx", NativeOptions(threads=2, runs=40, delegate="qnn"))
    assert ort[-1] == "/m.onnx" and ["-x", "2"] == ort[ort.index("-x") : ort.index("-x") + 2]
    assert "qnn" in ort and "-s" in ort
    mnn = MnnBenchmark().argv(
        "/bin/b.out", "/dir", NativeOptions(threads=2, runs=40, warmup=3, delegate="opencl")
    )
    assert mnn == ["/bin/b.out", "/dir", "40", "3", "3", "2", "2"]
    with pytest.raises(NativeToolError):
        TfliteBenchmarkModel().argv("/bin/bm", "/m", NativeOptions(delegate="warp-drive"))
