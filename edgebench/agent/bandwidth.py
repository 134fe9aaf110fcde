"""Task `bandwidth`: STREAM-style read, copy and triad over float64 arrays far larger than the last cache.

Byte counting follows STREAM: `read` counts 8·N bytes (one array read), `copy` 16·N (read a, write c) and
`triad` 24·N (read b and c, write a). Write-allocate traffic is NOT counted, as in STREAM: an ordinary store
to a line that is not cached first reads that line, so the memory really moves 32·N bytes for triad and
24·N for a copy with ordinary stores. libc's memcpy switches to non-temporal stores for large copies, which
skip the write-allocate read, so `copy` can report more GB/s than `triad` on the same memory.

The work is split across Python threads (numpy ufuncs and ctypes calls release the GIL), each pinned to its
own CPU and handling one contiguous slice. Triad takes the first path the device has (`triad_path` picks
one outright): (1) STREAM's own loop `a[i] = b[i] + s * c[i]`, compiled on the device where it has a C
compiler (native.py) and called once per slice: one fused pass, as the C triad makes; (2) without a
compiler, block by block in place, the block of `a` small enough to stay in L2 between two passes, so
memory sees what the C loop moves (b and c read once, a written once): libc's memmove (a = b) and the
BLAS numpy links, daxpy (a += s * c), through ctypes (no GIL held, one BLAS thread per worker); (3)
without a BLAS, numpy's `a = c * s` then `a += b`. Against a gcc-compiled OpenMP triad on the same arrays
and CPUs: the compiled loop 1.00-1.06 at 1 thread and 0.92-1.02 at 2 (quiet rounds of a 2-core EPYC VM);
memmove + daxpy 0.92-0.95 on one core but 0.82-0.93 on two (the two passes cost once the cores saturate
memory; worker processes without a shared GIL read the same), numpy in place 0.82-0.84, numpy through a
temporary block 0.72-0.74 (a naive `a = b + s * c` makes five passes). The record says which path ran.
Arrays are at least 4x the total last-level cache (STREAM's rule), from sysfs unless the task overrides it.

The memory-hierarchy sweep (`sweep`: working-set sizes in bytes, as ERT and likwid sweep them) measures
instead how fast the cores stream a working set of each size: `read` is the BLAS ddot of an array with
itself (8 bytes per element; ddot keeps several accumulators in flight where numpy's reduction does not)
and `copy` libc's memmove between two halves of the working set. Each worker takes one slice and goes
over it as many times as make a trial of SWEEP_TRIAL_BYTES, so a working set that fits a cache is timed
from that cache, not from the call overhead. Where the bandwidth falls is for the host to find
(edgebench.probes.bandwidth.hierarchy): a VM's sysfs often reports a last-level cache it does not have.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .main import TaskError
from .matmul import _loaded_libraries, blas_threads
from .native import Triad, triad_kernel
from .timing import process_cpu_ns

KERNELS = ("read", "copy", "triad")
TRIAD_PATHS = ("auto", "compiled", "blas", "numpy")  # auto: the first of the others the device has
# STREAM bytes moved per element (float64) by each kernel; write-allocate not counted.
BYTES_PER_ELEMENT = {"read": 8, "copy": 16, "triad": 24}
LLC_MULTIPLE = 4
DEFAULT_ARRAY_BYTES = 256 * 2**20  # when the device does not report its caches
MIN_TRIALS = 10
SCALAR = 3.0
SWEEP_KERNELS = ("read", "copy")
SWEEP_TRIAL_BYTES = 24 * 2**20  # bytes one trial of a sweep point moves, at least (a few milliseconds)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _size(text: str) -> int:
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1].upper(), 1)
    return int(text[:-1] if text[-1].isalpha() else text) * mult


def cache_instances(root: str = "/sys/devices/system/cpu") -> dict[int, dict[str, int]]:
    """Distinct data/unified caches by level: {level: {shared_cpu_list: size}} (one entry per instance)."""
    found: dict[int, dict[str, int]] = {}
    for index in glob.glob(f"{root}/cpu[0-9]*/cache/index[0-9]*"):
        level, size, kind = _read(f"{index}/level"), _read(f"{index}/size"), _read(f"{index}/type")
        shared = _read(f"{index}/shared_cpu_list") or index
        if not level or not size or kind == "Instruction":
            continue
        try:
            found.setdefault(int(level), {})[shared] = _size(size)
        except ValueError:
            continue
    return found


def last_level_cache(root: str = "/sys/devices/system/cpu") -> int | None:
    """Total bytes of the last-level cache over all its instances (e.g. one L3 per CCX or cluster)."""
    caches = cache_instances(root)
    if not caches:
        return None
    return sum(caches[max(caches)].values())


def l2_per_core(root: str = "/sys/devices/system/cpu") -> int | None:
    """One core's L2 (or its L1 when there is no L2): the triad's block of `a` must stay there."""
    caches = cache_instances(root)
    for level in (2, 1):
        if level in caches:
            return min(caches[level].values())
    return None


# (symbol, integer width): numpy's own OpenBLAS (ILP64, prefixed), then the usual CBLAS names.
AXPY_SYMBOLS = (
    ("scipy_cblas_daxpy64_", 64),
    ("cblas_daxpy64_", 64),
    ("scipy_cblas_daxpy", 32),
    ("cblas_daxpy", 32),
)
DOT_SYMBOLS = (
    ("scipy_cblas_ddot64_", 64),
    ("cblas_ddot64_", 64),
    ("scipy_cblas_ddot", 32),
    ("cblas_ddot", 32),
)
Axpy = Callable[[int, float, int, int], None]  # (n, alpha, x address, y address): y += alpha * x
Dot = Callable[[int, int], float]  # (n, x address): x . x


def _blas_function(symbols: tuple[tuple[str, int], ...]) -> tuple[Any, type, str, str] | None:
    """The first of `symbols` a BLAS this process has loaded exports: (function, its integer type, the
    symbol, the library's file name). Called through ctypes, so the GIL is released."""
    for lib in _loaded_libraries():
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for name, bits in symbols:
            fn = getattr(handle, name, None)
            if fn is not None:
                return fn, ctypes.c_int64 if bits == 64 else ctypes.c_int, name, os.path.basename(lib)
    return None


def blas_axpy() -> tuple[Axpy, str] | None:
    """daxpy from a BLAS this process has loaded (numpy's), and where it came from; None without one."""
    found = _blas_function(AXPY_SYMBOLS)
    if found is None:
        return None
    fn, integer, name, lib = found
    fn.argtypes = [integer, ctypes.c_double, ctypes.c_void_p, integer, ctypes.c_void_p, integer]
    fn.restype = None

    def axpy(n: int, alpha: float, x: int, y: int) -> None:
        fn(n, alpha, x, 1, y, 1)

    return axpy, f"memmove + {name} ({lib})"


def blas_dot() -> tuple[Dot, str] | None:
    """ddot from a BLAS this process has loaded, and where it came from; None without one."""
    found = _blas_function(DOT_SYMBOLS)
    if found is None:
        return None
    fn, integer, name, lib = found
    fn.argtypes = [integer, ctypes.c_void_p, integer, ctypes.c_void_p, integer]
    fn.restype = ctypes.c_double

    def dot(n: int, x: int) -> float:
        return float(fn(n, x, 1, x, 1))

    return dot, f"{name} ({lib})"


def available_bytes() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


@dataclass(frozen=True)
class Sizing:
    """How big the arrays are and why."""

    llc_bytes: int | None
    llc_source: str
    array_bytes: int
    block_elements: int
    notes: tuple[str, ...] = ()


def choose_sizing(task: dict[str, Any]) -> Sizing:
    notes: list[str] = []
    llc, source = task.get("llc_bytes"), "task"
    if not llc:
        llc, source = last_level_cache(), "sysfs"
    if task.get("array_bytes"):
        array = int(task["array_bytes"])
        source = f"{source}; arrays set by the task"
        if llc and array < LLC_MULTIPLE * llc:
            notes.append(
                f"arrays of {array / 2**20:.0f} MiB are under {LLC_MULTIPLE}x the last-level cache "
                f"({llc / 2**20:.0f} MiB): the caches inflate the result"
            )
    elif llc:
        array = LLC_MULTIPLE * int(llc)
    else:
        array, source = DEFAULT_ARRAY_BYTES, "unknown"
        notes.append(
            f"the device reports no cache sizes: using {array / 2**20:.0f} MiB arrays "
            "(set llc_bytes in the descriptor's [spec])"
        )
    free = available_bytes()
    if free and 3 * array > free // 2:
        array = max(8 * 2**20, free // 6)
        notes.append(f"arrays cut to {array / 2**20:.0f} MiB to fit in half the free memory")
    # a quarter of L2 per array block: a's block stays cached between the triad's two passes, and each
    # block is long enough for the prefetchers to run ahead (an eighth read 3% less at 2 threads)
    l2 = int(task.get("block_bytes") or 0) or max(32 * 1024, min(2**20, (l2_per_core() or 2**20) // 4))
    return Sizing(int(llc) if llc else None, source, int(array), max(1024, l2 // 8), tuple(notes))


class Workers:
    """Persistent threads, one per slice, released together for each trial by a barrier."""

    def __init__(self, count: int, cpus: list[int] | None) -> None:
        self.count = count
        self.job: Callable[[int], None] = lambda k: None
        self.start = threading.Barrier(count + 1)
        self.end = threading.Barrier(count + 1)
        self.stop = False
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(k, cpus), daemon=True) for k in range(count)
        ]
        for t in self.threads:
            t.start()

    def _loop(self, k: int, cpus: list[int] | None) -> None:
        if cpus and len(cpus) >= self.count and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, {cpus[k]})  # 0 = the calling thread on Linux
            except OSError:
                pass
        while True:
            self.start.wait()
            if self.stop:
                return
            try:
                self.job(k)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                self.errors.append(exc)
            self.end.wait()

    def run(self, job: Callable[[int], None]) -> float:
        """Run job(k) on every worker at once; seconds from release to the last one finishing."""
        return self.run_timed(job)[0]

    def run_timed(self, job: Callable[[int], None]) -> tuple[float, float]:
        """Like `run`, also returning the process CPU seconds the trial used (all threads)."""
        self.job = job
        c0, t0 = process_cpu_ns(), time.perf_counter_ns()
        self.start.wait()
        self.end.wait()
        elapsed, cpu = (time.perf_counter_ns() - t0) / 1e9, (process_cpu_ns() - c0) / 1e9
        if self.errors:
            raise self.errors[0]
        return elapsed, cpu

    def close(self) -> None:
        self.stop = True
        self.start.wait()
        for t in self.threads:
            t.join()


class Arrays:
    """a, b, c (float64) split into one slice per worker."""

    def __init__(
        self,
        np: Any,
        elements: int,
        workers: int,
        block: int,
        axpy: Axpy | None = None,
        fused: Triad | None = None,
    ) -> None:
        self.np = np
        self.n = elements
        self.block = block
        self.axpy = axpy
        self.fused = fused
        self.a, self.b, self.c = (np.empty(elements) for _ in range(3))
        self.bounds: list[tuple[int, int]] = []
        self.reshape(workers)
        self.sums: list[float] = [0.0] * workers

    def reshape(self, workers: int) -> None:
        step = -(-self.n // workers)
        self.bounds = [(k * step, min(self.n, (k + 1) * step)) for k in range(workers)]
        self.sums = [0.0] * workers

    def init(self, k: int) -> None:
        """First touch from the worker that will use the slice (memory lands near its CPU)."""
        lo, hi = self.bounds[k]
        self.a[lo:hi] = 1.0
        self.b[lo:hi] = 2.0
        self.c[lo:hi] = 0.5

    def read(self, k: int) -> None:
        lo, hi = self.bounds[k]
        add, total, step = self.np.add.reduce, 0.0, self.block * 8
        for i in range(lo, hi, step):
            total += float(add(self.a[i : min(i + step, hi)]))
        self.sums[k] = total

    def copy(self, k: int) -> None:
        lo, hi = self.bounds[k]
        if hi > lo:
            # libc memmove through ctypes: one call per slice, the GIL released for its duration.
            ctypes.memmove(self.c.ctypes.data + 8 * lo, self.a.ctypes.data + 8 * lo, 8 * (hi - lo))

    def triad(self, k: int) -> None:
        if self.fused is not None:
            lo, hi = self.bounds[k]
            if hi > lo:  # one fused pass over the slice, as STREAM's C loop (no blocks needed)
                self.fused(
                    self.a.ctypes.data + 8 * lo,
                    self.b.ctypes.data + 8 * lo,
                    self.c.ctypes.data + 8 * lo,
                    SCALAR,
                    hi - lo,
                )
            return
        if self.axpy is not None:
            self._triad_blas(k)
            return
        lo, hi = self.bounds[k]
        multiply, add, block = self.np.multiply, self.np.add, self.block
        a, b, c = self.a, self.b, self.c
        for i in range(lo, hi, block):
            j = min(i + block, hi)
            out = a[i:j]
            multiply(c[i:j], SCALAR, out=out)  # a's block is now in cache...
            add(out, b[i:j], out=out)  # ...so this pass reads only b from memory

    def _triad_blas(self, k: int) -> None:
        lo, hi = self.bounds[k]
        axpy, memmove, block = self.axpy, ctypes.memmove, self.block
        pa, pb, pc = self.a.ctypes.data, self.b.ctypes.data, self.c.ctypes.data
        assert axpy is not None
        for i in range(lo, hi, block):
            n, offset = min(block, hi - i), 8 * i
            memmove(pa + offset, pb + offset, 8 * n)  # a = b: a's block is now in cache...
            axpy(n, SCALAR, pc + offset, pa + offset)  # ...a += s * c reads only c from memory


def choose_triad(wanted: str, warnings: list[str]) -> tuple[Triad | None, Axpy | None, str]:
    """(fused kernel, daxpy, the path's description) for the triad path asked for; `auto` takes the
    compiled loop, else memmove + daxpy, else numpy in place, and says why it fell back."""
    if wanted not in TRIAD_PATHS:
        raise TaskError("usage", f"unknown triad path {wanted!r} (use {', '.join(TRIAD_PATHS)})")
    problems: list[str] = []
    if wanted in ("auto", "compiled"):
        compiled = triad_kernel(problems)
        if compiled is not None:
            return compiled[0], None, compiled[1]
        if wanted == "compiled":
            raise TaskError("runtime", f"no compiled triad on this device: {'; '.join(problems)}")
    if wanted in ("auto", "blas"):
        found = blas_axpy()
        if found is not None:
            if problems:
                warnings.append(f"triad through {found[1]}, not a compiled loop: {'; '.join(problems)}")
            return None, found[0], found[1]
        if wanted == "blas":
            raise TaskError("runtime", "no BLAS daxpy loaded in this process (numpy without a BLAS)")
        problems.append("no BLAS daxpy")
    if problems:
        warnings.append(f"triad in two numpy passes per block: {'; '.join(problems)}")
    return None, None, "numpy in place" + (" (no compiler, no BLAS daxpy)" if problems else "")


def check(arrays: Arrays, kernel: str) -> str | None:
    """The kernel really ran: spot values and the read sum match what it must have produced."""
    np = arrays.np
    idx = np.linspace(0, arrays.n - 1, 17).astype(np.int64)
    if kernel == "read":
        total, want = sum(arrays.sums), float(np.sum(arrays.a, dtype=np.float64))
        return None if abs(total - want) <= 1e-9 * max(abs(want), 1.0) else f"read sum {total} != {want}"
    if kernel == "copy":
        return None if np.array_equal(arrays.c[idx], arrays.a[idx]) else "copy left c different from a"
    want = arrays.b[idx] + SCALAR * arrays.c[idx]
    return None if np.allclose(arrays.a[idx], want) else "triad result is wrong"


def measure(workers: Workers, arrays: Arrays, kernel: str, trials: int) -> tuple[list[float], list[float]]:
    """The first trial (page faults, frequency ramp) and `trials` more: wall ms and process CPU ms."""
    job = getattr(arrays, kernel)
    timed = [workers.run_timed(job) for _ in range(trials + 1)]
    problem = check(arrays, kernel)
    if problem:
        raise TaskError("measurement", f"bandwidth {kernel}: {problem}")
    return [w * 1e3 for w, _ in timed], [c * 1e3 for _, c in timed]


class SweepPoint:
    """One working-set size: a read array (the whole set) and a copy pair (half each), sliced per worker."""

    def __init__(self, np: Any, size: int, workers: int, dot: Dot | None) -> None:
        self.np = np
        self.n = max(workers * 512, size // 8)  # elements of the read array; copy halves it
        self.a = np.ones(self.n)
        self.half = self.n // 2
        self.dot = dot
        self.workers = workers
        self.sums = [0.0] * workers
        self.reps = max(1, SWEEP_TRIAL_BYTES // (8 * self.n))

    def _bounds(self, k: int, n: int) -> tuple[int, int]:
        step = -(-n // self.workers)
        return k * step, min(n, (k + 1) * step)

    def read(self, k: int) -> None:
        lo, hi = self._bounds(k, self.n)
        base, total = self.a.ctypes.data + 8 * lo, 0.0
        if self.dot is not None:
            for _ in range(self.reps):
                total += self.dot(hi - lo, base)
        else:
            part = self.a[lo:hi]
            for _ in range(self.reps):
                total += float(self.np.add.reduce(part))
        self.sums[k] = total

    def copy(self, k: int) -> None:
        lo, hi = self._bounds(k, self.half)
        src, dst = self.a.ctypes.data + 8 * lo, self.a.ctypes.data + 8 * (self.half + lo)
        for _ in range(self.reps):
            ctypes.memmove(dst, src, 8 * (hi - lo))

    def moved(self, kernel: str) -> int:
        """Bytes one trial moves: read 8 per element per pass, copy 16 per copied element."""
        return self.reps * (8 * self.n if kernel == "read" else 16 * self.half)

    def check(self, kernel: str) -> str | None:
        if kernel == "read":
            want = float(self.reps * self.n)  # every element is 1.0
            got = sum(self.sums)
            return None if abs(got - want) <= 1e-6 * want else f"sweep read sum {got} != {want}"
        return None if float(self.a[-1]) == 1.0 else "sweep copy changed the data"


def sweep(
    task: dict[str, Any], cpus: list[int] | None, threads_list: list[int], warnings: list[str]
) -> dict[str, Any]:
    """Bandwidth for every working-set size and thread count (see the module docstring)."""
    import numpy as np

    sizes = sorted({int(s) for s in task["sweep"] if int(s) > 0})
    trials = max(1, int(task.get("trials", MIN_TRIALS)))
    budget = float(task.get("budget_s", 600.0))
    deadline = time.monotonic() + budget
    found = blas_dot()
    points: list[dict[str, Any]] = []
    free = available_bytes()
    for threads in threads_list:
        workers = Workers(threads, cpus)
        try:
            for size in sizes:
                if free and size > free // 2:
                    warnings.append(f"sweep stopped at {size / 2**20:.0f} MiB: over half the free memory")
                    break
                if time.monotonic() > deadline:
                    warnings.append(f"time budget ({budget:g} s) reached at threads={threads}, {size} B")
                    break
                point = SweepPoint(np, size, threads, found[0] if found else None)
                with blas_threads(1, warnings):
                    for kernel in SWEEP_KERNELS:
                        job = getattr(point, kernel)
                        workers.run(job)  # first touch and warm-up: not timed
                        timed = [workers.run(job) * 1e3 for _ in range(trials)]
                        problem = point.check(kernel)
                        if problem:
                            raise TaskError("measurement", f"bandwidth {problem}")
                        points.append(
                            {
                                "kernel": kernel,
                                "threads": threads,
                                "working_set_bytes": 8 * point.n,
                                "bytes": point.moved(kernel),
                                "trial_ms": timed,
                            }
                        )
                del point
        finally:
            workers.close()
    return {
        "sweep": points,
        "sweep_read_path": found[1] if found else "numpy add.reduce (no BLAS ddot found)",
        "sweep_trial_bytes": SWEEP_TRIAL_BYTES,
    }


def run(task: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    import numpy as np

    from .bench import pin

    warnings: list[str] = []
    cpus = pin(task.get("affinity"))
    if task.get("sweep"):
        threads_list = [int(t) for t in task.get("threads") or [len(cpus or []) or os.cpu_count() or 1]]
        return {
            "affinity": cpus,
            "llc_bytes": last_level_cache(),
            **sweep(task, cpus, threads_list, warnings),
        }, warnings
    kernels = task.get("kernels") or list(KERNELS)
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise TaskError("usage", f"unknown bandwidth kernel {unknown[0]!r} (use {', '.join(KERNELS)})")
    trials = int(task.get("trials", MIN_TRIALS))
    if trials < 1:
        raise TaskError("usage", "trials must be at least 1")
    if trials < MIN_TRIALS:
        warnings.append(f"{trials} trials is fewer than STREAM's {MIN_TRIALS}: the best may not be the best")
    threads_list = [int(t) for t in task.get("threads") or [len(cpus or []) or os.cpu_count() or 1]]
    sizing = choose_sizing(task)
    warnings += list(sizing.notes)
    elements = sizing.array_bytes // 8
    fused, axpy, triad_path = (
        choose_triad(str(task.get("triad_path") or "auto"), warnings)
        if "triad" in kernels
        else (None, None, "")
    )
    arrays = Arrays(np, elements, 1, sizing.block_elements, axpy, fused)
    results: list[dict[str, Any]] = []
    budget = float(task.get("budget_s", 600.0))
    deadline = time.monotonic() + budget
    first = True
    for threads in threads_list:
        if time.monotonic() > deadline:
            warnings.append(f"time budget ({budget:g} s) reached before threads={threads}")
            break
        arrays.reshape(threads)
        workers = Workers(threads, cpus)
        try:
            if first:
                workers.run(arrays.init)
                first = False
            for kernel in kernels:
                with blas_threads(1, warnings):  # each worker's daxpy on its own CPU only
                    times, cpu = measure(workers, arrays, kernel, trials)
                results.append(
                    {
                        "kernel": kernel,
                        "threads": threads,
                        "bytes": BYTES_PER_ELEMENT[kernel] * elements,
                        "trial_ms": times,
                        "trial_cpu_ms": cpu,
                        "warmup_trials": 1,
                    }
                )
        finally:
            workers.close()
    return {
        "llc_bytes": sizing.llc_bytes,
        "llc_source": sizing.llc_source,
        "array_bytes": elements * 8,
        "elements": elements,
        "block_bytes": sizing.block_elements * 8,
        "affinity": cpus,
        "byte_counting": "STREAM (write-allocate not counted)",
        "triad_path": triad_path if "triad" in kernels else None,
        "results": results,
    }, warnings
