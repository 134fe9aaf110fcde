"""The bandwidth probe's triad against a small C STREAM triad compiled here with gcc (OpenMP, the same array
size, thread count and CPUs), alternated round by round in one pytest-benchmark run.

The probe's triad must reach 0.9 of the C triad's best at every thread count. With a C compiler on the
device (gcc here, which this test needs anyway) the agent builds its own fused loop and calls it from its
pinned worker threads, so it must reach the reference; the numpy fallbacks (memmove + daxpy, two passes
per block) read 0.82-0.93 of C on both cores and are checked for correctness in the unit tests, not here.
Both sides report the CPU share of their best trial; a shortfall is re-measured (both sides, more
rounds while they fit in BUDGET_S), then judged like with like (edgebench.testing.verdict): over quiet
trials it fails, far under the bound it fails whatever the load, over the reference's best by 1.6x it
fails (a figure counted wrong), and over disturbed trials only the final verdict holds the rates per
CPU-second (passive OpenMP waits: CPU time counts work) to 0.7 and the medians to BROKEN: pass or fail. Memory traffic of other work does not show in CPU shares, so the machine also counts as
disturbed unless the C triad's round bests agree (three within 10% of its best). The probe's other
kernels are printed beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edgebench.agent.bandwidth import last_level_cache
from edgebench.descriptors import builtin_local
from edgebench.execution.oneshot import run_now
from edgebench.jobs import Job
from edgebench.testing.verdict import Side, Verdict, judge, steady, until_conclusive

ROUNDS = 5
BUDGET_S = 60.0  # more rounds, while another fits, when the first ROUNDS are not conclusive
BOUND = 0.9  # one core
MULTI_CORE_BOUND = 0.9  # the compiled loop moves what the C triad moves at any thread count
BROKEN = 0.45  # a shared machine halves a rate for seconds (two threads: the GIL holder preempted); further off is a defect
TRIALS = 10
KERNELS = ("triad",)  # the one the C triad is the reference for
THREADS = (1, 2)
MIB = 2**20

TRIAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
/* CPU seconds of the team's threads, each read from its own clock (the process clock adds the other
   threads' time as last accounted at a scheduler tick: over one short trial it reads 0.5 or 1.7). */
static double team_cpu_s(void) {
    double total = 0.0;
    #pragma omp parallel reduction(+ : total)
    total += clock_s(CLOCK_THREAD_CPUTIME_ID);
    return total;
}
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    int trials = atoi(argv[2]);
    double *a = aligned_alloc(64, n * sizeof(double)), *b = aligned_alloc(64, n * sizeof(double)),
           *c = aligned_alloc(64, n * sizeof(double));
    const double s = 3.0;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.5; }
    double best = 1e30, best_cpu = 0.0;
    for (int t = 0; t <= trials; t++) {   /* the first trial is a warm-up, as in STREAM */
        double c0 = team_cpu_s(), t0 = clock_s(CLOCK_MONOTONIC);
        #pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        double dt = clock_s(CLOCK_MONOTONIC) - t0, cpu = team_cpu_s() - c0;
        if (t > 0 && dt < best) { best = dt; best_cpu = cpu; }
    }
    printf("%.9f %.9f\n", best, best_cpu);
    return a[n / 2] != 3.5;
}
"""


@pytest.fixture(scope="module")
def c_triad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    folder = tmp_path_factory.mktemp("stream")
    source, binary = folder / "triad.c", folder / "triad"
    source.write_text(TRIAD_C)
    for flags in (["-O3", "-march=native"], ["-O3"]):
        res = subprocess.run(
            [gcc, *flags, "-fopenmp", str(source), "-o", str(binary)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if res.returncode == 0:
            return binary
    pytest.skip(f"gcc could not build the C triad: {res.stderr.strip()[:200]}")


def array_bytes() -> int:
    """4x the last-level cache (STREAM's rule), capped so the test stays quick: sysfs in this pool's VMs
    claims 300-480 MiB of L3 while the measured curve (`probe bandwidth --sweep`) reaches its DRAM plateau
    past ~55 MiB, so 192 MiB arrays are well out of any cache the VM really has."""
    llc = last_level_cache() or 32 * MIB
    return min(4 * llc, 192 * MIB)


def bound(threads: int) -> float:
    return BOUND if threads == 1 else MULTI_CORE_BOUND


def c_triad_run(binary: Path, elements: int, cpus: list[int]) -> tuple[float, float]:
    """(GB/s, CPU share) of the C triad's best trial."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(len(cpus)),
        "OMP_PROC_BIND": "true",
        "GOMP_CPU_AFFINITY": " ".join(map(str, cpus)),
        "OMP_WAIT_POLICY": "passive",  # idle OpenMP threads sleep: CPU time counts work, as in the agent
    }
    res = subprocess.run(
        ["taskset", "-c", ",".join(map(str, cpus)), str(binary), str(elements), str(TRIALS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        start_new_session=True,  # as the agent runs (README: agents and references in their own session)
    )
    assert res.returncode == 0, res.stderr
    wall, cpu = (float(v) for v in res.stdout.split())
    return 24 * elements / wall / 1e9, cpu / (wall * len(cpus))


def probe_run(nbytes: int, cpus: list[int]) -> dict[str, tuple[float, float]]:
    """Per kernel: (best GB/s, CPU share of that trial) from the probe's records."""
    job = Job(
        "local",
        "bandwidth",
        params={
            "kernel": list(KERNELS),
            "threads": len(cpus),
            "affinity": cpus,
            "array_mb": nbytes / MIB,
            "trials": TRIALS,
        },
    )
    shot = run_now(builtin_local(), [job], None, "bandwidth")
    shot.raise_first_error()
    paths = {r.annotations.get("path") for r in shot.records if r.metric == "bandwidth_gbps"}
    # gcc is here (the fixture needs it), so the agent builds its fused loop
    assert all(str(p).startswith("compiled C loop") for p in paths), paths
    return {
        r.params["kernel"]: (r.value, r.annotations.get("cpu_share", 0.0))
        for r in shot.records
        if r.metric == "bandwidth_gbps" and r.params["stat"] == "best"
    }


def test_triad_reaches_the_c_stream_triad(benchmark, c_triad: Path) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    allowed = sorted(os.sched_getaffinity(0))
    nbytes = array_bytes()
    elements = nbytes // 8
    counts = [t for t in THREADS if t <= len(allowed)]
    probe = {t: {k: Side() for k in KERNELS} for t in counts}
    c = {t: Side() for t in counts}
    c_rounds: dict[int, list[float]] = {t: [] for t in counts}

    def one_round(todo: list[int]) -> None:
        for threads in todo:
            cpus = allowed[:threads]
            for kernel, (gbps, share) in probe_run(nbytes, cpus).items():
                probe[threads][kernel].add(gbps, share)
            gbps, share = c_triad_run(c_triad, elements, cpus)
            c[threads].add(gbps, share)
            c_rounds[threads].append(gbps)

    def verdicts(final: bool = False) -> dict[int, Verdict]:
        return {
            t: judge(
                f"triad threads={t}",
                probe[t]["triad"],
                c[t],
                bound(t),
                BROKEN,
                steady(c_rounds[t]),
                final=final,
            )
            for t in counts
        }

    def overall(final: bool) -> Verdict:
        """The worst thread count's verdict; a shortfall is re-measured while the budget lasts (memory
        traffic of other work does not show in CPU shares)."""
        worst = min(verdicts(final).values(), key=lambda v: ("fail", "more", "pass").index(v.outcome))
        return worst if final or worst.outcome == "pass" else Verdict("more", worst.ratio, worst.basis, "")

    def open_round() -> None:
        one_round([t for t, v in verdicts().items() if v.outcome != "pass"])

    benchmark.pedantic(lambda: one_round(counts), rounds=ROUNDS, iterations=1, warmup_rounds=0)
    _, extra = until_conclusive(open_round, overall, BUDGET_S, min_rounds=0)
    final = verdicts(final=True)
    print(f"\n{ROUNDS} rounds, {extra} more to re-measure a shortfall; {nbytes // MIB} MiB arrays")
    for t in counts:
        kernels = ", ".join(f"{k} {s.best(False):.2f}" for k, s in probe[t].items())
        spread = ", ".join(f"{v:.1f}" for v in c_rounds[t])
        print(
            f"threads={t}: probe {kernels} GB/s; C triad {c[t].corroborated(False):.2f} GB/s (rounds {spread}); {final[t].reason}"
        )
    benchmark.extra_info.update(
        {"array_bytes": nbytes, "ratio": {t: v.ratio for t, v in final.items()}, "extra_rounds": extra}
    )
    failed = [v.reason for v in final.values() if v.outcome != "pass"]
    assert not failed, failed
