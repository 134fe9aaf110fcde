"""The llama-bench adapter against real output of the lab's binary (edgebench/native/fixtures/llama_bench/,
README.md there names each capture's command and exit status): argv, every JSON field kept, per-token
samples derived from the tool's integer nanoseconds, and each failure as one typed line naming the model.

The real binary is driven in tests/integration/test_llama_bench_real.py.
"""

from __future__ import annotations

import json
import re
import shlex
from importlib import resources
from typing import NamedTuple

import pytest

from edgebench.native.base import KILLED, NativeToolError
from edgebench.native.llama_bench import (
    LlamaBenchCrash,
    LlamaBenchError,
    LlamaBenchLoadError,
    LlamaBenchOutputError,
    LlamaBenchTest,
    llama_bench_argv,
    parse_llama_bench,
)

FOLDER = resources.files("edgebench.native").joinpath("fixtures", "llama_bench")
LINE = re.compile(r"^- `(\w+)` rc=(-?\d+): `([^`]+)`", re.MULTILINE)
Q4_0 = "llama-l2-h256-f768-a4-kv2-v512-q4_0.gguf"


class Capture(NamedTuple):
    name: str
    returncode: int
    argv: list[str]
    stdout: str
    stderr: str

    @property
    def model(self) -> str:
        return self.argv[self.argv.index("-m") + 1]

    def parse(self, returncode: int | None = None) -> list[LlamaBenchTest]:
        rc = self.returncode if returncode is None else returncode
        return parse_llama_bench(self.stdout, self.stderr, rc, self.model, self.argv)

    def refused(self, returncode: int | None = None) -> LlamaBenchError:
        with pytest.raises(LlamaBenchError) as info:
            self.parse(returncode)
        assert "\n" not in str(info.value), "one line"
        assert self.model in str(info.value), "names the model file"
        return info.value


def captures() -> dict[str, Capture]:
    found = {}
    for name, rc, command in LINE.findall(FOLDER.joinpath("README.md").read_text()):
        stdout = FOLDER.joinpath(f"{name}.stdout").read_text()
        stderr = FOLDER.joinpath(f"{name}.stderr").read_text()
        found[name] = Capture(name, int(rc), shlex.split(command), stdout, stderr)
    return found


CAPTURES = captures()


def test_every_capture_is_named_in_the_readme_with_its_command() -> None:
    on_disk = {p.name.rsplit(".", 1)[0] for p in FOLDER.iterdir() if p.name.endswith((".stdout", ".stderr"))}
    assert on_disk == set(CAPTURES) and len(CAPTURES) >= 12


# ---- argv --------------------------------------------------------------------------------------------------
def test_the_captures_argv_is_the_adapters() -> None:
    # the README's commands were produced by llama_bench_argv: built again, they are the same lists
    got = llama_bench_argv(
        "llama-bench", Q4_0, prompt=32, gen=16, depths=(0, 64), threads=(1, 2), repetitions=3
    )
    assert got == CAPTURES["q4_0_prefill_decode_depths_threads"].argv
    model = "llama-l2-h256-f768-a4-kv2-v512-q8_0.gguf"
    got = llama_bench_argv(
        "llama-bench", model, prompt=16, gen=8, threads=[2], repetitions=2, repack=False, warmup=False,
        extra=("-pg", "16,8"),
    )  # fmt: skip
    assert got == CAPTURES["q8_0_pg_repack0_nowarmup"].argv


def test_argv_always_asks_for_json_last_and_maps_every_option() -> None:
    argv = llama_bench_argv(
        "/b/llama-bench", "/m.gguf", prompt=[64, 512], gen=0, depths=[0, 512, 2048], threads=[1, 4],
        repetitions=5, repack=True, cache_type_k="q8_0", cache_type_v="q8_0", batch=256, ubatch=64,
        extra=("-fa", "1"),
    )  # fmt: skip
    assert argv[:3] == ["/b/llama-bench", "-m", "/m.gguf"] and argv[-2:] == ["-o", "json"]
    joined = " ".join(argv)
    for part in (
        "-p 64,512",
        "-n 0",
        "-d 0,512,2048",
        "-t 1,4",
        "-r 5",
        "--repack 1",
        "-ctk q8_0",
        "-ctv q8_0",
    ):
        assert part in joined
    assert "-b 256 -ub 64" in joined and "-fa 1 -o json" in joined and "--no-warmup" not in argv
    plain = llama_bench_argv("b", "m", prompt=0, gen=32, threads=[2], repetitions=1)
    assert "--repack" not in plain and "-v" not in plain  # the tool's own default (on) is left alone
    assert "-t" not in llama_bench_argv("b", "m", prompt=0, gen=32, threads=[], repetitions=1)  # its default


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"prompt": 0, "gen": 0}, "nothing to measure"),
        ({"threads": [0]}, "threads"),
        ({"depths": [-1]}, "depths"),
        ({"repetitions": 0}, "repetitions"),
        ({"extra": ("-o", "md")}, "always -o json"),
    ],
)
def test_argv_refuses_what_the_tool_would_not_measure(kw: dict, word: str) -> None:
    base = {"prompt": 8, "gen": 8, "threads": [1], "repetitions": 1, **kw}
    with pytest.raises(NativeToolError) as info:
        llama_bench_argv("b", "m.gguf", **base)
    assert info.value.kind == "usage" and word in str(info.value)


# ---- results -----------------------------------------------------------------------------------------------
def test_depths_and_threads_give_the_cross_product_with_every_field_kept() -> None:
    cap = CAPTURES["q4_0_prefill_decode_depths_threads"]
    tests = cap.parse()
    objects = json.loads(cap.stdout)
    assert {(t.n_prompt, t.n_gen, t.n_depth, t.n_threads) for t in tests} == {
        (p, g, d, th) for p, g in ((32, 0), (0, 16)) for d in (0, 64) for th in (1, 2)
    }
    for test, obj in zip(tests, objects, strict=True):
        kept = {k: getattr(test, k) for k in obj if k not in test.raw}
        # every key of the object is a typed field or in raw, with the tool's value
        assert {**kept, **test.raw}.keys() == obj.keys()
        for key, value in kept.items():
            assert (list(value) if isinstance(value, tuple) else value) == obj[key], key
        assert (
            test.model_size == 1037312 and test.model_n_params == 1836288
        )  # read_gguf's counts of that file
        assert (
            test.model_type == "llama ?B Q4_0" and test.backends == "CPU" and test.build_commit == "0c1e570"
        )
        assert test.type_k == test.type_v == "f16" and test.repack is True and test.n_batch == 2048
        assert {"cpu_mask", "poll", "load_mode", "fit_target"} <= test.raw.keys()
        assert len(test.samples_ns) == len(test.samples_ts) == 3


def test_decode_samples_become_per_token_ms_exactly_and_prefill_samples_ms() -> None:
    tests = CAPTURES["q4_0_prefill_decode_depths_threads"].parse()
    decode = [t for t in tests if t.kind == "decode"]
    prefill = [t for t in tests if t.kind == "prefill"]
    assert len(decode) == len(prefill) == 4
    for t in decode:
        assert [round(ms * t.n_gen * 1_000_000) for ms in t.per_token_ms] == list(t.samples_ns)
        assert t.label in ("tg16", "tg16 @ d64")
    for t in prefill:
        assert t.per_token_ms == () and t.ms == tuple(s / 1e6 for s in t.samples_ns)
        # the tool's own rate is the same samples: prompt tokens over each sample's seconds
        assert t.samples_ts == pytest.approx(tuple(t.n_prompt / (s / 1e9) for s in t.samples_ns), rel=1e-4)


def test_prefill_plus_decode_repack_off_and_no_warmup_as_the_tool_says() -> None:
    tests = CAPTURES["q8_0_pg_repack0_nowarmup"].parse()
    assert [t.label for t in tests] == ["pp16", "tg8", "pp16+tg8"]
    assert all(t.repack is False for t in tests)
    assert tests[2].kind == "prefill+decode" and tests[2].per_token_ms == ()
    # with no warm-up the first repetition carries the start-up: kept as printed, never dropped here
    assert tests[0].samples_ns[0] > 5 * tests[0].samples_ns[1]


def test_k_quant_and_f16_files_as_the_tool_names_them() -> None:
    (q4km,) = CAPTURES["q4_k_m_decode"].parse()
    (f16,) = CAPTURES["f16_prefill"].parse()
    assert q4km.model_type == "llama ?B Q4_K - Medium" and q4km.kind == "decode"
    assert f16.model_type == "llama ?B F16" and f16.kind == "prefill"
    assert q4km.model_n_params == f16.model_n_params == 1836288  # the same tensors, stored differently
    assert f16.model_size == 3675136 and q4km.model_size == 1130240


def test_verbose_logs_are_not_errors_even_merged_into_stdout() -> None:
    cap = CAPTURES["q4_0_verbose"]
    tests = cap.parse()
    assert [t.label for t in tests] == ["pp8", "tg4"] and len(cap.stderr.splitlines()) > 100
    # adb without shell v2 merges stderr into stdout: the array is still found between its lines
    merged = parse_llama_bench(cap.stderr + cap.stdout, "", 0, cap.model, cap.argv)
    assert merged == tests


# ---- failures ----------------------------------------------------------------------------------------------
def test_a_model_llama_cpp_cannot_load_quotes_its_line() -> None:
    for name, quoted in (
        ("load_not_gguf", "llama_bench: error: failed to load model 'notgguf.gguf'"),
        ("load_missing", "llama_bench: error: failed to load model 'missing.gguf'"),
        ("load_truncated_verbose", "tensor 'blk.0.ffn_down.weight' data is not within the file bounds"),
    ):
        error = CAPTURES[name].refused()
        assert isinstance(error, LlamaBenchLoadError) and error.kind == "model"
        assert quoted in str(error) and error.returncode == 1


def test_a_flag_the_tool_refuses_is_a_usage_error_naming_it() -> None:
    error = CAPTURES["bad_flag"].refused()
    assert error.kind == "usage" and "invalid parameter for argument: --bogus" in str(error)


def test_an_empty_array_measured_nothing() -> None:
    error = CAPTURES["empty_array"].refused()
    assert isinstance(error, LlamaBenchOutputError) and "no test" in str(error)


@pytest.mark.parametrize("returncode", [-11, 139])  # subprocess's -N, and the shell's 128 + N (adb, ssh)
def test_death_by_sigsegv_names_the_signal_the_model_the_flags_and_repack(returncode: int) -> None:
    cap = CAPTURES["sigsegv_outside"]
    assert cap.stdout.startswith("[") and not cap.stdout.rstrip().endswith("]")  # cut mid-array
    error = cap.refused(returncode)
    assert isinstance(error, LlamaBenchCrash) and error.signal_name == "SIGSEGV" and error.kind == "crash"
    text = str(error)
    assert "killed by signal 11 (SIGSEGV" in text and "-p 16 -n 64 -d 0 -t 1 -r 400 -o json" in text
    assert "try --repack 0" in text
    already = [*cap.argv[:-2], "--repack", "0", "-o", "json"]
    with pytest.raises(LlamaBenchCrash) as info:
        parse_llama_bench(cap.stdout, cap.stderr, returncode, cap.model, already)
    assert "try --repack" not in str(info.value)  # it was already off: no advice that was taken


def test_sigkill_is_from_outside_not_the_model() -> None:
    error = CAPTURES["sigkill_outside"].refused()
    assert isinstance(error, LlamaBenchCrash) and error.kind == KILLED and error.signal_name == "SIGKILL"
    assert "from outside" in str(error) and "repack" not in str(error)


def test_empty_garbled_or_incomplete_json_is_one_line() -> None:
    cap = CAPTURES["q4_k_m_decode"]
    cases = {
        "": "printed nothing",
        cap.stdout[: len(cap.stdout) // 2]: "no valid JSON",
        '{"n_gen": 16}': "not an array",
    }
    obj = json.loads(cap.stdout)[0]
    del obj["samples_ns"]
    cases[json.dumps([obj])] = "has no 'samples_ns'"
    obj = {**json.loads(cap.stdout)[0], "samples_ns": []}
    cases[json.dumps([obj])] = "samples_ns is empty"
    for stdout, words in cases.items():
        with pytest.raises(LlamaBenchOutputError) as info:
            parse_llama_bench(stdout, "", 0, cap.model, cap.argv)
        assert words in str(info.value) and cap.model in str(info.value) and "\n" not in str(info.value)


def test_an_unexplained_exit_status_quotes_stderr() -> None:
    cap = CAPTURES["q4_k_m_decode"]
    with pytest.raises(LlamaBenchError) as info:
        parse_llama_bench(cap.stdout, "something odd\n", 3, cap.model, cap.argv)
    assert "exited 3" in str(info.value) and "something odd" in str(info.value)
