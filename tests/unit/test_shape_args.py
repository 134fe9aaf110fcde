"""--shape for verbs that take several models: plain for all, MODEL:INPUT=DIMS for one, duplicates refused."""

from __future__ import annotations

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
