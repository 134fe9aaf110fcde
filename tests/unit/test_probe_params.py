"""Every probe kind's typed params: a misspelt, mistyped or out-of-range value is refused before anything
runs, in a suite (one line naming the file, probe and key) and on the command line (naming the flag),
exit 2, and nothing already stored is lost."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from edgebench.cli import main
from edgebench.probes.params import IDENTITY, ParamError, ProbeParams
from edgebench.probes.registry import KINDS, BenchParams, MatmulParams
from edgebench.results.store import Store


def first_number_field(cls: type[ProbeParams]) -> tuple[str, str, float]:
    """A numeric field with a lower bound: (name, kind, a value below it)."""
    for name, spec, _ in cls.fields():
        if spec.kind in ("int", "float") and spec.suite and (spec.minimum is not None or spec.positive):
            low = (spec.minimum if spec.minimum is not None else 0.0) - 1
            return name, spec.kind, low
    raise AssertionError(f"{cls.KIND} has no bounded number")


def bad_values(kind: str) -> list[tuple[str, Any, str]]:
    """(key, value, what the error says) for a misspelt, a mistyped and an out-of-range param."""
    cls = KINDS[kind].params
    name, number_kind, low = first_number_field(cls)
    misspelt = next(n for n, s, _ in cls.fields() if s.suite) + "z"
    return [
        (misspelt, 1, "unknown param"),
        (name, "many", "expected a whole number" if number_kind == "int" else "expected a number"),
        (name, low, "must be"),
    ]


CASES = [(kind, *case) for kind in sorted(KINDS) for case in bad_values(kind)]


@pytest.mark.parametrize(("kind", "key", "value", "says"), CASES)
def test_a_suite_refuses_bad_params_of_every_kind(
    tmp_path: Path,
    tiny_onnx: Path,
    kind: str,
    key: str,
    value: Any,
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = tmp_path / "keep.db"
    with Store(store) as st:
        st.import_records("earlier", [])
    suite = tmp_path / "s.toml"
    suite.write_text(
        f'devices = ["local"]\nmodels = ["m.onnx"]\n[[probe]]\nkind = "{kind}"\n'
        f"params = {{ {key} = {json.dumps(value)} }}\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(suite), "--store", str(store), "--json"])
    assert exit_info.value.code == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert f"s.toml: probe[0].params.{key}: " in lines[0] and says in lines[0], lines[0]
    assert out.out == ""
    with Store(store) as st:
        assert [r.run_id for r in st.runs()] == ["earlier"]


# The command line: each kind's verb, a model where it takes one, then the bad flag.
VERBS = {
    "bench": ["bench", "M"],
    "matmul": ["probe", "matmul"],
    "bandwidth": ["probe", "bandwidth"],
    "threads": ["probe", "threads", "--model", "M"],
    "thermal": ["probe", "thermal", "--model", "M"],
    "power": ["probe", "power", "--model", "M"],
    "profile": ["profile", "M"],
    "accuracy": ["accuracy", "M", "--reference", "M"],
    "sensitivity": ["sensitivity", "M"],
}


def cli_cases(kind: str) -> list[tuple[list[str], str]]:
    cls = KINDS[kind].params
    name, number_kind, low = first_number_field(cls)
    spec = next(s for n, s, _ in cls.fields() if n == name)
    flag = spec.cli_flag(name)
    return [
        ([flag + "z", "1"], "No such option"),
        ([flag, "many"], "Invalid value"),
        ([flag, f"{low:g}"], f"{flag}: must be"),
    ]


@pytest.mark.parametrize(
    ("kind", "argv", "says"), [(k, a, s) for k in sorted(VERBS) for a, s in cli_cases(k)]
)
def test_the_command_line_refuses_bad_params_of_every_kind(
    tmp_path: Path, tiny_onnx: Path, kind: str, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny_onnx)
    verb = [model if a == "M" else a for a in VERBS[kind]]
    with pytest.raises(SystemExit) as exit_info:
        main([*verb, *argv, "--store", str(tmp_path / "s.db")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "s.db").exists()  # refused before a run was even opened


def test_every_kind_is_complete() -> None:
    for name, kind in KINDS.items():
        assert kind.params.KIND == name
        kind.implementation("python")
        if kind.native:
            kind.implementation("native")
        for field, spec, _ in kind.params.fields():
            assert spec.help, (name, field)
            kind.params.parse({})  # every default is valid


def test_values_are_checked_and_normalised() -> None:
    p = MatmulParams.parse({"dtype": "fp32,int8", "threads": "1-3", "skinny": "1x4096x4096"})
    assert p.dtype == ("fp32", "int8") and p.threads == (1, 2, 3) and p.skinny == ((1, 4096, 4096),)
    assert MatmulParams.parse({"threads": "max"}).threads == "max"
    assert BenchParams.parse({"shapes": ["x=1x3x8x8"]}).shapes == {"x": (1, 3, 8, 8)}
    for bad in ({"runs": True}, {"max_seconds": math.nan}, {"max_seconds": math.inf}, {"shapes": {"x": [0]}}):
        with pytest.raises(ParamError):
            BenchParams.parse(bad)
    with pytest.raises(ParamError, match="max_seconds"):
        BenchParams.parse({"min_seconds": 5, "max_seconds": 2})
    with pytest.raises(ParamError, match="given twice"):
        BenchParams.parse({"shapes": ["x=1", "x=2"]})


def test_policy_never_reaches_record_identity() -> None:
    params = BenchParams.parse(
        {"threads": 2, "runs": 500, "seed": 7, "min_seconds": 3, "shapes": {"x": [1, 8]}}
    )
    ident = params.identity()
    assert ident == {"threads": 2, "shapes": {"x": [1, 8]}}
    for name, spec, _ in BenchParams.fields():
        if spec.role != IDENTITY:
            assert name not in ident


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--shap", "x=1x4"], "No such option"),
        (["--shape", "x=1xq"], "--shape: "),
        (["--shape", "x=0"], "--shape: "),
    ],
)
def test_roofline_refuses_bad_shapes(
    tmp_path: Path, tiny_onnx: Path, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["roofline", str(tiny_onnx), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
