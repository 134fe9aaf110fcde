"""Bad input to variants / accuracy / profile / sensitivity: one line naming the file, field or device,
exit 2, no traceback, and nothing already stored is lost."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebench.cli import main


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture
def model(tmp_path: Path) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    path = tmp_path / "tiny.onnx"
    onnx.save(m, path)
    return path


def one_line_error(code: int, err: str, expected_code: int, *needles: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("edgebench: error:")]
    assert code == expected_code, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_bad_input_is_one_line_exit_2_and_the_store_keeps_its_runs(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "s.db"
    code, out, err = cli(
        capsys,
        "variants",
        str(model),
        "--out",
        str(tmp_path / "v"),
        "--only",
        "int8-dynamic",
        "--store",
        str(store),
        "--json",
    )
    assert code == 0, err
    document = json.loads(out)
    assert [r["params"]["variant"] for r in document["records"] if r["metric"] == "size_bytes"] == [
        "fp32",
        "int8-dynamic",
    ]
    variant = tmp_path / "v" / "tiny.int8-dynamic.onnx"
    assert variant.is_file()

    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, z=np.ones((1, 8), np.float32))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 10)
    s = ["--store", str(store)]
    cases = [
        (
            ["variants", str(tmp_path / "missing.onnx"), "--out", str(tmp_path / "v")],
            ["missing.onnx", "not found"],
        ),
        (["variants", str(corrupt), "--out", str(tmp_path / "v")], ["corrupt.onnx", "not a valid ONNX"]),
        (
            ["variants", str(model), "--out", str(tmp_path / "v"), "--calib", str(tmp_path / "no.npz")],
            ["no.npz"],
        ),
        (["variants", str(model), "--out", str(tmp_path / "v"), "--calib", str(wrong)], ["wrong.npz", "'x'"]),
        (
            ["variants", str(model), "--out", str(tmp_path / "v"), "--only", "int4"],
            ["unknown variant 'int4'"],
        ),
        (["variants", str(model), "--out", str(tmp_path / "v"), "--shape", "nope=1x8"], ["nope"]),
        (["variants", str(model), "--out", str(tmp_path / "v"), "--shape", "x=1xA"], ["--shape"]),
        (["accuracy", str(variant), "--reference", str(tmp_path / "gone.onnx"), *s], ["gone.onnx"]),
        (
            ["accuracy", str(variant), "--reference", str(model), "--inputs", str(tmp_path / "in.npz"), *s],
            ["in.npz"],
        ),
        (
            ["accuracy", str(variant), "--reference", str(model), "--device", "nope", *s],
            ["unknown device 'nope'"],
        ),
        (["accuracy", str(variant), *s], ["--reference"]),
        (["profile", str(model), "--device", "nope", *s], ["unknown device 'nope'"]),
        (["profile", str(model), "--runtime", "tflite", *s], ["LiteRT runs .tflite models"]),
        (["profile", str(model), "--inputs", str(wrong), *s], ["no array 'x'"]),
        (["sensitivity", str(model), "--bits", "9", *s], ["--bits: must be at most 8"]),
        (["sensitivity", str(tmp_path / "v" / "tiny.fp32.mnn"), *s], ["fp32.mnn"]),
    ]
    for argv, needles in cases:
        code, out, err = cli(capsys, *argv)
        one_line_error(code, err, 2, *needles)
        assert out == "", argv
    with sqlite3.connect(store) as db:
        runs = [r[0] for r in db.execute("SELECT kind FROM runs")]
        assert runs.count("variants") == 1
        [(n,)] = db.execute("SELECT COUNT(*) FROM records WHERE probe='variants'").fetchall()
        assert n == 4  # size_bytes and size_ratio of fp32 and int8-dynamic


def test_accuracy_of_a_model_against_itself_is_exact(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "accuracy", str(model), "--reference", str(model), "--no-store", "--json")
    assert code == 0, err
    got = {r["metric"]: r["value"] for r in json.loads(out)["records"]}
    assert got["max_abs_err"] == 0 and got["cosine"] == pytest.approx(1.0) and got["snr_db"] == 200.0
