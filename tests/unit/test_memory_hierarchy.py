"""The memory-hierarchy sweep: knees found from the measured curve, levels named from DRAM up, and the
agent's sweep kernels checked against an exact count of what they moved."""

from __future__ import annotations

import random

from edgebench.agent import bandwidth as agent_bw
from edgebench.probes.bandwidth import LEVEL_NAMES, hierarchy, sweep_sizes

KIB, MIB = 2**10, 2**20


def curve(plateaus: list[tuple[int, float]], noise: float = 0.0, seed: int = 1) -> list[tuple[int, float]]:
    """(size, GB/s) points, 2 per doubling from 32 KiB to 512 MiB, on plateaus ending at the given sizes."""
    rng = random.Random(seed)
    out = []
    for size in sweep_sizes(32 * KIB, 512 * MIB, 2):
        gbps = next(g for end, g in plateaus if size <= end)
        out.append((size, gbps * (1 + rng.uniform(-noise, noise))))
    return out


def test_sweep_sizes_double_in_steps_and_align_to_pages() -> None:
    sizes = sweep_sizes(32 * KIB, 1 * MIB, 2)
    assert sizes[0] == 32 * KIB and sizes[-1] == 1 * MIB
    assert len(sizes) == 11 and all(s % 4096 == 0 for s in sizes)


def test_three_plateaus_give_l2_llc_dram_with_knees_between() -> None:
    levels = hierarchy(curve([(2 * MIB, 100.0), (32 * MIB, 45.0), (2**40, 18.0)], noise=0.05))
    assert [lv.name for lv in levels] == ["L2", "LLC", "DRAM"]
    l2, llc, dram = levels
    assert 2 * MIB < (l2.capacity_bytes or 0) < 3 * MIB
    assert 32 * MIB < (llc.capacity_bytes or 0) < 46 * MIB
    assert dram.capacity_bytes is None
    assert l2.gbps > 95 and 40 < llc.gbps < 50 and 15 < dram.gbps < 20


def test_one_slow_point_is_not_a_knee_and_a_gradual_decline_has_at_most_four_levels() -> None:
    points = curve([(4 * MIB, 80.0), (2**40, 20.0)])
    points[3] = (points[3][0], 10.0)  # one disturbed trial inside the cache
    assert [lv.name for lv in hierarchy(points)] == ["LLC", "DRAM"]
    sliding = [(s, 200.0 * 0.8**i) for i, (s, _) in enumerate(curve([(2**40, 1.0)]))]
    levels = hierarchy(sliding)
    assert 1 < len(levels) <= len(LEVEL_NAMES) and levels[-1].name == "DRAM"


def test_agent_sweep_moves_what_it_counts() -> None:
    warnings: list[str] = []
    out = agent_bw.sweep({"sweep": [64 * KIB, 1 * MIB], "trials": 2}, None, [1, 2], warnings)
    points = out["sweep"]
    assert {(p["kernel"], p["threads"]) for p in points} == {(k, t) for k in ("read", "copy") for t in (1, 2)}
    for p in points:
        n = p["working_set_bytes"] // 8
        reps = max(1, agent_bw.SWEEP_TRIAL_BYTES // (8 * n))
        assert p["bytes"] == reps * (8 * n if p["kernel"] == "read" else 16 * (n // 2))
        assert len(p["trial_ms"]) == 2 and min(p["trial_ms"]) > 0
