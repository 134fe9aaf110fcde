"""Promises of the command line, each as the user meets it: the usage with its verbs, --debug where people
type it, what the help says is accepted (`--skinny false`), an output suffix that is not a format, run
references on --resume, and errors that say what was meant (--shape, suite keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebench.cli import hoist_debug, main
from edgebench.errors import ConfigError
from edgebench.execution.suite import load_suite
from edgebench.records import Record
from edgebench.results.store import Store

RUN = "20260101T000000Z-aaaaaa"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgebench: error: "), err
    return lines[0]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "lab.db"
    with Store(path) as st:
        records = [
            Record(
                RUN, "local", "bench", "enc", "onnxruntime", "latency_ms", v, "ms", {"stat": s, "threads": 1}
            )
            for s, v in (("p50", 4.0), ("p99", 5.0))
        ]
        st.import_records(RUN, records, kind="bench")
    return path


# ---- usage and --debug -----------------------------------------------------------------------------------


def test_no_arguments_prints_the_usage_with_the_verbs_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli([], capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: edgebench") and "error:" not in err
    assert "Commands:" in err
    for verb in ("bench", "run", "report", "gate", "fit", "probe"):
        assert f"\n  {verb} " in err, verb


def test_debug_is_accepted_after_the_verb(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["report", "--store", store, "--out", tmp_path / "r.md", "--debug"], capsys)
    assert code == 0 and (tmp_path / "r.md").is_file(), err
    assert hoist_debug(["report", "--debug", "--out", "r.md"]) == (
        ["--debug", "report", "--out", "r.md"],
        True,
    )
    assert hoist_debug(["run", "s.toml", "--", "--debug"]) == (["run", "s.toml", "--", "--debug"], False)


def test_an_internal_error_says_where_debug_goes_and_debug_there_gives_the_traceback(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgebench.render.report as report

    def broken(data: object, fmt: str) -> str:
        raise KeyError("device")

    monkeypatch.setattr(report, "render", broken)  # a bug of our own, planted where the report renders
    argv = ["report", "--store", store, "--out", tmp_path / "r.html"]
    code, _, err = run_cli(argv, capsys)
    line = one_error_line(err)
    assert code == 1 and "internal error: KeyError" in line
    assert "edgebench --debug report ..." in line
    code, _, err = run_cli([*argv, "--debug"], capsys)  # as people type it: after the verb
    assert code == 1 and "Traceback (most recent call last)" in err and "No such option" not in err


# ---- what the help promises ------------------------------------------------------------------------------


def test_skinny_false_means_no_skinny_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    from edgebench.probes.registry import MatmulParams

    code, _, err = run_cli(["probe", "matmul", "--help"], capsys)
    assert code == 0
    assert MatmulParams.parse({"skinny": ["false"]}).skinny is False  # --skinny false, as typer passes it
    assert MatmulParams.parse({"skinny": "None"}).skinny is False
    assert MatmulParams.parse({"skinny": False}).skinny is False  # skinny = false in a suite
    assert MatmulParams.parse({"skinny": ["1x64x64"]}).skinny == ((1, 64, 64),)
    # On the command line: accepted as "none", so the only complaint left is that nothing would be measured.
    code, _, err = run_cli(
        ["probe", "matmul", "--device", "local", "--skinny", "false", "--no-square"], capsys
    )
    assert code == 2 and "square = false needs skinny shapes (skinny is false)" in one_error_line(err)


@pytest.mark.parametrize("name, fmt, written", [
    ("x.pdf", None, None), ("x.docx", None, None), ("x.pdf", "md", "md"), ("x.md", None, "md"),
    ("x.markdown", None, "md"), ("x.htm", None, "html"), ("x", None, "html"),
])  # fmt: skip
def test_report_writes_what_the_suffix_says_or_refuses_it(
    name: str, fmt: str | None, written: str | None, store: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / name
    code, _, err = run_cli(
        ["report", "--store", store, "--out", out, *(["--format", fmt] if fmt else [])], capsys
    )
    if written is None:
        assert code == 2 and f"--out {out}: reports are HTML (.html) or Markdown (.md)" in one_error_line(err)
        assert not out.exists()
        return
    assert code == 0, err
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") if written == "html" else text.startswith("# ")


def test_resume_latest_is_documented_and_means_the_suites_latest_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgebench.cli.run import _resume_run
    from edgebench.errors import UserError

    code, out, _ = run_cli(["run", "--help"], capsys)
    assert code == 0 and "latest (this suite's latest run)" in " ".join(out.split())
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "--resume latest" in readme
    with Store(tmp_path / "s.db") as st:
        for run_id, kind, suite in (
            ("20260101T000000Z-aaaaaa", "suite", "nightly"),
            ("20260102T000000Z-bbbbbb", "suite", "nightly"),
            ("20260103T000000Z-cccccc", "bench", None),  # stored since: not the run to finish
        ):
            st.begin_run(run_id, kind, {}, suite=suite)
            st.finish_run(run_id, "ok")
        assert _resume_run(st, "latest", "nightly") == "20260102T000000Z-bbbbbb"
        assert _resume_run(st, "latest~1", "nightly") == "20260101T000000Z-aaaaaa"
        assert _resume_run(st, "cccc", "nightly") == "20260103T000000Z-cccccc"  # an id is taken as given
        with pytest.raises(UserError, match="suite 'smoke'"):
            _resume_run(st, "latest", "smoke")


# ---- errors that say what was meant ----------------------------------------------------------------------


@pytest.mark.parametrize("argv, hint", [
    (["bench", "builtin:mlp", "--device", "local", "--shape", "1,3,64,64"], "did you mean NAME=1x3x64x64?"),
    (["bench", "builtin:mlp", "--device", "local", "--shape", "x=1,3,64,64"], "did you mean x=1x3x64x64?"),
    (["bench", "builtin:mlp", "--device", "local", "--shape", "x=[1, 1024]"], "did you mean x=1x1024?"),
    (["roofline", "builtin:mlp", "--shape", "1,3,64,64"], "did you mean NAME=1x3x64x64?"),
])  # fmt: skip
def test_shape_written_with_commas_gets_the_x_form(
    argv: list[str], hint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli([*argv, *(["--store", tmp_path / "s.db"] if argv[0] == "bench" else [])], capsys)
    assert code == 2 and hint in one_error_line(err)
    assert not (tmp_path / "s.db").exists()


GOOD = """
name = "tiny"
devices = ["local"]
models = ["builtin:tinymlp"]
timeout = 30
[[probe]]
kind = "bench"
params = { threads = 1 }
[[gate]]
metric = "latency_ms"
max_slowdown = "5%"
[budget]
latency_p99_ms = 15
[policy]
retries = 1
"""


@pytest.mark.parametrize("typo, fixed, says", [
    ("timeout = 30", "timout = 30", "timout: unknown key (did you mean 'timeout'?)"),
    ('models = ["builtin:tinymlp"]', 'modles = ["builtin:tinymlp"]', "modles: unknown key (did you mean 'models'?)"),
    ('devices = ["local"]', 'devcies = ["local"]', "devices: required key is missing (is 'devcies' a misspelling"),
    ("[policy]", "[polcy]", "polcy: unknown key (did you mean 'policy'?)"),
    ("params = { threads = 1 }", "parms = { threads = 1 }", "probe[0].parms: unknown key (did you mean 'probe[0].params'?)"),
    ('kind = "bench"', 'kind = "bench"\nmodel = ["tinymlp"]', "probe[0].model: unknown key (did you mean 'probe[0].models'?)"),
    ('metric = "latency_ms"', 'metrc = "latency_ms"', "gate[0].metric: required key is missing (is 'gate[0].metrc'"),
    ("retries = 1", "retires = 1", "policy.retires: unknown key (did you mean 'policy.retries'?)"),
    ("latency_p99_ms = 15", "latency_p99ms = 15", "budget.latency_p99ms: unknown budget (did you mean 'latency_p99_ms'?"),
])  # fmt: skip
def test_suite_key_typos_name_the_file_the_key_and_what_was_meant(
    typo: str, fixed: str, says: str, tmp_path: Path
) -> None:
    load_suite(_write(tmp_path / "good.toml", GOOD))
    path = _write(tmp_path / "typo.toml", GOOD.replace(typo, fixed, 1))
    with pytest.raises(ConfigError) as exc:
        load_suite(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and says in message, message


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
