"""How a benchmark reaches a verdict on a ratio against its reference on a machine it shares with other work.

Both sides record, per trial, the CPU share they got (process CPU time over wall time x threads; the
runtimes and kernels measured keep their CPUs busy, so an undisturbed trial is close to 1). A ratio over
trials that both got their CPUs is like with like and is held to the bound. A ratio is held on both sides:
under `bound` the probe falls short, over `high` it reads more than its reference can do (a figure
computed wrong, e.g. twice the operations counted).

A machine is never quiet, so no verdict is a skip. While the evidence is not conclusive the verdict is
"more" and the benchmark measures more interleaved rounds (`until_conclusive`, within a time budget); at
the end of the budget (`final=True`) a disturbed comparison is settled by figures load does not move:
each side's rate per CPU-second it actually ran (preemption takes wall time, not CPU time) and the medians
of interleaved rounds (both sides met the same load), against bounds set above the documented noise
(two processes on the same model differ by up to ~10%, GEMM rates swing up to 2x for seconds) and under
the defects they exist to catch (2x and more).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from edgebench.agent.timing import busy_cpu_seconds
from edgebench.stats import corroborated_ratio

QUIET_SHARE = 0.85
# A trial that used more CPUs than it asked for (a runtime ignoring its thread count) is not like with like
# either: quiet means within these bounds.
MAX_SHARE = 1.15
# The probe's best trial is held to a figure its reference reached several times: beside two busy loops a
# sound int8 probe was called broken at 0.38 "over quiet trials", each side's figure being one trial (a
# quiet 2-thread trial reaches about twice a disturbed one, and one lucky trial on one side decided it).
CORROBORATED = 3


# A probe whose figure exceeds what its reference reached (its third best against the reference's very
# best) by this much reads more than the machine does: a figure computed wrong. Well above the noise of
# like-with-like sides (10%, and the reference's best trial is taken), under the 2x of a doubled count.
HIGH = 1.6
# Under load, at the end of the budget: the probe's rate per CPU-second against the reference's (medians).
# Preemption does not move it, contention for caches and memory moves both sides; a kernel half as fast per
# CPU (an emulated dtype, a wrong path) reads 0.5 and under.
LOADED_CPU_BOUND = 0.7
# Latency ratios under load: the median of the interleaved rounds' ratios within this factor of 1 (two
# processes on one model differ by up to ~10%; a harness 2x off is a defect).
LOADED_BAND = 1.4
LOADED_BASIS = "median of interleaved rounds under load"


@dataclass
class Side:
    """Every trial of one side: (value, CPU share, whether the rest of the machine was idle meanwhile);
    larger values are better."""

    trials: list[tuple[float, float, bool]] = field(default_factory=list)

    def add(self, value: float, share: float, machine_quiet: bool = True) -> None:
        """Record one trial. `machine_quiet` False (other processes took the machine meanwhile,
        `OthersWatch`) makes the trial disturbed whatever its own share: a runtime's pool that spins
        while its other thread waits for a CPU reads busy (2-thread int8 GEMMs beside two busy loops:
        share 0.97 at 40% of the rate)."""
        self.trials.append((value, share, machine_quiet))

    def best(self, quiet: bool) -> float:
        """The best trial: what the side does when nothing disturbs it (load only ever slows it)."""
        return self._ranked(quiet, 1)[0]

    def corroborated(self, quiet: bool) -> float:
        """The best figure at least CORROBORATED trials reached (the best when there are fewer)."""
        return self._ranked(quiet, CORROBORATED)[0]

    def median(self) -> float:
        """The median over every trial: the rate a side sustains under the load it met."""
        return _median([v for v, _, _ in self.trials])

    def cpu_median(self) -> float:
        """The median rate per CPU-second the side actually ran (value / CPU share): what preemption
        does not move, since a preempted side accrues no CPU time."""
        return _median([v / share for v, share, _ in self.trials if share > 0])

    def best_share(self, quiet: bool) -> float:
        """The CPU share of the best trial."""
        return self._ranked(quiet, 1)[1]

    def quiet_trials(self) -> int:
        """How many trials got their CPUs while the rest of the machine was idle."""
        return sum(1 for _, share, machine in self.trials if machine and is_quiet(share))

    def _ranked(self, quiet: bool, rank: int) -> tuple[float, float]:
        trials = sorted(
            ((v, share) for v, share, machine in self.trials if not quiet or (machine and is_quiet(share))),
            reverse=True,
        )
        return trials[min(len(trials), rank) - 1] if trials else (0.0, 0.0)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def is_quiet(share: float) -> bool:
    """True when a trial got about the CPUs it asked for, no fewer and no more."""
    return QUIET_SHARE <= share <= MAX_SHARE


@dataclass(frozen=True)
class Verdict:
    """`outcome` is pass, fail or more (not conclusive yet: measure more rounds; never returned by a final
    verdict); `ratio` the figure judged; `basis` which trials it came from."""

    outcome: str
    ratio: float
    basis: str
    reason: str


def compare(probe: Side, reference: Side, steady: bool = True) -> tuple[float, bool]:
    """The probe's best over the reference's corroborated figure, over quiet trials when both sides have
    CORROBORATED of them (True), else over all (False).
    `steady` False says the machine was disturbed in a way CPU shares cannot see (e.g. memory traffic)."""
    if steady and min(probe.quiet_trials(), reference.quiet_trials()) >= CORROBORATED:
        return probe.best(True) / reference.corroborated(True), True
    return probe.best(False) / max(reference.corroborated(False), 1e-12), False


def judge(
    name: str,
    probe: Side,
    reference: Side,
    bound: float,
    broken: float,
    steady: bool = True,
    high: float = HIGH,
    final: bool = False,
) -> Verdict:
    """The verdict on bound <= probe / reference <= high: pass, fail, or more while not conclusive.

    Over the bound: the probe's corroborated figure against the reference's best, over every trial (load
    only slows a side, so that is the most the reference did). Under the bound over quiet trials: a
    shortfall. Under `broken` a defect whatever the load, when the medians' ratio is under it too: beside
    two busy loops the reference in one process caught stretches with both CPUs (int8 2 threads: 844 GOPS,
    three trials) that the probe, another process, never did (423 at best), while their medians agreed
    (about 300 each). Otherwise, over disturbed trials only, "more"; `final` settles it on figures load
    does not move: the medians' rates per CPU-second held to LOADED_CPU_BOUND, and the medians' wall
    rates held to `broken`."""
    ratio, quiet = compare(probe, reference, steady)
    basis = "quiet trials" if quiet else "disturbed trials only (the machine was never quiet)"
    text = f"{name}: ratio {ratio:.3f} over {basis} (bound {bound}..{high}, broken under {broken})"
    over = probe.corroborated(False) / max(reference.best(False), 1e-12)
    typical = probe.median() / max(reference.median(), 1e-12)
    # Over `high` on disturbed trials alone, one fast stretch of the probe's process against a slow one
    # of the reference's: a defect only when the medians say so too (a doubled count doubles them).
    if over > high and (quiet or typical > high):
        return Verdict("fail", over, basis, f"{text}: the probe's third best reads {over:.3f} of the "
                       "reference's best: more than the machine does")  # fmt: skip
    if ratio >= bound:
        return Verdict("pass", ratio, basis, text)
    if ratio < broken and (quiet or typical < broken):
        return Verdict("fail", ratio, basis, f"{text}: the probe is broken")
    if quiet:
        return Verdict("fail", ratio, basis, f"{text}: short on a quiet machine")
    trials = f"{probe.quiet_trials()} quiet probe trials, {reference.quiet_trials()} quiet reference trials"
    if not final:
        return Verdict("more", ratio, basis, f"{text}: not conclusive yet ({trials})")
    per_cpu = probe.cpu_median() / max(reference.cpu_median(), 1e-12)
    loaded = (
        f"{text}; under load ({trials}): per CPU-second {per_cpu:.3f} (bound {LOADED_CPU_BOUND}), "
        f"medians {typical:.3f} (bound {broken})"
    )
    if per_cpu >= LOADED_CPU_BOUND and typical >= broken:
        return Verdict("pass", per_cpu, "rates per CPU-second under load", loaded)
    return Verdict("fail", per_cpu, "rates per CPU-second under load", f"{loaded}: short under load")


def until_conclusive(
    one_round: Callable[[], object],
    verdict: Callable[[bool], Verdict],
    budget_s: float,
    min_rounds: int = 1,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Verdict, int]:
    """Run rounds until `verdict(final=False)` is conclusive, or until another round would overrun
    `budget_s` seconds; then `verdict(final=True)`. Returns the verdict and the rounds run.

    `one_round` alternates both sides once, so load drifting over the budget meets both alike; with
    `min_rounds` 0 the rounds already measured are judged first."""
    start, rounds = clock(), 0
    while True:
        if rounds >= min_rounds:
            found = verdict(False)
            if found.outcome != "more":
                return found, rounds
            spent = clock() - start
            if rounds and spent + spent / rounds > budget_s:
                return verdict(True), rounds
        one_round()
        rounds += 1


@dataclass
class Rounds:
    """Per round: both sides' latency (smaller is better) and whether the round was quiet (both sides'
    back-to-back runs steady: robust CV under QUIET_CV)."""

    ours: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    quiet: list[bool] = field(default_factory=list)

    def add(self, ours: float, reference: float, quiet: bool) -> None:
        """Record one round of both sides."""
        self.ours.append(ours)
        self.reference.append(reference)
        self.quiet.append(quiet)

    @property
    def ratios(self) -> list[float]:
        """Each round's ours / reference."""
        return [o / r for o, r in zip(self.ours, self.reference, strict=True)]

    def best_ratio(self) -> float:
        """Each side's corroborated fastest round against the other's (edgebench.stats)."""
        return corroborated_ratio(self.ours, self.reference)

    def median_ratio(self) -> float:
        """The median of the rounds' ratios: both sides of a round met the same load."""
        return _median(self.ratios)


QUIET_CV = 0.05  # the doctor's noise bound
QUIET_ROUNDS = 3


def steady(values: list[float], within: float = 0.10, rounds: int = 3) -> bool:
    """A reference measured in rounds is steady when at least `rounds` of them lie within `within` of its
    best: the machine gave it the same resources more than once."""
    best = max(values, default=0.0)
    return best > 0 and sum(1 for v in values if v >= best * (1 - within)) >= rounds


def robust_cv(values: list[float]) -> float:
    """MAD x 1.4826 over the median: the spread of the bulk of back-to-back runs, outliers aside."""
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    mad = sorted(abs(v - median) for v in values)[len(values) // 2]
    return 1.4826 * mad / median if median else 0.0


def judge_band(
    name: str,
    rounds: Rounds,
    low: float,
    high: float,
    broken: float,
    final: bool = False,
    loaded: float = LOADED_BAND,
) -> Verdict:
    """The verdict on a latency ratio that must lie in [low, high]: pass, fail, or more while not
    conclusive; beyond `broken` times off it is a defect. Out of band fails when enough rounds were quiet
    to make it like with like; without them the final verdict holds the median of the rounds' ratios
    within `loaded` times of 1."""
    quiet = sum(rounds.quiet) >= QUIET_ROUNDS
    ratio = rounds.best_ratio()
    basis = (
        f"corroborated fastest of {len(rounds.ours)} rounds a side, {sum(rounds.quiet)} quiet"
        if quiet
        else f"corroborated fastest of {len(rounds.ours)} rounds a side, the machine never quiet"
    )
    text = f"{name}: ratio {ratio:.3f} over {basis} (band {low}..{high}, broken beyond {broken}x)"
    return band_verdict(text, ratio, basis, quiet, low, high, broken, final, rounds.median_ratio(), loaded)


def band_verdict(
    text: str,
    ratio: float,
    basis: str,
    quiet: bool,
    low: float,
    high: float,
    broken: float,
    final: bool = False,
    typical: float | None = None,
    loaded: float = LOADED_BAND,
) -> Verdict:
    """In [low, high]: pass. Beyond `broken` times off: a defect whatever the load. Out of band otherwise:
    a failure when the ratio was judged over quiet rounds; else more rounds, and at the end (`final`) the
    `typical` ratio (the rounds' median, `ratio` when not given) held within `loaded` times of 1."""
    if low <= ratio <= high:
        return Verdict("pass", ratio, basis, text)
    if ratio > broken or ratio < 1.0 / broken:
        return Verdict("fail", ratio, basis, f"{text}: the harness is broken")
    if quiet:
        return Verdict("fail", ratio, basis, f"{text}: out of band on a quiet machine")
    if not final:
        return Verdict("more", ratio, basis, f"{text}: not conclusive yet")
    typical = ratio if typical is None else typical
    loaded_text = (
        f"{text}; under load the rounds' median ratio {typical:.3f} (band {1 / loaded:.2f}..{loaded})"
    )
    if 1.0 / loaded <= typical <= loaded:
        return Verdict("pass", typical, LOADED_BASIS, loaded_text)
    return Verdict("fail", typical, LOADED_BASIS, f"{loaded_text}: out of band under load")


def _busy_cpu_seconds() -> float:
    """CPU seconds every process of the machine has used (the agent's own /proc/stat reader)."""
    busy = busy_cpu_seconds(None)
    if busy is None:
        raise OSError("/proc/stat cannot be read")
    return busy


def _own_cpu_seconds() -> float:
    """This process's CPU seconds and those of its children it has waited for (theirs included)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and of the children it has reaped), from /proc."""
    tick, table = os.sysconf("SC_CLK_TCK"), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # after the command: state, ppid, ..., utime (14th field of stat), stime, cutime, cstime
        table[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / tick)
    return table


def _tree_cpu_seconds(roots: Sequence[int]) -> float:
    """CPU seconds of live processes and their live descendants, with what each has reaped of theirs."""
    table, total = _process_table(), 0.0
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        total += table[pid][1]
        todo.extend(children.get(pid, ()))
    return total


class OthersWatch:
    """How much of the machine processes other than this one and its children took over a stretch:
    `others_share` (0 = nothing else ran, 1 = every CPU busy with other work). CPU shares of the measured
    side cannot see that when the runtimes differ in how they wait (an OpenMP pool spinning on a CPU it
    shares reads busy while it makes no progress); the machine's own counters can.

    `trees`: live processes that run the measured work too (an emulated phone's adbd, whose commands it
    reaps itself, not this process): their process trees count as this process's own."""

    def __init__(self, trees: Sequence[int] = ()) -> None:
        self.trees = tuple(trees)
        self.others_share = 0.0

    def _own(self) -> float:
        return _own_cpu_seconds() + (_tree_cpu_seconds(self.trees) if self.trees else 0.0)

    def __enter__(self) -> OthersWatch:
        self._t, self._busy, self._own0 = time.monotonic(), _busy_cpu_seconds(), self._own()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.monotonic() - self._t, 1e-9) * (os.cpu_count() or 1)
        others = (_busy_cpu_seconds() - self._busy) - (self._own() - self._own0)
        self.others_share = max(0.0, others) / wall

    @property
    def quiet(self) -> bool:
        return self.others_share < OTHERS_QUIET


OTHERS_QUIET = 0.15  # other work took under 15% of the machine
