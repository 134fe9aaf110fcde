"""Kernels compiled on the device itself, where it has a C compiler (most Linux boards do, phones do not).

Some figures need a loop no numpy call makes: STREAM's triad `a[i] = b[i] + s * c[i]` is one fused pass,
numpy's nearest is two (see bandwidth.py). Where `cc`, `gcc` or `clang` is on the PATH, the agent builds a
few lines of C into a shared library for the CPU it runs on (`-O3 -march=native`, or `-O3` where the
compiler has no `-march=native`), in a private temporary folder removed at once (the library stays mapped),
and calls it through ctypes, which releases the GIL for the call. Nothing is cached between runs, so no
library another user could have replaced is ever loaded; a build takes a fraction of a second. Without a
compiler, or when the build fails, the caller falls back to what numpy offers and says so.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

COMPILERS = ("cc", "gcc", "clang")
FLAG_SETS = (("-O3", "-march=native"), ("-O3",))
BUILD_TIMEOUT_S = 60

TRIAD_SOURCE = r"""
void edgebench_triad(double *restrict a, const double *restrict b, const double *restrict c,
                     double s, long n) {
    for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
"""

Triad = Callable[[int, int, int, float, int], None]  # (a, b, c addresses, scalar, elements)


@dataclass(frozen=True)
class Built:
    """A library built here, and how (compiler and flags, for the record)."""

    library: ctypes.CDLL
    how: str


def find_compiler() -> str | None:
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def build(source: str, problems: list[str]) -> Built | None:
    """`source` built into a shared library and loaded; None (with why in `problems`) where it cannot be."""
    compiler = find_compiler()
    if compiler is None:
        problems.append("no C compiler on the PATH (cc, gcc, clang)")
        return None
    folder = tempfile.mkdtemp(prefix="edgebench-native-")  # mode 0700: only this user can write there
    try:
        src, lib = os.path.join(folder, "kernel.c"), os.path.join(folder, "kernel.so")
        with open(src, "w") as fh:
            fh.write(source)
        for flags in FLAG_SETS:
            argv = [compiler, *flags, "-fPIC", "-shared", "-o", lib, src]
            try:
                res = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as exc:
                problems.append(f"{os.path.basename(compiler)} {' '.join(flags)}: {exc}")
                continue
            if res.returncode == 0:
                name = os.path.basename(compiler)
                return Built(ctypes.CDLL(lib), f"{name} {' '.join(flags)}")
            tail = (res.stderr.strip().splitlines() or ["failed"])[-1]
            problems.append(f"{os.path.basename(compiler)} {' '.join(flags)}: {tail[:160]}")
        return None
    except OSError as exc:
        problems.append(f"could not build a native kernel: {exc}")
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def triad_kernel(problems: list[str]) -> tuple[Triad, str] | None:
    """The fused C triad over [0, n) of the given arrays, and how it was built; None without a compiler."""
    built = build(TRIAD_SOURCE, problems)
    if built is None:
        return None
    fn = built.library.edgebench_triad
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_long]
    fn.restype = None

    def triad(a: int, b: int, c: int, s: float, n: int) -> None:
        fn(a, b, c, s, n)

    return triad, f"compiled C loop ({built.how})"
