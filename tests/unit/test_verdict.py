"""How the benchmarks judge a ratio on a shared machine (edgebench.testing.verdict)."""

from __future__ import annotations

import os

import pytest

from edgebench.testing.verdict import Rounds, Side, judge, judge_band

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


def test_out_of_band_without_quiet_rounds_is_skipped_but_broken_fails_whatever_the_load() -> None:
    reference = [3.8, 3.9, 4.4]
    assert (
        judge_band("x", rounds_of([r * 1.25 for r in reference], reference, quiet=False), *BAND).outcome
        == "skip"
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
    assert verdict.basis.startswith("disturbed") and verdict.outcome == "skip", verdict.reason
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
    assert judge("sound", sound, reference, bound=0.85, broken=0.4).outcome == "skip"
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

    from edgebench.testing.verdict import OthersWatch

    # a parent that starts a busy grandchild and waits for it, as adbd's sandbox waits for a command
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(0.3)  # the grandchild is running
        with OthersWatch() as blind, OthersWatch(trees=[parent.pid]) as told:
            time.sleep(1.0)
    finally:
        os.killpg(parent.pid, 9)  # the grandchild with it
        parent.wait()
    one_cpu = 1.0 / (os.cpu_count() or 1)
    assert blind.others_share >= 0.5 * one_cpu  # the grandchild is other work to a watch not told
    assert told.others_share <= blind.others_share - 0.5 * one_cpu  # and its own to one told
