"""An ncnn model is two files, a `.param` graph and its `.bin` weights found by name: they are checked,
hashed, pushed and kept as one model, and the graph pnnx writes speaks of the ONNX model's tensors."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from edgebench.descriptors import builtin_local
from edgebench.errors import ModelError
from edgebench.jobs import ModelRef, ncnn_weights_of
from edgebench.lab.device import Device
from edgebench.lab.hashing import HashCache
from edgebench.models.convert_ncnn import check_ncnn_layers, name_blobs, param_layers
from edgebench.models.refs import check_model_file
from edgebench.results.models import ModelStore

PARAM = """7767517
4 4
Input                    in0                      0 1 in0
Convolution              convrelu_0               1 1 in0 1 0=8 1=3 5=1 6=216 9=1
Reshape                  reshape_1                1 1 1 2 6="1, 2, 3"
InnerProduct             linear_2                 1 1 2 out0 0=10 1=1 2=80
"""


def pair(folder: Path, param: str = PARAM, weights: bytes = b"\x00" * 64, stem: str = "net") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.param"
    path.write_text(param)
    ncnn_weights_of(path).write_bytes(weights)
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_param_file_is_an_ncnn_model_of_two_files(tmp_path: Path) -> None:
    ref = ModelRef("net", tmp_path / "net.ncnn.param")
    assert ref.format == "ncnn"
    assert ref.files == (tmp_path / "net.ncnn.param", tmp_path / "net.ncnn.bin")
    assert ModelRef("m", tmp_path / "m.onnx").files == (tmp_path / "m.onnx",)


def test_check_refuses_a_bad_param_and_a_missing_weights_file_naming_them(tmp_path: Path) -> None:
    good = pair(tmp_path)
    check_model_file(good)
    bad = tmp_path / "bad.param"
    bad.write_text("not ncnn\n1 1\n")
    with pytest.raises(ModelError, match=r"bad\.param: not an ncnn param file"):
        check_model_file(bad)
    ncnn_weights_of(good).unlink()
    with pytest.raises(ModelError, match=r"net\.param: the ncnn weights file net\.bin is missing beside it"):
        check_model_file(good)


def test_layers_are_read_and_an_unknown_layer_type_is_named(tmp_path: Path) -> None:
    pytest.importorskip("ncnn")
    path = pair(tmp_path)
    assert param_layers(path)[:2] == [("Input", "in0"), ("Convolution", "convrelu_0")]
    check_ncnn_layers(path)
    unknown = pair(tmp_path, PARAM.replace("InnerProduct ", "pnnx.Expression "), stem="odd")
    with pytest.raises(ModelError, match=r"ncnn has no layer type 'pnnx\.Expression' \(layer 'linear_2'\)"):
        check_ncnn_layers(unknown)
    broken = pair(tmp_path, PARAM.replace("0 1 in0\n", "0\n"), stem="broken")
    with pytest.raises(ModelError, match=r"broken\.param:3: malformed ncnn layer line"):
        param_layers(broken)


def test_blobs_take_the_onnx_names_and_the_input_its_shape(tmp_path: Path) -> None:
    path = pair(tmp_path)
    name_blobs(path, (["image"], ["logits"]), [[1, 3, 32, 48]])
    lines = path.read_text().splitlines()
    assert lines[2].split() == ["Input", "in0", "0", "1", "image", "0=48", "1=32", "2=3"]
    assert lines[3].split()[4:6] == ["image", "1"]
    assert lines[4].endswith('6="1, 2, 3"')  # params are kept as written, spaces in a string included
    assert lines[5].split()[5] == "logits"
    spaced = pair(tmp_path, stem="spaced")
    name_blobs(spaced, (["an input"], ["y"]), [[1, 16]])  # a name the text format cannot hold keeps pnnx's
    assert spaced.read_text().splitlines()[2].split() == ["Input", "in0", "0", "1", "in0", "0=16"]


def test_the_content_of_a_pair_names_both_files(tmp_path: Path) -> None:
    path = pair(tmp_path / "a")
    hashes = HashCache()
    files = ModelRef("net", path).files
    zeros = bytes(64)
    expected = sha(f"{sha(PARAM.encode())} {sha(zeros)}".encode())
    assert hashes.content(files) == expected
    assert hashes.content(files[:1]) == sha(PARAM.encode())
    other = pair(tmp_path / "b", weights=b"\x01" * 64)  # same graph, other weights: another model
    assert HashCache().content(ModelRef("net", other).files) != expected


def test_the_store_keeps_both_files_under_one_name(tmp_path: Path) -> None:
    path = pair(tmp_path / "src")
    store = ModelStore(tmp_path / "kept")
    kept = store.keep(path, companions=[ncnn_weights_of(path)])
    assert kept.path is not None and kept.path.name == f"{kept.sha256}.param"
    assert kept.path.read_text() == PARAM
    assert ncnn_weights_of(kept.path).read_bytes() == b"\x00" * 64
    assert ModelRef("net", kept.path).files[1].is_file()  # a re-measure finds the weights by name
    assert store.keep(path, expected=f"sha256:{'0' * 64}", companions=[ncnn_weights_of(path)]).path is None


def test_the_device_pushes_the_pair_under_one_stem(tmp_path: Path) -> None:
    path = pair(tmp_path / "src")
    spec = replace(builtin_local(), workdir=str(tmp_path / "device"))
    with Device(spec) as device:
        remote = Path(device.ensure_model(path, 30.0))
        assert remote.suffix == ".param" and remote.read_text() == PARAM
        assert ncnn_weights_of(remote).read_bytes() == b"\x00" * 64
        ncnn_weights_of(path).write_bytes(b"\x02" * 64)  # new weights: a new pair on the device
        again = Path(device.ensure_model(path, 30.0))
        assert again != remote and ncnn_weights_of(again).read_bytes() == b"\x02" * 64
        single = tmp_path / "src" / "m.onnx"
        single.write_bytes(b"onnx")
        assert Path(device.ensure_model(single, 30.0)).name == f"{sha(b'onnx')}.onnx"


def test_counts_read_a_shape_without_its_batch_axis_as_ncnn_records_it() -> None:
    from edgebench.analysis.cost import analyze
    from edgebench.errors import UserError
    from edgebench.models.builtin import builtin_model

    path = builtin_model("convnet")
    with_batch = analyze(path, shapes={"image": [1, 3, 64, 64]})
    assert analyze(path, shapes={"image": [3, 64, 64]}).flops == with_batch.flops
    with pytest.raises(UserError, match="rank 2 but the model declares 4"):
        analyze(path, shapes={"image": [64, 64]})


def test_a_cluster_worker_keeps_the_pair_side_by_side(tmp_path: Path) -> None:
    """A controller ships a job's files to a worker by content; an ncnn graph and its weights land in one
    folder, so the worker's copy of the graph finds its weights by name."""
    from edgebench.descriptors import Lab
    from edgebench.execution.cluster import DeviceService, host_files
    from edgebench.jobs import Job

    path = pair(tmp_path / "src")
    job = Job("board", "bench", ModelRef("net", path))
    files = host_files(job, HashCache())
    assert set(files) == {str(path), str(ncnn_weights_of(path))}
    assert len({f.folder for f in files.values()}) == 1  # one folder for the pair
    assert {f.sha256 for f in files.values()} == {sha(PARAM.encode()), sha(bytes(64))}
    worker = DeviceService(Lab({}), [], files_dir=tmp_path / "worker")
    assert sorted(worker.missing_files(files)) == sorted(files)
    worker.store_files(files, {p: Path(p).read_bytes() for p in files})
    assert worker.missing_files(files) == []
    local = worker.local_job(job, files).model
    assert local is not None and local.path.read_text() == PARAM
    assert ModelRef("net", local.path).files[1].read_bytes() == bytes(64)
    with pytest.raises(Exception, match="does not match its sha256"):
        worker.store_files(files, {str(path): b"tampered"})
