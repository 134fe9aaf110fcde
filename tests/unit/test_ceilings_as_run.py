"""Ceilings as a model runs: the thread count and affinity it was benched with, the latest run, the memory
level its working set lives in; floors of benched models from stored records, and why one beats its floor."""

from __future__ import annotations

from edgebench.analysis.ceilings import ceilings_at, model_floors
from edgebench.records import Record, RecordContext

MIB = 2**20


def mm(run: str, tops: float, threads: int, dtype: str = "fp32", **extra: object) -> Record:
    ctx = RecordContext(run, "dev", "matmul")
    return ctx.record("effective_tops", tops, "TOPS", dtype=dtype, threads=threads, stat="best", **extra)


def level(run: str, name: str, gbps: float, cap: int | None, threads: int = 2) -> Record:
    ctx = RecordContext(run, "dev", "bandwidth")
    return ctx.record(
        "level_bandwidth_gbps", gbps, "GB/s", {"capacity_bytes": cap}, level=name, threads=threads
    )


def point(run: str, size: int, gbps: float, threads: int = 2) -> Record:
    ctx = RecordContext(run, "dev", "bandwidth")
    return ctx.record(
        "sweep_bandwidth_gbps",
        gbps,
        "GB/s",
        kernel="read",
        threads=threads,
        working_set_bytes=size,
        stat="best",
    )


SWEEP = [
    level("s1", "L2", 100.0, 3 * MIB),
    level("s1", "LLC", 45.0, 40 * MIB),
    level("s1", "DRAM", 18.0, None),
    point("s1", 1 * MIB, 100.0),
    point("s1", 2 * MIB, 95.0),
    point("s1", 16 * MIB, 45.0),
    point("s1", 32 * MIB, 40.0),
    point("s1", 256 * MIB, 18.0),
]


def test_ceilings_never_use_more_threads_than_the_model_had_and_take_the_latest_run() -> None:
    records = [mm("a", 0.30, 1), mm("a", 0.55, 2), mm("b", 0.20, 1), *SWEEP]
    assert ceilings_at(records, "dev", threads=1) is None  # no bandwidth measured at 1 thread
    records.append(level("s0", "DRAM", 10.0, None, threads=1))
    at1 = ceilings_at(records, "dev", threads=1, run_order=["a", "b", "s0", "s1"])
    assert at1 is not None and at1.peak_tops["fp32"] == 0.20  # the latest run at 1 thread, not the max
    assert at1.matmul_run == "b" and at1.bandwidth_gbps == 10.0
    at2 = ceilings_at(records, "dev", threads=2, run_order=["a", "b", "s0", "s1"])
    assert at2 is not None and at2.peak_tops["fp32"] == 0.55 and at2.matmul_run == "a"
    assert ceilings_at(records, "other", threads=2) is None
    pinned = ceilings_at(records, "dev", threads=2, affinity=[0, 1])
    assert pinned is None  # nothing was measured pinned to those CPUs


def test_a_working_set_is_charged_at_the_level_it_lives_in() -> None:
    ceil = ceilings_at([mm("a", 0.5, 2), *SWEEP], "dev", threads=2)
    assert ceil is not None and ceil.bandwidth_gbps == 18.0  # DRAM from the sweep
    assert ceil.bandwidth_for(1.5 * MIB) == ("L2", 100.0)
    assert ceil.bandwidth_for(20 * MIB) == ("LLC", 45.0)
    assert ceil.bandwidth_for(300 * MIB) == ("DRAM", 18.0)


def roofline(run: str, model: str, flops: float, floor_bytes: float, ws: float) -> list[Record]:
    ctx = RecordContext(run, "dev", "roofline", model=model, runtime="onnxruntime")
    return [
        ctx.record("flops", flops, "FLOP", {"floor_by_dtype": {"fp32": flops}}),
        ctx.record("weight_bytes", floor_bytes, "B"),
        ctx.record("arithmetic_intensity", flops / floor_bytes, "FLOP/B", {"floor_bytes": floor_bytes}),
        ctx.record("working_set_bytes", ws, "B"),
    ]


def bench(run: str, model: str, p50: float, threads: int = 2) -> Record:
    ctx = RecordContext(run, "dev", "bench", model=model, runtime="onnxruntime")
    return ctx.record("latency_ms", p50, "ms", threads=threads, stat="p50")


def test_model_floors_pair_counts_bench_and_ceilings_and_name_why_one_beats_its_floor() -> None:
    records = [
        mm("c", 0.1, 2),  # 100 GFLOP/s
        *SWEEP,
        *roofline("r", "mlp", 2e6, 30 * MIB, 31 * MIB),  # LLC resident: 45 GB/s
        *roofline("r", "conv", 2e9, 1e6, 5 * MIB),  # compute-bound: 20 ms at 100 GFLOP/s
        bench("b", "mlp", 0.80),
        bench("b", "conv", 12.0),
    ]
    floors = {f.model: f for f in model_floors(records, ["c", "s1", "r", "b"])}
    mlp, conv = floors["mlp"], floors["conv"]
    assert mlp.floor.level == "LLC" and mlp.floor.bound == "memory"
    assert abs(mlp.floor.floor_ms - 30 * MIB / 45e9 * 1e3) < 1e-6
    assert mlp.reason() is None  # 0.80 ms is above its 0.70 ms floor
    assert conv.floor.bound == "compute" and conv.beats_by > 0.3
    why = conv.reason()
    assert why is not None and "compute floor by 40%" in why and "matmul" in why


def test_the_report_frame_gives_every_configuration_a_floor_and_a_note() -> None:
    from edgebench.render.report.frames import floors

    records = [
        mm("c", 0.1, 2),
        *SWEEP,
        *roofline("r", "mlp", 2e6, 30 * MIB, 31 * MIB),
        *roofline("r", "conv", 2e9, 1e6, 5 * MIB),
        bench("b", "mlp", 0.80),
        bench("b", "conv", 12.0),
    ]
    fl = floors(records, ["c", "s1", "r", "b"])
    assert len(fl) == 2 and fl["floor_ms"].notna().all() and (fl["threads"] == 2).all()
    notes = dict(zip(fl["model"], fl["note"], strict=True))
    assert notes["mlp"] == "the floor holds" and notes["conv"].startswith("beats the compute floor by 40%")
    assert list(fl["level"]) == ["LLC", "LLC"]  # 5 MB is past L2 (3 MB), 31 MB inside LLC (40 MB)


def test_a_peak_measured_beside_other_work_counts_as_measured_on_a_busy_device() -> None:
    # The runtime's own share reads full (its pool spins); the CPUs' counters left its threads half idle.
    ctx = RecordContext("a", "dev", "matmul")
    crowded = ctx.record(
        "effective_tops", 0.4, "TOPS", {"cpu_share": 1.02, "others_cpus": 1.0, "idle_cpu_share": 0.5},
        dtype="fp32", threads=2, stat="best",
    )  # fmt: skip
    got = ceilings_at([crowded, *SWEEP], "dev", threads=2)
    assert got is not None and got.peak_shares == {"fp32": 0.5}
    alone = ctx.record(
        "effective_tops", 0.4, "TOPS", {"cpu_share": 0.97}, dtype="fp32", threads=2, stat="best"
    )
    got = ceilings_at([alone, *SWEEP], "dev", threads=2)
    assert got is not None and got.peak_shares == {"fp32": 0.97}
