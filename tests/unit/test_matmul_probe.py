"""Units of the compute probes: the agent's ONNX writer, sweep and checks; host-side records for matmul,
bandwidth and threads; ceilings found in a store; parameter parsing. Real runtimes are used where they are
cheap (a one-node graph through onnxruntime); timing-free."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgebench.agent import bandwidth as agent_bw
from edgebench.agent import matmul as agent_mm
from edgebench.agent import onnxwrite as ox
from edgebench.analysis.ceilings import Ceilings, find_ceilings, measured_latency
from edgebench.jobs import Job, JobOutcome
from edgebench.probes.bandwidth import bandwidth_records
from edgebench.probes.knobs import thread_counts
from edgebench.probes.matmul import backend_records, efficiency_records
from edgebench.probes.params import ParamError
from edgebench.probes.registry import MatmulParams
from edgebench.probes.threads import Group, sweep_records
from edgebench.records import RecordContext, utc_now
from edgebench.results.store import Store


def ctx(probe: str = "matmul") -> RecordContext:
    return RecordContext(run_id="r1", device="dev", probe=probe)


# ---- the agent's ONNX writer ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op,dtype",
    [
        ("MatMul", "fp32"),
        ("MatMul", "fp16"),
        ("MatMulInteger", "int8"),
        ("MatMulInteger:u8u8", "int8"),
        ("QLinearMatMul", "int8"),
        ("DynamicQuantizeMatMul", "int8"),
    ],
)
def test_probe_graphs_are_valid_onnx_and_compute_the_product(op: str, dtype: str) -> None:
    backend = agent_mm.OrtBackend(None, [])
    m, n, k = 3, 5, 64
    kernel = backend.build(op, dtype, m, n, k, threads=1, seed=0)
    kernel.step()
    ok, detail, checksum, _ = agent_mm.verify(kernel, m, n, agent_mm.tolerance(dtype, op), 0)
    assert ok, detail
    assert np.isfinite(checksum)
    _, b = agent_mm.make_operands(dtype, m, n, k, 0)
    model_bytes, _, _ = backend.graph(op, dtype, m, n, k, b)
    parsed = onnx.load_from_string(model_bytes)
    onnx.checker.check_model(parsed)
    assert [nd.op_type for nd in parsed.graph.node] == [op.split(":")[0]]


def test_writer_encodes_attributes_and_negative_ints() -> None:
    model_bytes = ox.model_bytes(
        [
            ox.Node("Gemm", ["A", "B"], ["C"], attributes={"alpha": 2.0, "transB": 1}),
            ox.Node("Flatten", ["C"], ["D"], attributes={"axis": -1}),
        ],
        [ox.value_info("A", ox.FLOAT, [2, 3])],
        [ox.value_info("D", ox.FLOAT, [2, 4])],
        [ox.tensor_from_array("B", np.arange(12, dtype=np.float32).reshape(4, 3))],
        {"": 17},
    )
    parsed = onnx.load_from_string(model_bytes)
    onnx.checker.check_model(parsed)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for nd in parsed.graph.node for a in nd.attribute}
    assert attrs == {"alpha": 2.0, "transB": 1, "axis": -1}
    out = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(
        None, {"A": np.ones((2, 3), np.float32)}
    )[0]
    assert np.allclose(out, 2 * np.ones((2, 3)) @ np.arange(12, dtype=np.float32).reshape(4, 3).T)


def test_wrong_results_fail_verification() -> None:
    a, b = agent_mm.make_operands("fp32", 8, 8, 8, 0)
    zeros = np.zeros((8, 8), np.float32)
    kernel = agent_mm.Kernel(
        "fake", lambda: None, lambda: zeros, lambda pts: agent_mm.dot_reference(a, b, pts), operands="f32f32"
    )
    ok, detail, _, _ = agent_mm.verify(kernel, 8, 8, 1e-4, 0)
    assert not ok and "relative error" in detail


# ---- sweep and calibration --------------------------------------------------------------------------
def sweep(rates: dict[int, float], policy: agent_mm.MatmulPolicy, time_left=lambda: 1e9, fits=lambda n: True):  # type: ignore[no-untyped-def]
    return agent_mm.square_sweep(lambda n: (rates[n], 0.001), policy, time_left, fits)


def test_sweep_stops_when_the_rate_stops_growing_but_not_before_min_top() -> None:
    policy = agent_mm.MatmulPolicy(start=128, min_top=2048, max_size=8192)
    plateau = {128: 1, 256: 2, 512: 4, 1024: 5, 2048: 5.1, 4096: 5.2, 8192: 5.3}
    assert sweep(plateau, policy) == ([128, 256, 512, 1024, 2048], None)
    growing = {n: float(n) for n in plateau}
    assert sweep(growing, policy) == ([128, 256, 512, 1024, 2048, 4096, 8192], None)
    early_peak = {128: 1, 256: 9, 512: 2, 1024: 2, 2048: 2, 4096: 2, 8192: 2}
    assert sweep(early_peak, policy)[0] == [128, 256, 512, 1024, 2048]  # min_top still reached


def test_sweep_respects_budget_and_memory() -> None:
    policy = agent_mm.MatmulPolicy(start=128, min_top=2048, max_size=8192)
    rates = {n: float(n) for n in (128, 256, 512, 1024, 2048, 4096, 8192)}
    sizes, why = sweep(rates, policy, time_left=lambda: 0.0)
    assert sizes == [128] and "budget" in (why or "")
    sizes, why = sweep(rates, policy, fits=lambda n: n < 1024)
    assert sizes == [128, 256, 512] and "memory" in (why or "")


def test_measure_calibrates_calls_per_trial() -> None:
    policy = agent_mm.MatmulPolicy(trials=3, warmup_seconds=0.01, min_trial_seconds=0.02)
    trials, cpu, calls, warm = agent_mm.measure(lambda: time.sleep(0.002), policy)
    assert len(trials) == 3 == len(cpu) and warm >= 1
    # calls grow until a trial lasts min_trial_seconds: 10 of 2 ms on a quiet host, 2 where a busy one
    # made each 2 ms sleep last 12 ms
    assert calls >= 2 and calls * max(trials) >= 0.9 * 20.0, (calls, trials)
    assert all(1.5 < t < 50 for t in trials)  # per-call ms
    assert all(c < t / 2 for c, t in zip(cpu, trials, strict=True))  # sleeping is not CPU time
    _, busy_cpu, _, _ = agent_mm.measure(lambda: sum(range(20000)), policy)
    assert max(busy_cpu) > 0


# ---- host-side records --------------------------------------------------------------------------------
def agent_result() -> dict:
    base = {
        "op": "MatMul",
        "dtype": "fp32",
        "m": 256,
        "n": 256,
        "k": 256,
        "threads": 2,
        "shape": "square",
        "operands": "fp32",
        "emulated": None,
        "calls_per_trial": 4,
        "warmup_calls": 2,
        "checksum": 1.0,
        "verified": "ok",
    }
    return {
        "backend": "onnxruntime",
        "available": True,
        "version": "1",
        "results": [
            {**base, "trial_ms": [2.0, 1.0, 4.0], "trial_cpu_ms": [4.0, 0.6, 8.0]},
            {**base, "dtype": "fp16", "emulated": "emulated: casts", "trial_ms": [3.0, 3.0, 3.0]},
        ],
        "skipped": [{"dtype": "int8", "op": "QLinearMatMul", "reason": "no kernel"}],
        "cut_short": ["MatMul fp32 threads=2: time budget reached before n=512"],
    }


def test_matmul_records_best_median_samples_and_efficiency() -> None:
    out = backend_records(ctx(), agent_result(), ["agent note"])
    best = [r for r in out.records if r.params.get("stat") == "best"]
    median = [r for r in out.records if r.params.get("stat") == "median"]
    # written out, not the probe's own tops(): 2 x 256^3 multiply-adds' operations in 1 ms and in 2 ms
    assert best[0].value == pytest.approx(33_554_432 / 1e-3 / 1e12)  # 0.0336 TOPS
    assert median[0].value == pytest.approx(33_554_432 / 2e-3 / 1e12)
    assert best[0].runtime == "onnxruntime" and best[0].params["backend"] == "onnxruntime"
    assert best[1].annotations["emulated"].startswith("emulated") and "emulated" not in best[0].annotations
    assert "emulated" not in best[1].params  # how it ran, not what was measured: fp16 pairs with fp16
    assert out.samples[0].values == (2.0, 1.0, 4.0) and out.samples[0].unit == "ms"
    assert {k: v for k, v in best[0].params.items() if k != "stat"} == out.samples[0].params
    assert any("QLinearMatMul not measured: no kernel" in w for w in out.warnings)
    assert any("stopped early" in w for w in out.warnings) and any("agent note" in w for w in out.warnings)
    # the fastest trial got 0.6 ms of CPU in 1 ms on 2 threads: 30% of what it asked for
    assert out.samples[1].metric == "trial_cpu_ms" and out.samples[1].values == (4.0, 0.6, 8.0)
    assert any("the device was busy" in w and "30%" in w for w in out.warnings)
    eff = efficiency_records(ctx(), out, {"fp32": 0.01})
    assert len(eff.records) == 1 and eff.records[0].value == pytest.approx(best[0].value / 0.01)
    assert eff.records[0].annotations["nominal_tops"] == 0.01
    unavailable = backend_records(
        ctx(), {"backend": "mnn", "available": False, "reason": "not installed"}, []
    )
    assert not unavailable.records and "not installed" in unavailable.warnings[0]


def test_bandwidth_records_skip_the_first_trial_and_count_stream_bytes() -> None:
    result = {
        "array_bytes": 80_000_000,
        "llc_bytes": 20_000_000,
        "results": [
            {
                "kernel": "triad",
                "threads": 1,
                "bytes": 24 * 10_000_000,
                "trial_ms": [1.0, 30.0, 20.0, 40.0],
                "warmup_trials": 1,
            }
        ],
    }
    out = bandwidth_records(ctx("bandwidth"), result, [], nominal_gbps=24.0)
    best = next(r for r in out.records if r.params.get("stat") == "best")
    assert best.value == pytest.approx(240e6 / 0.020 / 1e9)  # 12 GB/s: the 1 ms first trial is left out
    eff = next(r for r in out.records if r.metric == "efficiency")
    assert eff.value == pytest.approx(0.5) and eff.annotations["nominal_gbps"] == 24.0
    assert best.params["array_bytes"] == 80_000_000 and best.annotations["bytes"] == 240_000_000
    assert out.samples[0].values == (1.0, 30.0, 20.0, 40.0)
    assert agent_bw.BYTES_PER_ELEMENT == {"read": 8, "copy": 16, "triad": 24}


@pytest.mark.parametrize("path", ["numpy", "blas", "compiled"])
def test_bandwidth_kernels_compute_and_checks_catch_wrong_results(path: str) -> None:
    try:
        fused, axpy, how = agent_bw.choose_triad(path, [])
    except agent_bw.TaskError as exc:
        pytest.skip(f"no {path} triad here: {exc}")
    assert how.startswith(
        {"numpy": "numpy in place", "blas": "memmove + ", "compiled": "compiled C loop"}[path]
    )
    arrays = agent_bw.Arrays(np, 100_003, 3, 1024, axpy, fused)
    workers = agent_bw.Workers(3, None)
    try:
        workers.run(arrays.init)
        for kernel in agent_bw.KERNELS:
            times, cpu = agent_bw.measure(workers, arrays, kernel, trials=2)
            assert len(times) == len(cpu) == 3
        # STREAM order: copy made c = a (1.0), then triad a = b + s * c
        assert np.allclose(arrays.c, 1.0) and np.allclose(arrays.a, 2.0 + agent_bw.SCALAR * 1.0)
        assert sum(arrays.sums) == pytest.approx(100_003 * 1.0)
        arrays.a[0] = -1.0  # the first element is always among the spot checks
        assert agent_bw.check(arrays, "triad") is not None
        arrays.c[:] = 0.0
        assert agent_bw.check(arrays, "copy") is not None
    finally:
        workers.close()


def test_triad_falls_back_and_says_why_without_a_working_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    warnings: list[str] = []
    fused, axpy, how = agent_bw.choose_triad("auto", warnings)
    assert fused is None and "no C compiler" in warnings[0]
    assert how.startswith("memmove + ") if axpy else how == "numpy in place (no compiler, no BLAS daxpy)"
    with pytest.raises(agent_bw.TaskError, match="no compiled triad on this device: no C compiler"):
        agent_bw.choose_triad("compiled", [])
    with pytest.raises(agent_bw.TaskError, match="unknown triad path 'fast'"):
        agent_bw.choose_triad("fast", [])
    broken = tmp_path / "cc"  # a compiler that fails: its last line of stderr is the reason given
    broken.write_text("#!/bin/sh\necho 'cc: error: unsupported target' >&2\nexit 1\n")
    broken.chmod(0o755)
    warnings = []
    fused, _, _ = agent_bw.choose_triad("auto", warnings)
    assert fused is None and "cc -O3: cc: error: unsupported target" in warnings[0]


def test_compiled_triad_is_built_per_run_and_leaves_nothing_behind(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from edgebench.agent import native

    if native.find_compiler() is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    problems: list[str] = []
    found = native.triad_kernel(problems)
    assert found is not None, problems
    triad, how = found
    a, b, c = np.zeros(1001), np.arange(1001.0), np.full(1001, 0.5)
    triad(a.ctypes.data, b.ctypes.data, c.ctypes.data, 3.0, 1000)  # the last element stays untouched
    assert np.array_equal(a[:1000], b[:1000] + 1.5) and a[1000] == 0.0
    assert "-O3" in how and list(tmp_path.iterdir()) == []  # the build folder is gone


def test_cache_sizes_sum_last_level_instances(tmp_path: Path) -> None:
    def cache(cpu: int, index: int, level: int, size: str, shared: str, kind: str = "Unified") -> None:
        d = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("size", size), ("shared_cpu_list", shared), ("type", kind)):
            (d / name).write_text(f"{value}\n")

    for cpu in range(4):
        cache(cpu, 0, 1, "32K", str(cpu), "Data")
        cache(cpu, 1, 1, "32K", str(cpu), "Instruction")
        cache(cpu, 2, 2, "512K", str(cpu))
        cache(cpu, 3, 3, "16M", "0-1" if cpu < 2 else "2-3")  # two L3 instances
    assert agent_bw.last_level_cache(str(tmp_path)) == 32 * 2**20
    assert agent_bw.l2_per_core(str(tmp_path)) == 512 * 1024


def test_sizing_follows_overrides() -> None:
    sizing = agent_bw.choose_sizing({"llc_bytes": 8 * 2**20})
    assert sizing.array_bytes == 32 * 2**20 and sizing.llc_source == "task"
    small = agent_bw.choose_sizing({"llc_bytes": 8 * 2**20, "array_bytes": 4 * 2**20})
    assert small.array_bytes == 4 * 2**20 and any("under 4x" in n for n in small.notes)


def test_thread_sweep_flags_more_threads_slower() -> None:
    out = sweep_records(
        ctx("threads"), Group("big", (4, 5, 6, 7), True), {1: 10.0, 2: 6.0, 3: 6.1, 4: 9.0}, 0.05
    )
    best = next(r for r in out.records if r.metric == "best_threads")
    assert (
        best.value == 2 and best.annotations["more_threads_slower"] and best.annotations["slower_at"] == [4]
    )
    assert best.params["affinity"] == [4, 5, 6, 7] and best.params["cluster"] == "big"
    speed = {r.params["threads"]: r.value for r in out.records if r.metric == "thread_speedup"}
    assert speed[2] == pytest.approx(10 / 6) and speed[1] == 1.0
    slow = {
        r.params["threads"]: r.annotations["slower"] for r in out.records if r.metric == "thread_slowdown"
    }
    assert slow == {2: False, 3: False, 4: True}
    assert out.warnings and "threads=4" in out.warnings[0]
    clean = sweep_records(ctx("threads"), Group("all", (0, 1), False), {1: 10.0, 2: 5.0}, 0.05)
    best = next(r for r in clean.records if r.metric == "best_threads")
    assert (
        not best.annotations["more_threads_slower"] and "affinity" not in best.params and not clean.warnings
    )


# ---- ceilings from the store ---------------------------------------------------------------------------
def store_job(st: Store, run_id: str, records: list) -> None:  # type: ignore[type-arg]
    st.begin_run(run_id, "probe", {})
    st.save_job(
        run_id, JobOutcome(Job("dev", records[0].probe), "ok", records, started=utc_now(), finished=utc_now())
    )
    st.finish_run(run_id, "ok")


def test_ceilings_come_from_the_latest_runs(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:

        def mm(run: str, value: float, dtype: str = "fp32", stat: str = "best"):  # type: ignore[no-untyped-def]
            c = RecordContext(run, "dev", "matmul")
            return c.record("effective_tops", value, "TOPS", dtype=dtype, stat=stat, backend="numpy")

        store_job(st, "a-old", [mm("a-old", 9.0)])
        time.sleep(0.01)
        store_job(
            st,
            "b-new",
            [
                mm("b-new", 0.5),
                mm("b-new", 0.7),
                mm("b-new", 0.9, stat="median"),
                mm("b-new", 2.0, dtype="int8"),
            ],
        )
        assert find_ceilings(st, "dev") is None  # no bandwidth yet
        bw = RecordContext("c-bw", "dev", "bandwidth")
        store_job(
            st,
            "c-bw",
            [
                bw.record("bandwidth_gbps", 20.0, "GB/s", kernel="triad", stat="best"),
                bw.record("bandwidth_gbps", 25.0, "GB/s", kernel="copy", stat="best"),
            ],
        )
        found = find_ceilings(st, "dev")
        assert found is not None
        assert found.peak_tops == {"fp32": 0.7, "int8": 2.0} and found.bandwidth_gbps == 25.0
        assert found.matmul_run == "b-new" and found.bandwidth_run == "c-bw"
        assert Ceilings.from_params(found.to_params()).peak_tops == found.peak_tops
        assert find_ceilings(st, "other") is None
        b = RecordContext("d-bench", "dev", "bench", model="net")
        store_job(
            st,
            "d-bench",
            [
                b.record("latency_ms", 3.0, "ms", stat="p50", threads=1),
                b.record("latency_ms", 2.0, "ms", stat="p50", threads=2),
                b.record("latency_ms", 1.0, "ms", stat="p50", threads=2, shapes={"x": [4, 8]}),
            ],
        )
        got = measured_latency(st, "dev", "net", None)
        assert got is not None and got.p50_ms == 2.0 and got.params["threads"] == 2
        shaped = measured_latency(st, "dev", "net", {"x": [4, 8]})
        assert shaped is not None and shaped.p50_ms == 1.0
        assert measured_latency(st, "dev", "other", None) is None


# ---- parameters ----------------------------------------------------------------------------------------
def test_params_parse_and_reject_bad_values() -> None:
    assert MatmulParams.parse({"threads": "1-3,6"}).threads == (1, 2, 3, 6)
    assert MatmulParams.parse({"sizes": [512, "256"]}).sizes == (256, 512)
    assert thread_counts(None, 4) == [1, 2, 3, 4]
    assert thread_counts(MatmulParams.parse({"threads": "max"}).threads, 4) == [4]
    assert thread_counts(MatmulParams.parse({"threads": 2}).threads, 4) == [2]
    assert MatmulParams.parse({"skinny": ["1x4096x4096", [2, 3, 4]]}).skinny == ((1, 4096, 4096), (2, 3, 4))
    assert MatmulParams.parse({"skinny": False}).skinny is False
    with pytest.raises(ParamError, match="threads"):
        MatmulParams.parse({"threads": "two"})
    with pytest.raises(ParamError, match="GEMM shape"):
        MatmulParams.parse({"skinny": ["1x2"]})


@pytest.mark.parametrize(
    "others,watched,threads,warned",
    [
        (1.0, 2, 2, True),  # two busy loops' worth on two CPUs: a 2-thread GEMM had one CPU, not two
        (0.1, 2, 2, False),  # kernel threads, a shell: noise
        (1.0, 2, 1, False),  # one CPU left idle for its one thread
        (None, 2, 2, False),  # the device could not tell (no /proc/stat): no claim either way
    ],
)
def test_other_work_on_the_measured_cpus_is_annotated_and_warned_even_at_a_full_cpu_share(
    others: float | None, watched: int, threads: int, warned: bool
) -> None:
    result = agent_result()
    # the spinning pool's share reads full: only the CPUs' own counters see the other work
    result["results"] = [
        {
            **result["results"][0],
            "threads": threads,
            "trial_cpu_ms": [2.0 * threads, 1.0 * threads, 4.0 * threads],
            "others_cpus": others,
            "cpus_watched": watched,
        }
    ]
    out = backend_records(ctx(), result, [])
    said = [w for w in out.warnings if "other processes kept CPUs it ran on busy" in w]
    assert bool(said) is warned, out.warnings
    assert not any("the device was busy" in w and "under 70%" in w for w in out.warnings)
    best = next(r for r in out.records if r.params.get("stat") == "best")
    assert best.annotations.get("others_cpus") == others
