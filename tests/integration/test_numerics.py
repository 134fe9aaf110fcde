"""Variants, accuracy, per-op profiles and quantization sensitivity, end to end through the CLI.

Two models: a generated MLP (2 MB of weights) and a real model shipped inside a wheel (rapidocr's PP-OCR
text-direction classifier, weights held in Constant nodes as paddle2onnx exports them). Variants are made
once per module; the device checks run the same body on `local`, a real ssh board and an emulated adb
phone, with outputs and profiler traces pulled through each transport.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgebench.models.builtin import build_mlp
from edgebench.probes.profile import SPEED_REFERENCES
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

ONNX_INT8 = ("int8-dynamic", "int8-static")
NCNN = ("ncnn-fp32", "ncnn-fp16")
ALL_VARIANTS = ("fp16", "int8-dynamic", "int8-static", "mnn-fp32", "mnn-int8-weight", "mnn-int8", *NCNN)


def records_of(res: subprocess.CompletedProcess[str]) -> list[dict]:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)["records"]


@dataclass(frozen=True)
class Subject:
    """A model under test: its fp32 file, the shapes it is run at, and its variants (name -> path)."""

    name: str
    path: Path
    shape: str  # --shape for accuracy, profile and sensitivity
    variants: dict[str, Path]
    sizes: dict[str, int]
    stderr: str


def wheel_model(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (scripts/install-test-deps.sh installs it)")
    path = Path(list(spec.submodule_search_locations)[0], *parts)
    if not path.is_file():
        pytest.skip(f"{path} missing from the {package} wheel")
    return path


def weight_nodes(path: Path) -> set[str]:
    """Independent count: main-graph Conv/Gemm/MatMul nodes whose weight is a Constant or an initializer."""
    model = onnx.load(str(path))
    constant = {i.name for i in model.graph.initializer}
    constant |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    position = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
    return {
        n.name for n in model.graph.node if n.op_type in position and n.input[position[n.op_type]] in constant
    }


def make_variants(name: str, model: Path, out: Path, *extra: str) -> Subject:
    res = edgebench(
        "variants", str(model), "--out", str(out), "--store", str(out / "v.db"), "--json", *extra, cwd=out
    )
    document = json.loads(res.stdout) if res.stdout.strip() else {}
    assert res.returncode == 0, res.stderr[-3000:]
    assert document["errors"] == [], document["errors"]
    sizes = {
        r["params"]["variant"]: int(r["value"]) for r in document["records"] if r["metric"] == "size_bytes"
    }
    paths = {
        r["params"]["variant"]: Path(r["params"]["path"])
        for r in document["records"]
        if r["metric"] == "size_bytes" and r["params"]["variant"] != "fp32"
    }
    return Subject(name, model, "", paths, sizes, res.stderr)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Subject:
    """A generated MLP (256 -> 512 -> 512 -> 256), calibrated from an .npz of a 16-row batch."""
    folder = tmp_path_factory.mktemp("mlp-variants")
    model = folder / "mlp_small.onnx"
    onnx.save(build_mlp(hidden=512, width=256, layers=3), model)
    calib = folder / "calib.npz"
    np.savez(calib, x=np.random.default_rng(5).standard_normal((16, 256)).astype(np.float32))
    subject = make_variants("mlp_small", model, folder, "--calib", str(calib))
    # batch 64: about 1 ms per inference, so per-op times are well above the profiler's resolution
    return Subject(subject.name, model, "x=64x256", subject.variants, subject.sizes, subject.stderr)


@pytest.fixture(scope="module")
def ocr_cls(tmp_path_factory: pytest.TempPathFactory) -> Subject:
    """PP-OCR's text-direction classifier from the rapidocr wheel; random calibration at 1x3x48x192."""
    model = wheel_model("rapidocr_onnxruntime", "models", "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    folder = tmp_path_factory.mktemp("cls-variants")
    subject = make_variants(
        "ch_ppocr_mobile_v2.0_cls_infer", model, folder, "--shape", "x=1x3x48x192", "--samples", "4"
    )
    return Subject(subject.name, model, "x=1x3x48x192", subject.variants, subject.sizes, subject.stderr)


@pytest.fixture(params=["mlp", "ocr_cls"])
def subject(request: pytest.FixtureRequest) -> Subject:
    return request.getfixturevalue(request.param)


def test_variants_are_made_and_int8_onnx_is_at_most_035_of_fp32(subject: Subject) -> None:
    assert set(subject.variants) == set(ALL_VARIANTS)
    for name, path in subject.variants.items():
        files = [path, path.with_suffix(".bin")] if name in NCNN else [path]  # an ncnn graph and its weights
        assert all(f.is_file() for f in files) and sum(f.stat().st_size for f in files) == subject.sizes[name]
    fp32 = subject.sizes["fp32"]
    assert fp32 == subject.path.stat().st_size
    for name in ONNX_INT8:
        assert subject.sizes[name] <= 0.35 * fp32, (name, subject.sizes[name] / fp32)
    assert subject.sizes["fp16"] <= 0.75 * fp32
    assert subject.sizes["mnn-int8-weight"] <= 0.35 * fp32
    # fp32 weights and a text graph (an ONNX file holding weights in Constant nodes is larger); fp16 halves
    assert 0.7 * fp32 <= subject.sizes["ncnn-fp32"] <= 1.1 * fp32
    assert subject.sizes["ncnn-fp16"] <= 0.6 * subject.sizes["ncnn-fp32"]
    manifest = json.loads(next(subject.variants["fp16"].parent.glob("*.variants.json")).read_text())
    assert {v["name"] for v in manifest["variants"]} == set(ALL_VARIANTS)


def check_ncnn_variants(subject: Subject, common: list[str], tmp_path: Path) -> None:
    """The ncnn variants (two files each, pushed together) against the fp32 reference on the device, on
    inputs the test gives, held against onnxruntime and a bare ncnn loop run here on the same arrays: the
    fp32 graph matches onnxruntime within 1e-5 of the output's scale, the fp16 weights' difference is
    reported, and the reported errors are the ones measured here."""
    from edgebench.testing.bare import bare_ncnn

    shape = (1, 256) if subject.name.startswith("mlp") else (1, 3, 48, 192)  # as the variants were made
    x = np.random.default_rng(11).uniform(-1, 1, size=shape).astype(np.float32)
    inputs = tmp_path / "ncnn-inputs.npz"
    np.savez(inputs, x=x)
    records = records_of(
        edgebench(
            "accuracy", *(str(subject.variants[v]) for v in NCNN), "--reference", str(subject.path),
            "--inputs", str(inputs), "--threads", "1", "--json", *common, cwd=tmp_path,
        )
    )  # fmt: skip
    import onnxruntime as ort

    session = ort.InferenceSession(str(subject.path), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    reference = session.run([name], {"x": x})[0]
    errors = {}
    for variant in NCNN:
        path = subject.variants[variant]
        ours = bare_ncnn(str(path), {"x": x}, threads=1, runs=1, warmup_s=0).outputs[0]
        errors[variant] = float(np.max(np.abs(ours.ravel() - reference.ravel())))
        got = {
            r["metric"]: r["value"]
            for r in records
            if r["model"] == path.name.rsplit(".", 1)[0] and r["params"]["output"] == name
        }
        assert got["max_abs_err"] == pytest.approx(errors[variant], rel=1e-3, abs=1e-12), variant
        assert got["cosine"] >= 0.999, variant
    scale = float(np.max(np.abs(reference)))
    assert errors["ncnn-fp32"] <= 1e-5 * scale, errors
    assert errors["ncnn-fp16"] > errors["ncnn-fp32"], errors  # fp16 weights change the numbers, and it shows


def test_random_calibration_is_loud_and_recorded(ocr_cls: Subject, mlp: Subject) -> None:
    assert "WARNING" in ocr_cls.stderr and "RANDOM" in ocr_cls.stderr
    manifest = json.loads(next(ocr_cls.variants["fp16"].parent.glob("*.variants.json")).read_text())
    by_name = {v["name"]: v for v in manifest["variants"]}
    assert by_name["int8-static"]["params"]["calibration"] == "random"
    assert by_name["mnn-int8"]["params"]["calibration"] == "random"
    assert by_name["mnn-int8"]["params"]["shapes"] == {"x": [1, 3, 48, 192]}
    # the MLP was calibrated from a file: no warning, the file is named, its batch split into 16 samples
    assert "RANDOM" not in mlp.stderr
    mlp_manifest = json.loads(next(mlp.variants["fp16"].parent.glob("*.variants.json")).read_text())
    static = {v["name"]: v for v in mlp_manifest["variants"]}["int8-static"]["params"]
    assert static["calibration"] == "calib.npz" and static["samples"] == 16


def test_accuracy_profile_and_sensitivity_on_every_transport(
    subject: Subject, lab_device: tuple[Path, str], tmp_path: Path
) -> None:
    lab, device = lab_device
    common = ["--device", device, "--lab", str(lab), "--timeout", "240", "--store", str(tmp_path / "s.db")]

    # accuracy: every variant against the fp32 reference, all in one run, outputs pulled as .npz
    variants = [str(subject.variants[v]) for v in ALL_VARIANTS if v not in NCNN]
    shape = "x=4x256" if subject.name.startswith("mlp") else subject.shape
    records = records_of(
        edgebench(
            "accuracy",
            *variants,
            "--reference",
            str(subject.path),
            "--shape",
            shape,
            "--json",
            *common,
            cwd=tmp_path,
        )
    )
    got = {(r["params"]["variant"], r["metric"]): r["value"] for r in records}
    stems = {v: subject.variants[v].name.rsplit(".", 1)[0] for v in ALL_VARIANTS}
    for variant in ALL_VARIANTS:
        if variant in NCNN:
            continue
        for metric in ("max_abs_err", "mean_abs_err", "cosine", "snr_db"):
            assert got[(stems[variant], metric)] is not None, (variant, metric)
    assert got[(stems["mnn-fp32"], "cosine")] >= 0.9999
    assert got[(stems["fp16"], "cosine")] >= 0.999
    for variant in ("int8-dynamic", "int8-static", "mnn-int8-weight", "mnn-int8"):
        assert got[(stems[variant], "max_abs_err")] > 0  # int8 really changed the numbers...
        assert got[(stems[variant], "cosine")] > 0.9  # ...and is still the same model
    assert {r["device"] for r in records} == {device}
    assert all(r["params"]["reference_device"] == "device" and r["params"]["output"] for r in records)
    check_ncnn_variants(subject, common, tmp_path)

    # profile: per-op times add up to the measured latency within 30%, on onnxruntime and on MNN. The agent
    # leaves op timings far slower than the same op's others out (the device was busy) where the p50 keeps
    # them: beside two busy loops a sub-millisecond model's ops added up to 0.69 of it (0.77 of 1.11 ms).
    # So out of the band the profile is taken again; still out, the product must have said so, and far out
    # of it (a lost op, a wrong unit) it fails whatever the load.
    for runtime, model in (("onnxruntime", subject.path), ("mnn", subject.variants["mnn-fp32"])):
        for _ in range(2):
            res = edgebench(
                "profile", str(model), "--runtime", runtime, "--threads", "1", "--runs", "30",
                "--shape", subject.shape, "--json", *common, cwd=tmp_path,
            )  # fmt: skip
            records = records_of(res)
            ops = [r for r in records if r["metric"] == "op_time_ms"]
            assert ops and all(r["params"]["node"] and r["params"]["op_type"] for r in ops)
            latency = next(
                r["value"] for r in records if r["metric"] == "latency_ms" and r["params"]["stat"] == "p50"
            )
            total = sum(r["value"] for r in ops)
            if 0.7 <= total / latency <= 1.3:
                break
        # the speed references, pushed through the transport and timed around the plain runs
        refs = {r["params"]["reference"]: r["value"] for r in records if r["metric"] == "speed_reference_ms"}
        assert len(refs) == len(SPEED_REFERENCES) and all(v > 0 for v in refs.values()), (runtime, refs)
        assert 0.4 <= total / latency <= 2.5, (runtime, total, latency)
        assert 0.7 <= total / latency <= 1.3 or "per-op times add up to" in res.stderr, (
            runtime,
            total,
            latency,
        )

    # sensitivity: every weight layer of the model gets a cosine, ranked from the most sensitive
    records = records_of(
        edgebench(
            "sensitivity", str(subject.path), "--bits", "8", "--shape", shape, "--json", *common, cwd=tmp_path
        )
    )
    cosines = [r for r in records if r["metric"] == "cosine"]
    assert {r["params"]["node"] for r in cosines} == weight_nodes(subject.path)
    assert [r["annotations"]["rank"] for r in cosines] == list(range(1, len(cosines) + 1))
    values = [r["value"] for r in cosines]
    assert values == sorted(values) and all(0.9 < v <= 1.0 + 1e-9 for v in values)
    assert all(r["params"]["bits"] == 8 for r in cosines)


def test_reference_runs_on_the_host_when_the_device_cannot(mlp: Subject, tmp_path: Path) -> None:
    """A device whose Python has MNN but no onnxruntime: the fp32 ONNX reference runs on the host, and the
    records and the warning say so; the MNN variant still runs on the device, on the same inputs."""
    blocker = tmp_path / "no-onnxruntime" / "onnxruntime"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('onnxruntime is not installed on this device')\n")
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "mnnonly.toml").write_text(
        'transport = "local"\n'
        f'workdir = "{tmp_path / "mnnonly-workdir"}"\n'
        f'env = {{ PYTHONPATH = "{blocker.parent}" }}\n'
    )
    res = edgebench(
        "accuracy",
        str(mlp.variants["mnn-fp32"]),
        "--reference",
        str(mlp.path),
        "--shape",
        "x=2x256",
        "--device",
        "mnnonly",
        "--lab",
        str(lab),
        "--no-store",
        "--json",
        cwd=tmp_path,
    )
    records = records_of(res)
    assert "ran on the host" in res.stderr
    assert {r["params"]["reference_device"] for r in records} == {"host"}
    assert {r["device"] for r in records} == {"mnnonly"}
    cosine = next(r["value"] for r in records if r["metric"] == "cosine")
    assert cosine >= 0.9999


def test_a_suite_benches_and_checks_every_variant_in_one_run(mlp: Subject, tmp_path: Path) -> None:
    models = [mlp.path, mlp.variants["int8-dynamic"], mlp.variants["mnn-fp32"], mlp.variants["mnn-int8"]]
    suite = tmp_path / "variants.toml"
    suite.write_text(
        'name = "variants"\ndevices = ["local"]\n'
        f"models = {json.dumps([str(m) for m in models])}\n"
        '[[probe]]\nkind = "bench"\n'
        "params = { runs = 10, threads = 1, min_seconds = 0.0, shapes = { x = [1, 256] } }\n"
        '[[probe]]\nkind = "accuracy"\n'
        f'params = {{ reference = "{mlp.path}", shapes = {{ x = [2, 256] }} }}\n'
    )
    res = edgebench("run", str(suite), "--store", str(tmp_path / "s.db"), "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    document = json.loads(res.stdout)
    assert document["status"] == "ok" and document["errors"] == []
    names = {m.name.rsplit(".", 1)[0] for m in models}
    records = document["records"]
    for probe, metric in (("bench", "latency_ms"), ("accuracy", "cosine")):
        assert {r["model"] for r in records if r["probe"] == probe and r["metric"] == metric} == names
    cosine = {r["model"]: r["value"] for r in records if r["metric"] == "cosine"}
    assert cosine[mlp.path.stem] == pytest.approx(1.0) and cosine[f"{mlp.path.stem}.fp32"] >= 0.9999
    assert {r["runtime"] for r in records if r["model"].endswith((".fp32", ".int8"))} == {"mnn"}
