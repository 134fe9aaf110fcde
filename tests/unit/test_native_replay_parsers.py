"""Parser tests through the whole native path: a stand-in runner on the emulated stock phone (real adb
server, no Python on the phone) prints a tool's captured output, or one written from the tool's print
statements (edgebench/native/fixtures, each naming its source), and records the argv it was given.

What these check is edgebench's side: the push of the runner, the argv mapping, the parse into records, the
profile pull, the error path, the sustained and power loops. The numbers asserted are the fixtures' own:
these are parser tests, not measurements. The real MNN benchmark.out is driven in
tests/integration/test_mnn_benchmark_real.py.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from edgebench.testing.adblab import write_descriptor
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration  # the real adb server and the emulated phone


def stock_phone(adb_phone_factory, tmp_path: Path, runners: str, env: str = ""):  # type: ignore[no-untyped-def]
    lab = adb_phone_factory(name="stock", path="/system/bin")
    write_descriptor(lab.lab_dir, "stock", lab.phone, extra=f'agent = "native"\n{env}\n[runners]\n' + runners)
    return lab


def replay_runner(
    folder: Path,
    fixture: str,
    exit_code: int = 0,
    delay_s: float = 0.0,
    busy_loops: int = 0,
    text: str | None = None,
) -> Path:
    """A /bin/sh script that prints a captured output of the tool (or `text`) and saves its argv on the
    phone (after `busy_loops` iterations of real CPU work, so a load-driven sandbox board sees it)."""
    if text is None:
        text = resources.files("edgebench.native").joinpath("fixtures", fixture).read_text()
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("# "))
    script = folder / f"replay-{fixture}.sh"
    script.write_text(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > /data/local/tmp/runner-args.txt\n"
        f"sleep {delay_s:g}\ni=0; while [ $i -lt {busy_loops} ]; do i=$((i+1)); done\n"
        f"cat <<'CAPTURED'\n{body}\nCAPTURED\nexit {exit_code}\n"
    )
    return script


def test_replay_bench_through_onnxruntime_perf_test(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runner = replay_runner(tmp_path, "onnxruntime_perf_test.acl.txt")
    lab = stock_phone(
        adb_phone_factory,
        tmp_path,
        f'onnxruntime_perf_test = {{ path = "onnxruntime_perf_test", push = "{runner}" }}\n',
    )
    res = edgebench(
        "bench",
        "builtin:convnet",
        "--device",
        "stock",
        "--lab",
        str(lab.lab_dir),
        "--threads",
        "2",
        "--runs",
        "8",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    got = {(r["metric"], r["params"].get("stat")): r for r in doc["records"]}
    assert got[("latency_ms", "p50")]["value"] == pytest.approx(16.7086)
    assert got[("latency_ms", "mean")]["value"] == pytest.approx(17.735)
    assert got[("load_ms", None)]["value"] == pytest.approx(27.3071)
    assert got[("first_inference_ms", None)]["value"] == 20
    assert ("latency_ms", "p99") not in got  # 8 runs cannot support the p99 the tool printed
    assert "p99 from 8 runs; dropped" in res.stderr
    p50 = got[("latency_ms", "p50")]
    assert (
        p50["annotations"]["aggregated_by"] == "tool" and p50["params"]["runner"] == "onnxruntime_perf_test"
    )
    assert p50["params"]["delegate"] == "cpu" and p50["params"]["precision"] == "fp32"
    assert p50["device"] == "stock" and p50["runtime"] == "onnxruntime"
    args = (lab.root / "data/local/tmp/runner-args.txt").read_text().split("\n")
    assert args[:3] == ["-I", "-S", "0"] and "-x" in args and args[args.index("-x") + 1] == "2"
    assert args[args.index("-r") + 1] == "8" and args[-2].endswith(".onnx")


def test_replay_distribution_from_repeated_invocations(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from edgebench.execution.oneshot import run_now
    from edgebench.jobs import Job
    from edgebench.models.refs import resolve_model

    runner = replay_runner(tmp_path, "mnn_benchmark.cpu_3.6.1.txt")  # prints convnet.mnn's line
    lab = stock_phone(
        adb_phone_factory, tmp_path, f'mnn_benchmark = {{ path = "benchmark.out", push = "{runner}" }}\n'
    )
    job = Job(
        "stock",
        "bench",
        resolve_model("builtin:convnet"),
        "mnn",
        {"runs": 1, "invocations": 12, "threads": 4},
    )
    shot = run_now(lab.spec(), [job], tmp_path / "s.db", "bench")
    shot.raise_first_error()
    stats = {r.params["stat"]: r for r in shot.records if r.metric == "latency_ms"}
    notes = stats["p50"].annotations
    assert notes["aggregated_by"] == "edgebench"
    assert notes["sample"] == "single inference" and notes["n"] == 12
    assert "p99" not in stats and "p90" not in stats  # 12 invocations: p90 needs 36, p99 368
    args = (lab.root / "data/local/tmp/runner-args.txt").read_text().split("\n")
    assert args[1:6] == ["1", "1", "0", "4", "0"]  # loop, warmup, forward=CPU, threads, precision fp32
    assert args[0].startswith("/data/local/tmp/edgebench/native/")


def test_replay_tool_error_becomes_one_line(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The status line of onnxruntime/core/graph/model.cc for a file protobuf cannot parse (no capture).
    corrupt = "# source: format string\nFailed to load model because protobuf parsing failed.\n"
    runner = replay_runner(tmp_path, "corrupt", exit_code=255, text=corrupt)
    lab = stock_phone(
        adb_phone_factory,
        tmp_path,
        f'onnxruntime_perf_test = {{ path = "onnxruntime_perf_test", push = "{runner}" }}\n',
    )
    res = edgebench("bench", "builtin:convnet", "--device", "stock", "--lab", str(lab.lab_dir), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "protobuf parsing failed" in res.stderr and "Traceback" not in res.stderr
    # The failure is kept in the store as an error record.
    out = edgebench("results", "--json", cwd=tmp_path)
    [err] = json.loads(out.stdout)["errors"]
    assert "protobuf parsing failed" in err["error"] and err["device"] == "stock"


def test_replay_sustained_run_through_the_runner_finds_the_cap(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`probe thermal` on the stock phone: runner invocations back to back, sensors from its own sh; the
    frequency cap the sandbox board applies is found as the throttle onset."""
    from edgebench.execution.oneshot import run_now
    from edgebench.jobs import Job
    from edgebench.models.refs import resolve_model
    from edgebench.testing.sysfs_sim import SysfsSim

    runner = replay_runner(tmp_path, "onnxruntime_perf_test.acl.txt", delay_s=0.1)
    lab = stock_phone(
        adb_phone_factory,
        tmp_path,
        f'onnxruntime_perf_test = {{ path = "onnxruntime_perf_test", push = "{runner}" }}\n',
    )
    with SysfsSim(lab.root, cap_at_s=4.0) as sim:
        job = Job(
            "stock",
            "thermal",
            resolve_model("builtin:convnet"),
            "onnxruntime",
            {"duration_s": 7.0, "window_s": 0.5, "period_s": 0.2, "runs": 8},
        )
        shot = run_now(lab.spec(), [job], tmp_path / "s.db", "probe")
        shot.raise_first_error()
        capped_at = sim.state()["capped_at"]
    rec = {(r.metric, r.params.get("signal")): r for r in shot.records if r.metric == "throttle_onset_s"}
    onset = rec[("throttle_onset_s", "freq_cap")].value
    assert onset is not None and rec[("throttle_onset_s", "first")].value == onset
    samples = [s for o in shot.outcomes for s in o.samples]
    origin = next(s.annotations["origin_monotonic_s"] for s in samples if s.metric == "sensor_t_s")
    # The phone's uptime clock and the host's monotonic clock are the same machine's here.
    assert abs((origin + onset) - capped_at) < 1.0, (origin, onset, capped_at)
    windows = sorted(
        (r for r in shot.records if r.metric == "freq_cap_mhz" and "t_s" in r.params),
        key=lambda r: r.params["t_s"],
    )
    assert windows[0].value > windows[-1].value
    assert all(r.params["runner"] == "onnxruntime_perf_test" for r in shot.records)


def test_replay_suite_mixes_python_and_native_devices(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One suite over the host (Python agent) and the stock phone (native runner); the report says which
    path measured what."""
    runner = replay_runner(tmp_path, "onnxruntime_perf_test.acl.txt")
    lab = stock_phone(
        adb_phone_factory,
        tmp_path,
        f'onnxruntime_perf_test = {{ path = "onnxruntime_perf_test", push = "{runner}" }}\n',
    )
    suite = tmp_path / "mixed.toml"
    suite.write_text(
        'name = "mixed"\ndevices = ["local", "stock"]\nmodels = ["builtin:convnet"]\n'
        '[[probe]]\nkind = "bench"\nparams = { threads = 1, runs = 20, min_seconds = 0 }\n'
    )
    res = edgebench("run", str(suite), "--lab", str(lab.lab_dir), "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    p50 = {
        r["device"]: r
        for r in doc["records"]
        if r["metric"] == "latency_ms" and r["params"].get("stat") == "p50"
    }
    assert set(p50) == {"local", "stock"}
    assert (
        p50["stock"]["params"]["runner"] == "onnxruntime_perf_test" and "runner" not in p50["local"]["params"]
    )
    out = tmp_path / "mixed.html"
    rep = edgebench("report", "--out", str(out), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    html = out.read_text()
    assert "native runners: onnxruntime_perf_test" in html and "python agent" in html
    assert "runner=onnxruntime_perf_test" in html


# runner, captured output, runtime, model, inferences per invocation by the tool's own counts
POWER_CASES = {
    "perf_test": (
        "onnxruntime_perf_test",
        "onnxruntime_perf_test.acl.txt",
        "onnxruntime",
        "builtin:convnet",
        9,
    ),
    "benchmark_model": (
        "benchmark_model",
        "benchmark_model.linux_default_current.txt",
        "litert",
        "builtin:mlp.tflite",
        113,
    ),
}


@pytest.mark.parametrize(
    ("case", "charging"), [("perf_test", False), ("perf_test", True), ("benchmark_model", False)]
)
def test_replay_power_through_the_runner_on_the_stock_phone(
    adb_phone_factory, tmp_path: Path, case: str, charging: bool
) -> None:  # type: ignore[no-untyped-def]
    """`probe power` on the stock phone: idle, the runner (doing real CPU work) back to back, idle; the
    sandbox board turns that work into battery current; a charging battery is refused. Energy per inference
    divides by the inferences the tool says it ran, warm-up included: perf_test's N + 1, benchmark_model's
    warm-up and timed counts (37 + 76 in its output, whatever `runs` was asked)."""
    import math

    from edgebench.execution.oneshot import run_now
    from edgebench.jobs import Job
    from edgebench.models.refs import resolve_model
    from edgebench.probes.power import ChargingError
    from edgebench.testing.sysfs_sim import SysfsSim

    name, captured, runtime, model, per_invocation = POWER_CASES[case]
    runner = replay_runner(tmp_path, captured, busy_loops=200000)
    lab = stock_phone(
        adb_phone_factory,
        tmp_path,
        f'{name} = {{ path = "{name}", push = "{runner}" }}\n',
        env='env = { EDGEBENCH_LOAD = "phone" }',
    )
    job = Job(
        "stock",
        "power",
        resolve_model(model),
        runtime,
        {"duration_s": 4.0, "idle_s": 2.0, "period_s": 0.2, "runs": 8},
    )
    with SysfsSim(lab.root, util_env="EDGEBENCH_LOAD=phone", charging=charging):
        shot = run_now(lab.spec(), [job], tmp_path / "s.db", "probe")
    if charging:
        [outcome] = shot.outcomes
        assert not outcome.ok and isinstance(outcome.exception, ChargingError)
        assert "Charging" in (outcome.error or "") and "monitor" in (outcome.error or "")
        return
    shot.raise_first_error()
    rec = {r.metric: r for r in shot.records if "phase" not in r.params}
    net, energy = rec["power_mw"].value, rec["energy_mj_per_inference"]
    assert net > 100  # the runner's CPU work shows as current above idle
    expected = net * energy.annotations["active_s"] / energy.annotations["inferences"]
    assert math.isclose(energy.value, expected, rel_tol=1e-6)
    assert energy.annotations["inferences"] % per_invocation == 0, energy.annotations["inferences"]
    assert rec["power_mw"].params["runner"] == name and rec["power_mw"].annotations["samples_idle"] > 5


def test_replay_bench_cli_maps_delegate_and_invocations(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runner = replay_runner(tmp_path, "onnxruntime_perf_test.acl.txt")
    lab = stock_phone(
        adb_phone_factory,
        tmp_path,
        f'onnxruntime_perf_test = {{ path = "onnxruntime_perf_test", push = "{runner}" }}\n',
    )
    res = edgebench(
        "bench",
        "builtin:convnet",
        "--device",
        "stock",
        "--lab",
        str(lab.lab_dir),
        "--runs",
        "8",
        "--delegate",
        "nnapi",
        "--invocations",
        "3",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    args = (lab.root / "data/local/tmp/runner-args.txt").read_text().split("\n")
    assert args[args.index("-e") + 1] == "nnapi"
    p50 = next(r for r in json.loads(res.stdout)["records"] if r["params"].get("stat") == "p50")
    assert p50["annotations"]["aggregated_by"] == "edgebench" and p50["annotations"]["n"] == 3
    assert p50["annotations"]["path"] == "nnapi" and p50["params"]["delegate"] == "nnapi"
    # On a Python device the runner options are refused, naming the device.
    bad = edgebench("bench", "builtin:convnet", "--delegate", "nnapi", cwd=tmp_path)
    assert bad.returncode == 2 and "--delegate applies to native runners; local" in bad.stderr


def test_replay_tflite_model_through_benchmark_model(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A .tflite model on a stock phone goes to benchmark_model; its records say what the tool says ran
    (the default XNNPACK delegate over the whole graph, fp32) and its peak, not its growth, is peak_rss_mb."""
    runner = replay_runner(tmp_path, "benchmark_model.chromeos_cpu.txt")
    lab = stock_phone(
        adb_phone_factory, tmp_path, f'benchmark_model = {{ path = "benchmark_model", push = "{runner}" }}\n'
    )
    res = edgebench(
        "bench", "builtin:mlp.tflite", "--device", "stock", "--lab", str(lab.lab_dir), "--threads", "2",
        "--runs", "50", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = {(r["metric"], r["params"].get("stat")): r for r in json.loads(res.stdout)["records"]}
    mean = got[("latency_ms", "mean")]
    assert mean["value"] == pytest.approx(56.2658) and mean["runtime"] == "litert"
    assert mean["params"]["delegate"] == "xnnpack" and mean["params"]["precision"] == "fp32"
    assert mean["annotations"]["delegated"] == "full" and mean["params"]["runner"] == "benchmark_model"
    assert got[("peak_rss_mb", None)]["value"] == pytest.approx(93.2383)
    args = (lab.root / "data/local/tmp/runner-args.txt").read_text().split("\n")
    assert "--num_threads=2" in args and "--warmup_min_secs=0.5" in args and args[0].startswith("--graph=")


def test_replay_perf_test_profile_is_collected_into_op_times(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`profile = true` on a stock phone: perf_test gets -p PREFIX; the profile onnxruntime writes at
    PREFIX_<date>.json (here a real one, made by onnxruntime's own profiler on the same model, 1 warm-up and
    8 timed runs like perf_test's) is pulled, parsed into op_time_ms records and removed from the phone."""
    import shutil

    from edgebench.agent.session_onnxruntime import OrtSession
    from edgebench.execution.oneshot import run_now
    from edgebench.jobs import Job
    from edgebench.models.refs import resolve_model

    model = resolve_model("builtin:convnet")
    session = OrtSession(str(model.path), threads=1, profile_prefix=str(tmp_path / "ort"))
    feeds = {"image": np.zeros((1, 3, 112, 112), np.float32)}
    for _ in range(9):
        session.outputs(feeds)
    profile = Path(session.end_profiling())
    shutil.copy(profile, tmp_path / "captured-profile.json")
    text = (
        resources.files("edgebench.native").joinpath("fixtures", "onnxruntime_perf_test.acl.txt").read_text()
    )
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("# "))
    script = tmp_path / "perf_test_profiling.sh"
    script.write_text(
        "#!/bin/sh\nprefix=''\nwhile [ $# -gt 1 ]; do [ \"$1\" = -p ] && prefix=$2; shift; done\n"
        f'cp "{tmp_path / "captured-profile.json"}" "${{prefix}}_2026-12-01_10-00-00.json"\n'
        f"cat <<'CAPTURED'\n{body}\nCAPTURED\n"
    )
    lab = stock_phone(
        adb_phone_factory, tmp_path, f'onnxruntime_perf_test = {{ path = "perf_test", push = "{script}" }}\n'
    )
    job = Job("stock", "bench", model, "onnxruntime", {"runs": 8, "profile": True, "threads": 1})
    shot = run_now(lab.spec(), [job], tmp_path / "s.db", "bench")
    shot.raise_first_error()
    ops = {r.params["node"]: r for r in shot.records if r.metric == "op_time_ms"}
    convs = [r for r in ops.values() if r.params["op_type"] == "Conv"]  # fused with their Relu: r0_nchwc...
    assert len(convs) == 4 and "fc" in ops and ops["fc"].params["op_type"] == "Gemm"
    assert all(r.value >= 0 for r in ops.values()) and sum(r.value for r in ops.values()) > 0
    assert not list((lab.root / "data/local/tmp/edgebench/tmp").glob("perf-*"))


@pytest.mark.parametrize(
    ("name", "captured", "runtime", "model"),
    [
        ("benchmark_model", "benchmark_model.profiling_tc2.txt", "litert", "builtin:mlp.tflite"),
        ("mnn_benchmark", "mnn_benchmark.cpu_3.6.1.txt", "mnn", "builtin:convnet"),
    ],
)
def test_replay_profile_true_pulls_only_perf_tests_file(
    adb_phone_factory, tmp_path: Path, name: str, captured: str, runtime: str, model: str
) -> None:  # type: ignore[no-untyped-def]
    """`profile = true` through benchmark_model (its op table is in its output) and benchmark.out (it has no
    profile: said) never looks for onnxruntime_perf_test's profile file."""
    from edgebench.execution.oneshot import run_now
    from edgebench.jobs import Job
    from edgebench.models.refs import resolve_model

    runner = replay_runner(tmp_path, captured)
    lab = stock_phone(adb_phone_factory, tmp_path, f'{name} = {{ path = "{name}", push = "{runner}" }}\n')
    job = Job("stock", "bench", resolve_model(model), runtime, {"runs": 10, "profile": True, "threads": 2})
    shot = run_now(lab.spec(), [job], tmp_path / "s.db", "bench")
    shot.raise_first_error()
    ops = [r for r in shot.records if r.metric == "op_time_ms"]
    warnings = [w for o in shot.outcomes for w in o.warnings]
    if name == "benchmark_model":
        assert len(ops) == 15 and "--enable_op_profiling=true" in runner_args(lab)
    else:
        assert not ops and any("no per-op profile" in w for w in warnings)
    assert not any("-p" == a for a in runner_args(lab))


def runner_args(lab) -> list[str]:  # type: ignore[no-untyped-def]
    """The argv the stand-in runner was given on the phone."""
    return (lab.root / "data/local/tmp/runner-args.txt").read_text().split("\n")


def test_replay_perf_test_cpu_fallback_partial_or_refused_when_required(
    adb_phone_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """perf_test asked for nnapi prints onnxruntime's fallback warning: the records say nnapi+cpu, partial,
    with the tool's line; with --require-backend the bench fails, naming it, and stores no latency."""
    runner = replay_runner(tmp_path, "onnxruntime_perf_test.nnapi_fallback_current.txt")
    lab = stock_phone(
        adb_phone_factory, tmp_path, f'onnxruntime_perf_test = {{ path = "perf_test", push = "{runner}" }}\n'
    )
    common = (
        "bench",
        "builtin:convnet",
        "--device",
        "stock",
        "--lab",
        str(lab.lab_dir),
        "--delegate",
        "nnapi",
    )
    res = edgebench(*common, "--runs", "20", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    mean = next(r for r in json.loads(res.stdout)["records"] if r["params"].get("stat") == "mean")
    assert mean["annotations"]["path"] == "nnapi+cpu" and mean["annotations"]["delegated"] == "partial"
    assert "Some nodes were not assigned" in mean["annotations"]["placement_evidence"]
    assert mean["annotations"]["inputs"] == "generated by the tool (-I), random with seed 0 (-S)"  # float
    bad = edgebench(*common, "--runs", "20", "--require-backend", "--store", "r.db", cwd=tmp_path)
    assert bad.returncode == 1, bad.stderr
    assert "nnapi is required" in bad.stderr and "Traceback" not in bad.stderr
    assert "latency_ms" not in edgebench("results", "--store", "r.db", "--json", cwd=tmp_path).stdout
