"""Suites: strict loading (errors name the file and key), the plan's grid, stable job keys, CLI exit 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgebench.descriptors import load_lab
from edgebench.errors import ConfigError
from edgebench.execution.suite import check_devices, load_suite, plan


def tiny_model(path: Path) -> Path:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def write(folder: Path, text: str, name: str = "suite.toml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    tiny_model(tmp_path / "models" / "enc.onnx")
    tiny_model(tmp_path / "models" / "enc-int8.onnx")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.npz").write_bytes(b"not really npz")
    return tmp_path


HEAD = 'devices = ["local"]\nmodels = ["models/enc.onnx"]\n'
BENCH = '[[probe]]\nkind = "bench"\n'

FULL = """
name = "nightly"
devices = ["local", "board"]
models = ["models/enc.onnx", {name = "enc8", path = "models/enc-int8.onnx"}]
timeout = 300
[[probe]]
kind = "bench"
params = { threads = [1, 2, 4], runs = 50, runtime = ["onnxruntime", "mnn"], inputs = "data/in.npz" }
[[probe]]
kind = "bench"
models = ["enc8"]
devices = ["board"]
params = { affinity = [[0, 1], [2, 3]], shapes = { x = [1, 4] } }
[[gate]]
metric = "latency_ms"
stat = "p50"
max_slowdown = "5%"
[budget]
latency_p99_ms = 15
memory_mb = 60
[policy]
retries = 1
quarantine_after = 2
backoff = 0.5
store_timeout = 5
"""


def test_full_suite_loads_and_plans_the_grid(suite_dir: Path) -> None:
    suite = load_suite(write(suite_dir, FULL))
    assert suite.name == "nightly" and suite.devices == ("local", "board")
    assert [m.name for m in suite.models] == ["enc", "enc8"]
    assert suite.models[1].path == (suite_dir / "models" / "enc-int8.onnx").resolve()
    assert suite.gates[0].max_slowdown == pytest.approx(0.05) and suite.gates[0].stat == "p50"
    assert suite.budget == {"latency_p99_ms": 15.0, "memory_mb": 60.0}
    assert suite.policy.retries == 1 and suite.policy.quarantine_after == 2 and suite.policy.backoff_s == 0.5
    assert suite.policy.store_timeout_s == 5.0

    jobs = plan(suite)
    # probe 1: 2 devices x 2 models x 3 threads x 2 runtimes; probe 2: board x enc8 x 2 affinities
    assert len(jobs) == 2 * 2 * 3 * 2 + 2
    assert len({j.key for j in jobs}) == len(jobs)
    first = jobs[0]
    assert first.device == "local" and first.runtime == "onnxruntime" and "runtime" not in first.params
    assert first.timeout_s == 300
    assert first.params["inputs"] == str((suite_dir / "data" / "in.npz").resolve())  # relative to the suite
    pinned = [j for j in jobs if "affinity" in j.params]
    assert {tuple(j.params["affinity"]) for j in pinned} == {(0, 1), (2, 3)}  # a wrapped list is one value
    assert all(j.device == "board" and j.model.name == "enc8" for j in pinned)
    assert pinned[0].params["shapes"] == {"x": [1, 4]}  # a table is one value
    # Device by device, in the suite's order: the executor runs each device's jobs in series.
    devices = [j.device for j in jobs]
    assert devices == sorted(devices, key=["local", "board"].index)


def test_job_keys_are_stable_across_loads_and_processes(suite_dir: Path) -> None:
    path = write(suite_dir, FULL)
    keys = [j.key for j in plan(load_suite(path))]
    assert keys == [j.key for j in plan(load_suite(path))]
    code = (
        "import sys; from edgebench.execution.suite import load_suite, plan; "
        "print('\\n'.join(j.key for j in plan(load_suite(sys.argv[1]))))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    assert other.stdout.split() == keys
    # A CLI --timeout bounds the calls but does not make different jobs.
    assert [j.key for j in plan(load_suite(path), timeout_s=5)] == keys


def test_model_free_probes_run_once_per_device(suite_dir: Path) -> None:
    path = write(
        suite_dir,
        """
        devices = ["local", "board"]
        models = ["models/enc.onnx", "models/enc-int8.onnx"]
        [[probe]]
        kind = "bandwidth"
        [[probe]]
        kind = "bench"
        params = { threads = [1, 2] }
    """,
    )
    jobs = plan(load_suite(path))
    bandwidth = [j for j in jobs if j.probe == "bandwidth"]
    assert [(j.device, j.model, j.runtime) for j in bandwidth] == [
        ("local", None, None),
        ("board", None, None),
    ]
    assert len([j for j in jobs if j.probe == "bench"]) == 2 * 2 * 2


def test_builtin_models_and_mnn_files_pick_their_runtime(suite_dir: Path) -> None:
    (suite_dir / "net.mnn").write_bytes(b"\x00mnn")
    path = write(
        suite_dir,
        """
        devices = ["local"]
        models = ["builtin:mlp", "net.mnn"]
        [[probe]]
        kind = "bench"
    """,
    )
    suite = load_suite(path)
    assert [m.name for m in suite.models] == ["mlp", "net"]
    assert {(j.model.name, j.runtime) for j in plan(suite)} == {("mlp", "onnxruntime"), ("net", "mnn")}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (HEAD + "reps = 3\n" + BENCH, "reps: unknown key"),
        (HEAD + BENCH + "param = {}\n", "probe[0].param: unknown key"),
        (HEAD + '[[probe]]\nkind = "benchh"\n', "probe[0].kind: unknown probe 'benchh'"),
        (
            'devices = ["local"]\nmodels = ["models/gone.onnx"]\n[[probe]]\nkind = "bench"\n',
            "models[0]: models/gone.onnx: model file not found",
        ),
        (HEAD + BENCH + "[budget]\nlatency_ms = 3\n", "budget.latency_ms: unknown budget"),
        (HEAD + BENCH + "[budget]\npower_mw = 3\n", "budget.power_mw: unknown budget"),
        (
            HEAD + BENCH + '[[gate]]\nmetric = "latency_ms"\n',
            "gate[0]: give max_slowdown, max_increase or max_drop",
        ),
        (
            HEAD + BENCH + '[[gate]]\nmetric = "cosine"\nmax_drop = "150%"\n',
            "gate[0].max_drop: a drop must be below",
        ),
        (
            HEAD + BENCH + '[[gate]]\nmetric = "latency_ms"\nmax_slowdown = "five"\n',
            "gate[0].max_slowdown: expected a percentage",
        ),
        (  # read as a fraction, "10" would allow 1000%: every pair would pass
            HEAD + BENCH + '[[gate]]\nmetric = "latency_ms"\nmax_slowdown = "10"\n',
            "gate[0].max_slowdown: '10' has no %: write \"10%\"",
        ),
        (
            HEAD + BENCH + '[[gate]]\nmetric = "peak_rss_mb"\nmax_increase = 10\n',
            "gate[0].max_increase: 10 as a fraction is 1000%",
        ),
        (HEAD + BENCH + "[policy]\nretry = 3\n", "policy.retry: unknown key"),
        (HEAD + BENCH + "[policy]\nstore_timeout = 0\n", "policy.store_timeout: must be a positive number"),
        (HEAD + BENCH + "params = {threads = []}\n", "probe[0].params.threads: an empty list gives no jobs"),
        (
            HEAD + BENCH + 'params = {runtime = "tflite"}\n',
            "probe[0].params.runtime: unknown runtime 'tflite'",
        ),
        (HEAD + BENCH + 'models = ["nope"]\n', "probe[0].models[0]: not a model of this suite: 'nope'"),
        (
            HEAD + BENCH + 'devices = ["rpi"]\n',
            "probe[0].devices[0]: 'rpi' is not one of the suite's devices",
        ),
        (
            'devices = ["local"]\nmodels = ["models/enc.onnx", "models/enc.onnx"]\n[[probe]]\nkind = "bench"\n',
            "models[1]: model name 'enc' is used twice",
        ),
        ('devices = ["local"]\n[[probe]]\nkind = "bench"\n', "probe[0].kind: probe 'bench' needs models"),
        (HEAD, "probe: a suite needs at least one"),
        ('devices = "local"\n', "devices: expected list"),
        ('devices = ["local"\n', "malformed TOML"),
        (
            HEAD + '[[probe]]\nkind = "accuracy"\nparams = {refrence = "x.onnx"}\n',
            "probe[0].params.refrence: unknown param",
        ),
    ],
)
def test_bad_suites_name_the_file_and_key(suite_dir: Path, body: str, where: str) -> None:
    path = write(suite_dir, body)
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and where in message, message
    assert "\n" not in message


def test_unknown_device_is_named_with_its_position(suite_dir: Path) -> None:
    path = write(suite_dir, 'devices = ["local", "pixel9"]\nmodels = ["models/enc.onnx"]\n' + BENCH)
    with pytest.raises(ConfigError, match=r"suite.toml: devices\[1\]: unknown device 'pixel9'.*known: local"):
        check_devices(load_suite(path), load_lab(suite_dir / "devices"))


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgebench", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_run_refuses_bad_suites_with_exit_2_one_line_and_keeps_the_store(suite_dir: Path) -> None:
    from edgebench.results.store import Store

    store = suite_dir / "keep.db"
    with Store(store) as st:  # something already stored must survive a bad invocation
        st.import_records("earlier", [])
    cases = {
        "unknown-key.toml": HEAD + "repeat = 2\n" + BENCH,
        "unknown-device.toml": 'devices = ["nowhere"]\nmodels = ["models/enc.onnx"]\n' + BENCH,
        "missing-model.toml": 'devices = ["local"]\nmodels = ["models/none.onnx"]\n' + BENCH,
        "malformed.toml": "devices = [local]\n",
    }
    for name, body in cases.items():
        path = write(suite_dir, body, name)
        res = run_cli(
            "run",
            str(path),
            "--store",
            str(store),
            "--lab",
            str(suite_dir / "devices"),
            "--json",
            cwd=suite_dir,
        )
        assert res.returncode == 2, (name, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("edgebench: error: ") and name in lines[0], res.stderr
        assert "Traceback" not in res.stderr and res.stdout == ""
    ok = write(suite_dir, HEAD + BENCH, "ok.toml")
    res = run_cli("run", str(ok), "--store", str(store), "--resume", "no-such-run", cwd=suite_dir)
    assert (
        res.returncode == 2
        and "unknown --resume run 'no-such-run'" in res.stderr
        and "Traceback" not in res.stderr
    )
    with Store(store) as st:
        assert [r.run_id for r in st.runs()] == ["earlier"]


REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_suites_load_and_plan(tmp_path: Path) -> None:
    smoke = load_suite(REPO / "suites" / "smoke.toml")
    check_devices(smoke, load_lab(REPO / "devices"))
    jobs = plan(smoke)
    assert {j.device for j in jobs} == {"local"}
    assert {j.probe for j in jobs} >= {"bench", "matmul", "bandwidth"}
    free = [j for j in jobs if j.model is None]  # matmul and bandwidth: no model, at each benched count
    assert sorted((j.probe, j.params.get("threads"), bool(j.params.get("sweep"))) for j in free) == [
        ("bandwidth", 1, False),  # STREAM triad
        ("bandwidth", 1, True),  # the memory-hierarchy sweep
        ("bandwidth", 2, True),
        ("matmul", 1, False),
        ("matmul", 2, False),
    ]
    benched = {j.params.get("threads") for j in jobs if j.probe == "bench"}
    assert benched == {1, 2}
    assert len({j.model for j in jobs if j.probe == "bench"}) >= 6

    # The shipped nightly runs on a fresh machine: its devices are the repository's own lab (local).
    shipped = load_suite(REPO / "suites" / "nightly.toml")
    check_devices(shipped, load_lab(REPO / "devices"))
    assert shipped.devices == ("local",) and {j.probe for j in plan(shipped)} >= {
        "bench",
        "matmul",
        "roofline",
    }
    # the nightly gate can FAIL: every bench configuration is measured in three invocations
    assert {j.invocation for j in plan(shipped) if j.probe == "bench"} == {1, 2, 3}
    assert {j.runtime for j in plan(shipped) if j.probe == "bench"} == {"onnxruntime", "mnn", "ncnn"}

    nightly = load_suite(REPO / "suites" / "examples" / "nightly-fleet.toml")
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "pixel8.toml").write_text('transport = "adb"\nserial = "37281FDJH000XY"\n')
    (lab / "rpi5.toml").write_text('transport = "ssh"\nhost = "10.0.0.12"\n')
    check_devices(nightly, load_lab(lab))
    jobs = plan(nightly)
    assert {j.probe for j in jobs if j.device == "pixel8"} >= {"thermal", "power"}
    assert not {j.probe for j in jobs if j.device == "rpi5"} & {"thermal", "power"}
    assert {j.runtime for j in jobs if j.probe == "bench"} == {"onnxruntime", "mnn"}


def test_probe_modules_check_their_param_values_at_load(suite_dir: Path) -> None:
    path = write(suite_dir, HEAD + '[[probe]]\nkind = "thermal"\nparams = {duration_s = -5}\n')
    with pytest.raises(ConfigError, match=r"suite.toml: probe\[0\].params.duration_s: must be positive"):
        load_suite(path)


def test_a_reference_param_may_name_a_suite_model(suite_dir: Path) -> None:
    path = write(
        suite_dir,
        """
        devices = ["local"]
        models = [{name = "fp32", path = "models/enc.onnx"}, {name = "int8", path = "models/enc-int8.onnx"}]
        [[probe]]
        kind = "accuracy"
        models = ["int8"]
        params = { reference = "fp32" }
    """,
    )
    [job] = plan(load_suite(path))
    assert job.model.name == "int8"
    assert job.params["reference"] == str((suite_dir / "models" / "enc.onnx").resolve())
