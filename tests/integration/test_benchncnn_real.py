"""The real ncnn `benchncnn` (../shared/lab-tools/ncnn-20260722-linux-x86_64, BUILD.md there) driven as a phone
lab drives it: pushed to the emulated phone that has no Python, and on the host as a native device (local
transport, agent = "native"). The built-in models are converted to ncnn on the host and only the .param is
pushed (benchncnn never reads the .bin).

The runner each device is given is a small sh wrapper pushed with the real binary beside it: it runs the
binary with edgebench's argv and keeps a copy of what it printed, so the test reads the avg benchncnn printed
in the very invocation edgebench parsed and stored: the stored record must equal it (2 decimals, no timing
noise between). Percentiles are refused, the per-layer build's layer times add up to about its avg, and a
param benchncnn cannot load is a one-line error naming the file.

The tool is looked for in $EDGEBENCH_LAB_TOOLS, then in shared/lab-tools beside the repository or any folder
above it (edgebench.testing.labtools); without it these tests skip, saying so, except under CI (CI=true),
where the lab tools are part of the machine and their absence fails.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from edgebench.models.builtin import builtin_model
from edgebench.models.refs import resolve_model
from edgebench.probes.common import model_file_for
from edgebench.testing.adblab import write_descriptor
from edgebench.testing.cli import edgebench
from edgebench.testing.labtools import tool_or_skip

pytestmark = pytest.mark.integration

TOOL_DIR = "ncnn-20260722-linux-x86_64"
LOOPS = 20
PHONE_LOG = "/data/local/tmp/benchncnn-printed.txt"
# Per-layer build: the layers' mean times against the same invocation's avg. Layers run one after the other,
# so their sum cannot exceed the run (plus 0.005 ms of rounding per layer); what is outside the layers
# (extractor, input, the printing of every layer) is a few percent on this machine (0.95-1.00 measured on
# convnet and mlp): generous bounds both sides.
LAYERS_LOW, LAYERS_HIGH = 0.5, 1.05


@pytest.fixture(scope="module")
def tool() -> Path:
    return tool_or_skip(Path(__file__).resolve().parents[2], TOOL_DIR, "benchncnn", "ncnn benchncnn")


class NativeDevice(NamedTuple):
    lab: Path  # the lab folder holding its descriptor
    name: str
    printed: Path  # where, on the host, the wrapper's copy of the tool's output is read


def wrapper(folder: Path, binary: str, log: str) -> Path:
    """A /bin/sh runner: the real `binary` beside it run with edgebench's argv, its output (all on stderr)
    copied to `log` and passed on, its exit code returned."""
    script = folder / f"{binary}-kept.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'b="${{0%/*}}/{binary}"\n'
        'chmod 755 "$b" 2>/dev/null\n'  # pushed as a library: its mode is not the runner's
        f'"$b" "$@" 2>"{log}"\nrc=$?\ncat "{log}" >&2\nexit $rc\n'
    )
    return script


def runners_toml(tool: Path, folder: Path, log: str, binary: str = "benchncnn") -> str:
    script = wrapper(folder, binary, log)
    return f'benchncnn = {{ path = "{script.name}", push = "{script}", libs = ["{tool / binary}"] }}\n'


@pytest.fixture(params=["stock_phone", "local_native"])
def device_factory(request: pytest.FixtureRequest, tool: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """make(binary) -> NativeDevice: the emulated phone without Python (adbd runs the tool), or the host
    as a native device, given `binary` (benchncnn or benchncnn-layers) behind the wrapper."""

    def make(binary: str = "benchncnn") -> NativeDevice:
        folder = tmp_path / binary
        folder.mkdir(exist_ok=True)
        if request.param == "stock_phone":
            lab = request.getfixturevalue("adb_phone_factory")(name="stock", path="/system/bin")
            runners = runners_toml(tool, folder, PHONE_LOG, binary)
            write_descriptor(lab.lab_dir, "stock", lab.phone, extra='agent = "native"\n[runners]\n' + runners)
            return NativeDevice(lab.lab_dir, "stock", lab.root / PHONE_LOG.lstrip("/"))
        lab_dir = folder / "lab"
        lab_dir.mkdir()
        log = folder / "printed.txt"
        (lab_dir / "host-native.toml").write_text(
            f'name = "host-native"\ntransport = "local"\nagent = "native"\nworkdir = "{folder / "work"}"\n'
            "[runners]\n" + runners_toml(tool, folder, str(log), binary)
        )
        return NativeDevice(lab_dir, "host-native", log)

    return make


def bench(device: NativeDevice, model: str, cwd: Path, threads: int) -> subprocess.CompletedProcess[str]:
    return edgebench(
        "bench", model, "--runtime", "ncnn", "--device", device.name, "--lab", str(device.lab),
        "--threads", str(threads), "--runs", str(LOOPS), "--timeout", "300", "--json", cwd=cwd,
    )  # fmt: skip


def printed_stats(device: NativeDevice) -> dict[str, float]:
    """min, max and avg as benchncnn printed them in the invocation the wrapper last ran."""
    text = device.printed.read_text()
    [line] = [ln for ln in text.splitlines() if " avg = " in ln]
    found = re.search(r"min =\s*([\d.]+)\s+max =\s*([\d.]+)\s+avg =\s*([\d.]+)", line)
    assert found, line
    return {"min": float(found[1]), "max": float(found[2]), "mean": float(found[3])}


def stored(cwd: Path) -> list[dict]:  # type: ignore[type-arg]
    res = edgebench("results", "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["records"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("model", ["convnet", "mlp"])
def test_stored_record_is_what_benchncnn_printed(
    device_factory, model: str, threads: int, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    device = device_factory()
    res = bench(device, f"builtin:{model}", tmp_path, threads)
    assert res.returncode == 0, res.stderr
    printed = printed_stats(device)
    records = stored(tmp_path)
    latency = {r["params"]["stat"]: r for r in records if r["metric"] == "latency_ms"}
    print(
        f"\n{device.name} {model} threads={threads}: benchncnn avg {printed['mean']:.2f} ms, "
        f"stored mean {latency['mean']['value']:.2f} ms (min {printed['min']:.2f}, max {printed['max']:.2f})"
    )
    assert set(latency) == {"min", "max", "mean"}  # the tool's aggregates; no percentile invented
    for stat, value in printed.items():
        assert latency[stat]["value"] == value, stat  # the same invocation: equal, not close
    assert {r["metric"] for r in json.loads(res.stdout)["records"]} == {"latency_ms"}
    mean = latency["mean"]
    assert mean["runtime"] == "ncnn" and mean["device"] == device.name
    assert mean["params"]["runner"] == "benchncnn" and mean["params"]["backend"] == "cpu"
    assert mean["params"]["threads"] == threads and mean["params"]["precision"] == "low"
    notes = mean["annotations"]
    assert notes["aggregated_by"] == "tool" and notes["n"] == LOOPS and notes["path"] == "cpu"
    assert "numerics need the Python agent" in notes["weights"]
    assert "prints only max, mean, min" in res.stderr  # percentiles refused, said
    assert f"num_threads = {threads}" in device.printed.read_text()
    assert f"loop_count = {LOOPS}" in device.printed.read_text()


@pytest.mark.parametrize("model", ["convnet", "mlp"])
def test_per_layer_build_layers_add_up_to_its_avg(device_factory, model: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    device = device_factory("benchncnn-layers")
    res = bench(device, f"builtin:{model}", tmp_path, 1)
    assert res.returncode == 0, res.stderr
    printed = printed_stats(device)
    records = json.loads(res.stdout)["records"]
    ops = {r["params"]["node"]: r["value"] for r in records if r["metric"] == "op_time_ms"}
    graph = model_file_for(resolve_model(f"builtin:{model}"), "ncnn").read_text().splitlines()[2:]
    layers = [ln.split()[1] for ln in graph if ln.split() and ln.split()[0] != "Input"]
    assert set(ops) == set(layers), (ops, layers)  # every layer but the Input, timed
    total = sum(ops.values())
    print(f"\n{device.name} {model}: layers {total:.3f} ms, benchncnn-layers avg {printed['mean']:.2f} ms")
    assert LAYERS_LOW * printed["mean"] <= total <= LAYERS_HIGH * printed["mean"] + 0.005 * len(ops)
    mean = next(r for r in records if r["metric"] == "latency_ms" and r["params"]["stat"] == "mean")
    assert mean["value"] == printed["mean"] and mean["params"]["layer_timing"] is True
    assert "per-layer build" in res.stderr


def test_a_param_benchncnn_cannot_load_is_one_line_naming_the_file(device_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A graph that passes the host's checks (the magic, its .bin beside it) but holds a layer type ncnn
    lacks: benchncnn prints ncnn's message and avg = 0.00; edgebench stores nothing and says which file."""
    device = device_factory()
    param = model_file_for(resolve_model("builtin:convnet"), "ncnn")
    lines = param.read_text().splitlines()
    bad = tmp_path / "fancypool.param"
    bad.write_text("\n".join(ln.replace("Pooling", "FancyPool", 1) for ln in lines) + "\n")
    (tmp_path / "fancypool.bin").write_bytes(param.with_suffix(".bin").read_bytes())
    res = bench(device, str(bad), tmp_path, 1)
    assert res.returncode != 0 and res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "fancypool.param" in errors[0] and "no layer type 'FancyPool'" in errors[0]
    assert "avg =    0.00" in device.printed.read_text()  # what the tool itself said of it
    assert not [r for r in stored(tmp_path) if r["metric"] == "latency_ms"]


def test_profile_on_a_device_without_python_is_the_per_layer_builds_times_and_feeds_the_predictor(
    device_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """`profile` on a native device: each layer's time as benchncnn-layers printed it (the mean of the timed
    loops, read here from the wrapper's copy), each layer's shapes and work from the graph on the host; the
    kernel predictor reads the profile as the layers the graph side predicts, and its reference is the
    tool's avg (no p50 invented)."""
    from edgebench.analysis.kernel_predict import profiled_runs
    from edgebench.results.store import Store
    from edgebench.runtimes import runtime

    device = device_factory("benchncnn-layers")
    res = edgebench(
        "profile", "builtin:convnet", "--runtime", "ncnn", "--device", device.name, "--lab", str(device.lab),
        "--threads", "1", "--runs", str(LOOPS), "--timeout", "300", "--json", "--store", tmp_path / "s.db",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)["records"]
    lines = [
        ln.split() for ln in device.printed.read_text().splitlines() if re.match(r"^\w+\s+\S+\s+[\d.]+ms", ln)
    ]
    printed: dict[str, list[float]] = {}
    for _kind, name, value, *_ in lines:
        printed.setdefault(name, []).append(float(value.removesuffix("ms")))
    ops = [r for r in records if r["metric"] == "op_time_ms"]
    assert [r["params"]["node"] for r in ops] == list(printed)  # every layer, in the order it ran
    for r in ops:
        timed = printed[r["params"]["node"]][-LOOPS:]  # the warm-up loops print too
        assert r["value"] == pytest.approx(sum(timed) / len(timed), abs=1e-9)
    [mean] = [r for r in records if r["metric"] == "latency_ms"]
    assert mean["params"]["stat"] == "mean" and mean["value"] == printed_stats(device)["mean"]
    with Store(tmp_path / "s.db") as store:
        [run] = profiled_runs(store.records())
    predicted = runtime("ncnn").own_graph_kernels()(builtin_model("convnet"), {})
    work = lambda k: (k.name, k.op_type, k.kind, k.flops, k.weight_bytes, k.bytes)  # noqa: E731
    assert [work(k) for k, _ in run.kernels] == [work(k) for k in predicted]
    assert run.latency_ms == mean["value"]
