"""How the benchmarks judge a ratio on a shared machine (edgebench.testing.verdict)."""

from __future__ import annotations

import os

import pytest

from edgebench.testing.verdict import Rounds, Side, judge, judge_band, until_conclusive

BAND = (0.85, 1.15, 2.0)


def rounds_of(ours: list[float], reference: list[float], quiet: bool = True) -> Rounds:
    rounds = Rounds()
    for o, r in zip(ours, reference, strict=True):
        rounds.add(o, r, quiet)
    return rounds


def test_a_slow_stretch_covering_one_side_of_a_round_does_not_fail_a_sound_harness() -> None:
    # The per-round ratios one CI run printed: 0.949 .. 1.341 .. 0.673, both sides' CVs steady throughout.
    ratios = [0.949, 0.909, 1.015, 1.341, 1.341, 1.073, 1.043, 0.673, 1.065, 0.999]
    reference = [3.83, 3.80, 3.85, 3.82, 3.81, 3.84, 3.86, 5.70, 3.83, 3.82]
    verdict = judge_band(
        "convnet", rounds_of([r * b for r, b in zip(ratios, reference, strict=True)], reference), *BAND
    )
    assert verdict.outcome == "pass", verdict.reason


def test_one_lucky_round_of_the_reference_does_not_fail_a_sound_harness() -> None:
    # What a CI run printed for MNN convnet: the bare loop's first round at 6.1 ms, its nine others at
    # 7.3; each side's single fastest round read 1.21 where every round but the first read 0.98-1.16.
    ratios = [1.434, 1.033, 1.032, 1.024, 1.078, 1.004, 0.997, 1.024, 0.983, 1.160]
    reference = [6.1, 7.3, 7.32, 7.28, 7.35, 7.31, 7.3, 7.33, 7.29, 7.34]
    ours = [r * b for r, b in zip(ratios, reference, strict=True)]
    verdict = judge_band("mnn convnet", rounds_of(ours, reference), *BAND)
    assert verdict.outcome == "pass", verdict.reason
    assert verdict.ratio == pytest.approx(sorted(ours)[2] / sorted(reference)[2])


def test_a_harness_slower_in_every_round_fails_on_a_quiet_machine() -> None:
    reference = [3.8, 3.9, 4.4, 3.85, 5.0]
    verdict = judge_band("convnet", rounds_of([r * 1.25 for r in reference], reference), *BAND)
    assert verdict.outcome == "fail" and "out of band on a quiet machine" in verdict.reason


def test_out_of_band_without_quiet_rounds_asks_for_more_but_broken_fails_whatever_the_load() -> None:
    reference = [3.8, 3.9, 4.4]
    assert (
        judge_band("x", rounds_of([r * 1.25 for r in reference], reference, quiet=False), *BAND).outcome
        == "more"
    )
    broken = judge_band("x", rounds_of([r * 100 for r in reference], reference, quiet=False), *BAND)
    assert broken.outcome == "fail" and "broken" in broken.reason


def test_a_probe_is_judged_on_quiet_trials_when_both_sides_have_them() -> None:
    probe, reference = Side(), Side()
    for _ in range(3):
        probe.add(0.9, 0.95)
        probe.add(2.0, 0.40)  # disturbed: not like with like
        reference.add(1.0, 0.97)
    verdict = judge("int8", probe, reference, bound=0.95, broken=0.5)
    assert verdict.outcome == "fail" and verdict.basis == "quiet trials"


def test_one_lucky_reference_trial_does_not_make_a_sound_probe_broken() -> None:
    # Beside two busy loops: the probe's quiet-looking trials at ~1150 GOPS, one reference trial at 3000.
    probe, reference = Side(), Side()
    for v in (1.15, 1.12, 1.10, 1.08):
        probe.add(v, 0.9)
        reference.add(v * 1.01, 0.9)
    reference.add(3.0, 0.9)
    verdict = judge("int8 threads=2", probe, reference, bound=0.95, broken=0.5)
    assert verdict.outcome == "pass", verdict.reason


def test_a_side_with_fewer_than_three_quiet_trials_is_not_judged_as_quiet() -> None:
    probe, reference = Side(), Side()
    for v in (1.0, 0.98, 0.97):
        probe.add(v, 0.5)
        reference.add(v, 0.5)
    probe.add(0.6, 0.9)
    reference.add(1.0, 0.9)
    verdict = judge("x", probe, reference, bound=0.95, broken=0.5)
    assert verdict.basis.startswith("disturbed") and verdict.outcome == "pass"


def test_trials_taken_while_other_work_ran_are_never_quiet_whatever_their_own_share() -> None:
    # Beside two busy loops: the probe's spinning 2-thread pool read share 0.97 at 40% of the rate, while
    # the reference caught a stretch with both CPUs; judged "over quiet trials" that failed a sound probe.
    probe, reference = Side(), Side()
    for _ in range(3):
        probe.add(0.35, 0.97, machine_quiet=False)
        reference.add(0.80, 1.01, machine_quiet=False)
    verdict = judge("int8 threads=2", probe, reference, bound=0.85, broken=0.4)
    assert verdict.basis.startswith("disturbed") and verdict.outcome == "more", verdict.reason
    assert probe.quiet_trials() == 0 and probe.best(quiet=False) == 0.35


def test_over_disturbed_trials_a_probe_is_broken_only_when_its_median_is_too() -> None:
    # Beside two busy loops: the reference caught stretches with both CPUs, the probe never did; their
    # medians agreed. A probe 4x slower throughout is broken all the same.
    reference = Side()
    for v in (0.84, 0.83, 0.82, *[0.30] * 27):
        reference.add(v, 1.0, machine_quiet=False)
    sound, slow = Side(), Side()
    for v in (0.31, *[0.30] * 29):
        sound.add(v, 1.0, machine_quiet=False)
        slow.add(v / 4, 1.0, machine_quiet=False)
    assert judge("sound", sound, reference, bound=0.85, broken=0.4).outcome == "more"
    assert judge("sound", sound, reference, bound=0.85, broken=0.4, final=True).outcome == "pass"
    verdict = judge("slow", slow, reference, bound=0.85, broken=0.4)
    assert verdict.outcome == "fail" and "broken" in verdict.reason


def test_others_watch_sees_a_process_it_does_not_own_and_not_its_own_waited_children() -> None:
    import subprocess
    import sys
    import time

    from edgebench.testing.verdict import OthersWatch

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with OthersWatch() as watch:  # the busy child is not waited for inside: it is other work
            time.sleep(1.0)
    finally:
        busy.kill()
        busy.wait()
    assert watch.others_share >= 0.5 / (os.cpu_count() or 1) and not watch.quiet


def test_others_watch_counts_the_trees_it_is_given_as_its_own() -> None:
    """An emulated phone's adbd runs the measured commands and reaps them itself: given its pid, the
    watch counts its whole tree (a busy grandchild included) as this process's own work."""
    import subprocess
    import sys
    import time

    from edgebench.testing.verdict import OthersWatch, _tree_cpu_seconds

    # a parent that starts a busy grandchild and waits for it, as adbd's sandbox waits for a command
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(0.3)  # the grandchild is running
        tree0, t0 = _tree_cpu_seconds([parent.pid]), time.monotonic()
        with OthersWatch() as blind, OthersWatch(trees=[parent.pid]) as told:
            time.sleep(1.0)
        tree = (_tree_cpu_seconds([parent.pid]) - tree0) / ((time.monotonic() - t0) * (os.cpu_count() or 1))
    finally:
        os.killpg(parent.pid, 9)  # the grandchild with it
        parent.wait()
    # What the tree got, read from /proc beside the watches: on a loaded machine the busy grandchild gets
    # less than a CPU, so the difference between the watches is held to what it got, not to a CPU.
    assert tree > 0.05 / (os.cpu_count() or 1)
    assert blind.others_share >= 0.8 * tree  # the grandchild is other work to a watch not told
    assert blind.others_share - told.others_share == pytest.approx(tree, abs=0.1)  # and its own to one told


def test_a_probe_reading_twice_its_reference_fails_quiet_or_not() -> None:
    """An upper bound: a TOPS figure with its operations counted twice reads 2x the reference."""
    for quiet in (True, False):
        probe, reference = Side(), Side()
        for v in (1.0, 0.98, 0.97, 0.99):
            probe.add(2 * v, 1.0, machine_quiet=quiet)
            reference.add(v, 1.0, machine_quiet=quiet)
        verdict = judge("fp32", probe, reference, bound=0.85, broken=0.4)
        assert verdict.outcome == "fail" and "more than the machine does" in verdict.reason
        assert verdict.ratio == pytest.approx(2.0, rel=0.05)


def test_one_lucky_probe_trial_over_a_loaded_reference_is_no_over_report() -> None:
    probe, reference = Side(), Side()
    for v in (1.0, 0.6, 0.55, 0.5):
        reference.add(v, 0.6, machine_quiet=False)
        probe.add(v, 0.6, machine_quiet=False)
    probe.add(2.5, 1.0, machine_quiet=False)  # one stretch with every CPU: not what it always reads
    assert judge("x", probe, reference, bound=0.85, broken=0.4).outcome == "pass"


def test_a_fast_stretch_of_the_probe_over_a_slow_reference_process_under_load_is_no_over_report() -> None:
    """Never quiet: the reference's process ran slow throughout, the probe's caught a fast stretch for
    three trials; their medians agree, so the 1.8x of the third best is the load's, not a miscount."""
    probe, reference = Side(), Side()
    for v in (0.5, 0.52, 0.55, 0.5, 0.48):
        reference.add(v, 0.6, machine_quiet=False)
    for v in (0.99, 0.95, 0.94, 0.5, 0.48, 0.47, 0.5, 0.49, 0.51):
        probe.add(v, 0.6, machine_quiet=False)
    verdict = judge("x", probe, reference, bound=0.85, broken=0.4)
    assert verdict.outcome == "pass", verdict.reason


def test_under_load_the_final_verdict_is_pass_or_fail_on_rates_per_cpu_second() -> None:
    """Never quiet: a sound probe preempted more often than its reference passes on what it did per
    CPU-second; a probe half as fast per CPU-second (an emulated dtype) fails, though its wall rates
    stayed over `broken`."""
    reference, sound, slow = Side(), Side(), Side()
    for v in (0.9, 0.8, 0.85, 0.7, 0.75):
        reference.add(v, 0.9, machine_quiet=False)
        sound.add(v * 0.6, 0.55, machine_quiet=False)  # wall rate 0.6 of the reference, CPU share 0.6 of it
        slow.add(v * 0.5, 0.9, machine_quiet=False)  # the same CPUs, half the work
    assert judge("sound", sound, reference, 0.85, 0.4).outcome == "more"
    passed = judge("sound", sound, reference, 0.85, 0.4, final=True)
    assert passed.outcome == "pass" and passed.ratio == pytest.approx(0.6 * 0.9 / 0.55, rel=0.02)
    failed = judge("slow", slow, reference, 0.85, 0.4, final=True)
    assert failed.outcome == "fail" and "short under load" in failed.reason


def test_band_under_load_settles_on_the_median_of_interleaved_rounds() -> None:
    reference = [3.8, 5.9, 4.4, 7.0, 4.1, 6.2]
    close = rounds_of([r * s for r, s in zip(reference, (1.3, 0.8, 1.1, 1.0, 1.2, 0.9), strict=True)],
                      reference, quiet=False)  # fmt: skip
    assert judge_band("x", close, 0.95, 1.05, 2.0).outcome == "more"
    assert judge_band("x", close, 0.95, 1.05, 2.0, final=True).outcome == "pass"
    slow = rounds_of([r * 1.6 for r in reference], reference, quiet=False)
    verdict = judge_band("x", slow, 0.85, 1.15, 2.0, final=True)
    assert verdict.outcome == "fail" and "out of band under load" in verdict.reason
    fast = rounds_of([r / 1.6 for r in reference], reference, quiet=False)
    assert judge_band("x", fast, 0.85, 1.15, 2.0, final=True).outcome == "fail"


def test_until_conclusive_measures_more_rounds_then_settles_within_its_budget() -> None:
    now = [0.0]
    calls: list[bool] = []

    def one_round() -> None:
        now[0] += 10.0

    def verdict(final: bool):  # type: ignore[no-untyped-def]
        calls.append(final)
        return judge_band("x", rounds_of([1.3] * 3, [1.0] * 3, quiet=False), *BAND, final=final)

    found, rounds = until_conclusive(one_round, verdict, budget_s=45.0, min_rounds=2, clock=lambda: now[0])
    # rounds at 10, 20, 30, 40 s: a fifth would end past 45 s
    assert rounds == 4 and calls[-1] is True and calls.count(True) == 1
    assert found.outcome == "pass"  # median 1.3 within the loaded band


def test_until_conclusive_stops_as_soon_as_the_verdict_is_conclusive() -> None:
    seen: list[int] = []
    found, rounds = until_conclusive(
        lambda: seen.append(1),
        lambda final: judge_band("x", rounds_of([1.0] * 3, [1.0] * 3), *BAND, final=final),
        budget_s=1e9,
        min_rounds=3,
    )
    assert found.outcome == "pass" and rounds == 3 == len(seen)
