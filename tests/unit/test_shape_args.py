"""--shape for verbs that take several models: plain for all, MODEL:INPUT=DIMS for one, duplicates refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebench.cli.shapes import check_plain_used, parse_shape_args, shapes_for
from edgebench.errors import UserError

MODELS = ["det", "rec"]
INPUTS = {"det": {"x": 4}, "rec": {"x": 4, "len": 1}}


def test_per_model_shapes_override_plain_ones_for_that_model_only() -> None:
    args = parse_shape_args(["x=1x3x64x64", "rec:x=1x3x48x320"], MODELS)
    assert shapes_for(args, ["det"], INPUTS["det"], "det") == {"x": [1, 3, 64, 64]}
    assert shapes_for(args, ["rec"], INPUTS["rec"], "rec") == {"x": [1, 3, 48, 320]}
    colon = parse_shape_args(["input:0=1x4"], MODELS)  # a TensorFlow-style name is a plain input
    assert colon.plain == {"input:0": [1, 4]}


@pytest.mark.parametrize(
    "items, message",
    [
        (["x=1x3x64x64", "x=1x3x32x32"], "input 'x' of every model is given twice"),
        (["det:x=1x3x64x64", "det:x=1x3x32x32"], "input 'x' of model det is given twice"),
        (["x=1x0"], "positive dimensions"),
        (["x"], "expected NAME=DIMS"),
    ],
)
def test_bad_or_duplicate_shapes_are_one_line_errors(items: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_shape_args(items, MODELS)


def test_errors_name_the_model_a_shape_does_not_fit() -> None:
    with pytest.raises(UserError, match="input 'x' of det has 4 dimensions, not 2"):
        shapes_for(parse_shape_args(["x=1x3"], MODELS), ["det"], INPUTS["det"], "det")
    with pytest.raises(UserError, match="det has no input 'len'"):
        shapes_for(parse_shape_args(["det:len=4"], MODELS), ["det"], INPUTS["det"], "det")
    with pytest.raises(UserError, match="no model has an input 'y'"):
        check_plain_used(parse_shape_args(["y=1x2"], MODELS), INPUTS)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from edgebench.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


def test_roofline_and_fit_take_per_model_shapes_and_refuse_duplicates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["roofline", "builtin:mlp", "--shape", "mlp:x=4x1024", "--json"], capsys)
    flops = next(r for r in json.loads(out)["records"] if r["metric"] == "flops")
    assert code == 0 and flops["params"]["shapes"] == {"x": [4, 1024]}
    matmuls, adds, relus = 2 * (1024 * 2048 + 2048 * 2048 + 2048 * 1024), 2048 + 2048 + 1024, 2048 + 2048
    assert flops["value"] == 4 * (matmuls + adds + relus)  # counted at batch 4
    code, _, err = run_cli(["roofline", "builtin:mlp", "--shape", "x=1x1024", "--shape", "x=2x1024"], capsys)
    assert code == 2 and err.strip().endswith("input 'x' of every model is given twice")
    code, _, err = run_cli(["bench", "builtin:mlp", "--shape", "x=1x1024", "--shape", "x=2x1024"], capsys)
    assert code == 2 and "input 'x' is given twice" in err
    from edgebench.results.store import Store

    with Store(tmp_path / "s.db"):
        pass
    argv = ["fit", "--store", str(tmp_path / "s.db"), "-m", "builtin:mlp", "-m", "builtin:convnet"]
    code, _, err = run_cli([*argv, "--shape", "convnet:x=1x1024"], capsys)
    assert code == 2 and "builtin:convnet has no input 'x'" in err
