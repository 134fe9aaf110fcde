"""`probe thermal` and `probe power` on boards whose sensors are a load-driven sandbox sysfs tree.

The simulator (edgebench.testing.sysfs_sim) turns the board's CPU load into temperature, frequency and
battery current. The board's load is the agent (tagged through the descriptor's `env`) plus the
simulator's CPU burners, so other work on the host does not move its sensors. At a chosen moment it
caps the frequency and starts burners pinned to the agent's CPU: the model really slows down.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgebench.testing.cli import edgebench
from edgebench.testing.sysfs_sim import SysfsSim

pytestmark = pytest.mark.integration

MODEL = "builtin:convnet"
IDLE_C = 35.0


PINNED = ("--threads", "1", "--affinity", "0")  # one inference thread, on CPU 0


def probe_power(
    lab: Path, duration: str, idle: str, *extra: object, cwd: Path, device: str = "board"
) -> subprocess.CompletedProcess[str]:
    """`edgebench probe power` of MODEL on a device of the test lab, idle phases of `idle` seconds."""
    return edgebench(
        "probe", "power", "--model", MODEL, "--device", device, "--lab", lab, "--duration-s", duration,
        "--idle-s", idle, *extra, cwd=cwd,
    )  # fmt: skip


def board_tag() -> tuple[str, dict[str, str]]:
    """(--util-env value for the simulator, descriptor env) marking this board's agent processes."""
    value = uuid.uuid4().hex[:12]
    return f"EB_BOARD={value}", {"EB_BOARD": value}


def records_by(doc: dict[str, Any], metric: str, **params: Any) -> list[dict[str, Any]]:
    return [
        r
        for r in doc["records"]
        if r["metric"] == metric and all(r["params"].get(k) == v for k, v in params.items())
    ]


def one(doc: dict[str, Any], metric: str, **params: Any) -> float | None:
    found = records_by(doc, metric, **params)
    assert len(found) == 1, (metric, params, found)
    return found[0]["value"]


def stored_samples(db: Path, metric: str, **params: Any) -> tuple[list[float], dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT vals, params, annotations FROM samples WHERE metric=?", (metric,))
        for vals, ident, notes in rows:
            p = {**json.loads(ident), **json.loads(notes)}
            if all(p.get(k) == v for k, v in params.items()):
                return json.loads(vals), p
    raise AssertionError(f"no samples {metric} {params} in {db}")


def trace_power(sim: SysfsSim, origin: float, span: list[float], trim: float) -> float:
    """Mean power (mW) the simulated gauge showed inside a phase: |current| x voltage."""
    rows = [r for r in sim.trace() if span[0] + trim <= r["t_monotonic"] - origin <= span[1] - trim]
    assert rows, span
    return float(np.mean([abs(r["current_ua"]) / 1000 * r["voltage_uv"] / 1e6 for r in rows]))


def expected_idle_and_net_mw(sim: SysfsSim, db: Path, trim: float = 0.5) -> tuple[float, float]:
    """What the simulated gauge showed over the probe's idle phases, and active minus that."""
    bounds, p = stored_samples(db, "phase_bounds_s")
    spans = dict(zip(p["phases"], [bounds[i : i + 2] for i in range(0, len(bounds), 2)], strict=True))
    origin = p["origin_monotonic_s"]
    idle = float(np.mean([trace_power(sim, origin, spans[k], trim) for k in ("idle_before", "idle_after")]))
    return idle, trace_power(sim, origin, spans["active"], trim) - idle


def expected_net_mw(sim: SysfsSim, db: Path) -> float:
    return expected_idle_and_net_mw(sim, db)[1]


def reads_match_the_gauge(sim: SysfsSim, db: Path) -> float:
    """Median relative gap between each power reading the probe stored and what the simulated gauge showed
    at that instant (the last row it wrote before the read): the probe read the gauge it meant, when it
    says it did. (The phase means are then a 4 Hz sample of a jittering load, held to a looser bound.)"""
    times, p = stored_samples(db, "power_t_s")
    powers, _ = stored_samples(db, "power_mw")
    rows = sim.trace()
    at = np.array([r["t_monotonic"] - p["origin_monotonic_s"] for r in rows])
    gauge = np.array([abs(r["current_ua"]) / 1000 * r["voltage_uv"] / 1e6 for r in rows])
    idx = np.searchsorted(at, np.asarray(times), side="right") - 1
    keep = idx >= 0
    shown = gauge[idx[keep]]
    return float(np.median(np.abs(np.asarray(powers)[keep] - shown) / shown))


def agent_task_running(tag: str, kind: str) -> bool:
    """Whether an agent process of this board (its environment carries `tag`) runs a task of `kind`.

    The probe starts several agents (staging, the cool-down guard, then the run): only the run's own
    process says the sustained loop is near."""
    key, value = tag.split("=", 1)
    needle, marker = f'"kind":"{kind}"'.encode(), f"{key}={value}".encode()
    for proc_dir in Path("/proc").iterdir():
        try:
            if (
                needle in (proc_dir / "cmdline").read_bytes()
                and marker in (proc_dir / "environ").read_bytes()
            ):
                return True
        except OSError:  # not a process, or it ended while we looked
            continue
    return False


def wait_for_load(
    sim: SysfsSim, proc: subprocess.Popen[str], tag: str, kind: str, busy_s: float = 1.0, timeout: float = 90
) -> None:
    """Until the agent running the `kind` task has kept the board busy for `busy_s` without a break.

    Busy is a low bar (5% of the board's CPUs): on a crowded host the agent gets little CPU. Busy before
    that agent exists (staging, the cool-down guard's own agent) does not count: the guard then waits for
    the board to cool, which beside other work took seconds and moved the run's start past the cap."""
    deadline, since = time.monotonic() + timeout, None
    while time.monotonic() < deadline and proc.poll() is None:
        busy = sim.state()["util"] > 0.05 and agent_task_running(tag, kind)
        since = (since or time.monotonic()) if busy else None
        if since is not None and time.monotonic() - since >= busy_s:
            return
        time.sleep(0.1)
    ended = (
        f" (it exited {proc.returncode}: {proc.communicate()[1][-500:]})" if proc.poll() is not None else ""
    )
    raise AssertionError(f"the {kind} run never loaded the board{ended}")


def test_thermal_finds_the_onset_and_the_sustained_ratio(tmp_path: Path) -> None:
    util_env, env = board_tag()
    db = tmp_path / "results.db"
    argv = ["probe", "thermal", "--model", MODEL, "--device", "board", "--lab", tmp_path / "lab",
            "--threads", "1", "--affinity", "0", "--duration-s", "20", "--window-s", "1", "--margin", "1.0",
            "--idle-c", IDLE_C, "--cooldown-timeout-s", "20", "--json", "--store", db]  # fmt: skip
    with SysfsSim(tmp_path / "board", burners=6, burner_cpus=(0,), util_env=util_env, tau_s=2.0,
                  idle_c=IDLE_C) as sim:  # fmt: skip
        sim.write_descriptor(tmp_path / "lab", env=env)
        proc = subprocess.Popen([sys.executable, "-m", "edgebench", *map(str, argv)], cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            # Throttle some 7 s into the run, however long the start took on this host.
            wait_for_load(sim, proc, util_env, "thermal")
            time.sleep(5.0)
            sim.cap_now()
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        state = sim.state()
    res = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    starts, p = stored_samples(db, "inference_t_s", series="inference")
    lats, _ = stored_samples(db, "latency_ms", series="inference")
    cap_t = state["capped_at"] - p["origin_monotonic_s"]
    assert 2.5 < cap_t < 15.0, f"the cap came at {cap_t:.1f} s of the run: the test setup is off"

    # Onset: the cap is seen at the next sensor sample; the latency doubling (--margin 1.0: well above what
    # the host's other work does to it) within a couple of windows.
    assert one(doc, "throttle_onset_s", signal="freq_cap") == pytest.approx(cap_t, abs=0.6)
    assert one(doc, "throttle_onset_s", signal="latency") == pytest.approx(cap_t, abs=2.5)
    assert one(doc, "throttle_onset_s", signal="first") == pytest.approx(cap_t, abs=2.5)

    # Sustained ratio: initial (first 2 s) over steady (last 5 s) median latency, from the raw inferences;
    # six burners on the agent's CPU leave it a seventh of it, so at least a 2x slowdown, and the same
    # slowdown (give or take the host's own noise) as the raw inferences show around the cap.
    starts_a, lats_a = np.array(starts), np.array(lats)
    ratio = one(doc, "sustained_ratio")
    assert ratio == pytest.approx(
        np.median(lats_a[starts_a < 2.0]) / np.median(lats_a[starts_a >= 15.0]), rel=0.02
    )
    assert ratio < 0.5
    around_cap = np.median(lats_a[starts_a < cap_t]) / np.median(lats_a[starts_a > cap_t + 1.0])
    assert 0.5 < ratio / around_cap < 2.0  # a crowded host alone can move latency by up to 2x
    assert one(doc, "stability") < 0.5

    # Series for plots: one point per window for latency, temperature, clock and cap.
    windows = records_by(doc, "latency_ms", stat="p50")
    windows = [r for r in windows if "t_s" in r["params"]]
    assert [r["params"]["t_s"] for r in windows] == pytest.approx([i + 0.5 for i in range(20)])
    temps = [r["value"] for r in records_by(doc, "temp_c", zone="max") if "t_s" in r["params"]]
    assert len(temps) == 20 and max(temps) > IDLE_C + 3  # the load heated the board
    caps = [r["value"] for r in records_by(doc, "freq_cap_mhz") if "t_s" in r["params"]]
    assert caps[0] == pytest.approx(2400) and caps[-1] == pytest.approx(1000)
    clocks = [r["value"] for r in records_by(doc, "freq_mhz") if "t_s" in r["params"]]
    assert len(clocks) == 20 and clocks[-1] <= 1000
    assert one(doc, "cooldown_s") is not None
    assert doc["summary"]["sustained_ratio"] == ratio
    temps_raw, _ = stored_samples(db, "temp_c", sensor="temp:cpu-thermal")
    assert len(temps_raw) >= 60  # 4 Hz for 20 s, kept raw


def test_power_is_net_of_idle_and_energy_matches_latency(tmp_path: Path) -> None:
    util_env, env = board_tag()
    db = tmp_path / "results.db"
    with SysfsSim(tmp_path / "board", util_env=util_env, idle_ma=150.0, ma_per_util=1200.0) as sim:
        sim.write_descriptor(tmp_path / "lab", env=env)
        res = probe_power(tmp_path / "lab", "6", "3", *PINNED, "--store", db, "--json", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        idle, expected = expected_idle_and_net_mw(sim, db)
        gap = reads_match_the_gauge(sim, db)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    net = one(doc, "power_mw")
    # One busy CPU of two is u = 0.5: 600 mA above idle at about 3.8 V (less when the host is crowded and
    # the agent gets only part of its CPU; the simulator counts what it really used).
    assert 150 < expected < 3000
    assert gap < 0.02, f"readings differ from the gauge at their instants by {gap:.1%} (median)"
    # 24 reads of a load the host makes jitter: one crowded CI run read 651 against 575 over the trace.
    assert net == pytest.approx(expected, rel=0.2, abs=15)
    rec = records_by(doc, "power_mw")[0]
    assert rec["params"]["source"] == "battery:battery" and rec["annotations"]["samples_active"] >= 15
    assert rec["annotations"]["sample_rate_hz"] == pytest.approx(4.0, rel=0.2)
    # Idle is what the gauge showed while the model did not run (150 mA at 3.835 V, plus the little the
    # idle agent and its sampler use: a crowded host made that 637 mW against 575).
    assert one(doc, "idle_power_mw", phase="mean") == pytest.approx(idle, rel=0.05)
    assert idle == pytest.approx(150 * 3.835, rel=0.25)
    current = records_by(doc, "current_ma")[0]
    assert current["annotations"]["sign"] == -1 and current["annotations"]["sign_calibration"] == "load"
    mean_latency = one(doc, "latency_ms", stat="mean", phase="active")
    assert one(doc, "energy_mj_per_inference") == pytest.approx(net * mean_latency / 1000, rel=0.1)


@pytest.mark.parametrize(("status", "says"), [(None, "status 'Charging'"), ("Unknown", "sign says")])
def test_power_refuses_a_charging_battery(tmp_path: Path, status: str | None, says: str) -> None:
    util_env, env = board_tag()
    with SysfsSim(tmp_path / "board", util_env=util_env, charging=True, status=status) as sim:
        sim.write_descriptor(tmp_path / "lab", env=env)
        res = probe_power(
            tmp_path / "lab",
            "2",
            "1.5",
            "--threads",
            "1",
            "--store",
            tmp_path / "r.db",
            "--json",
            cwd=tmp_path,
        )
    assert res.returncode == 3, res.stderr
    assert res.stdout == ""
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("edgebench: error:")]
    assert len(errors) == 1 and res.stderr.strip().endswith(errors[0]) and "Traceback" not in res.stderr
    assert errors[0].startswith("edgebench: error: board:"), res.stderr
    assert says in errors[0] and "USB power" in errors[0] and "power monitor" in errors[0]


def test_power_with_an_external_monitor_while_charging(tmp_path: Path) -> None:
    """A monitor in the supply line measures the device even with a charger on: no refusal."""
    util_env, env = board_tag()
    db = tmp_path / "results.db"
    with SysfsSim(tmp_path / "board", util_env=util_env, charging=True) as sim:
        sim.write_descriptor(tmp_path / "lab", env=env, power={"monitor": sim.monitor_argv(hz=20)})
        res = probe_power(tmp_path / "lab", "5", "2.5", *PINNED, "--store", db, "--json", cwd=tmp_path)
        bounds, p = stored_samples(db, "phase_bounds_s")
        origin = p["origin_monotonic_s"]
        rows = sim.trace()

    def supply_mw(lo: float, hi: float) -> float:
        return float(
            np.mean(
                [
                    r["draw_ma"] * r["voltage_uv"] / 1e6
                    for r in rows
                    if lo + 0.5 <= r["t_monotonic"] - origin <= hi - 0.5
                ]
            )
        )

    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rec = records_by(doc, "power_mw")[0]
    assert rec["params"]["source"] == "monitor" and rec["annotations"]["sample_rate_hz"] == pytest.approx(
        20, rel=0.2
    )
    expected = (
        supply_mw(bounds[2], bounds[3])
        - (supply_mw(bounds[0], bounds[1]) + supply_mw(bounds[4], bounds[5])) / 2
    )
    assert rec["value"] == pytest.approx(expected, rel=0.15, abs=20)


def test_cooldown_guard_waits_for_a_hot_board(tmp_path: Path) -> None:
    from edgebench.descriptors import load_lab
    from edgebench.lab.device import Device
    from edgebench.probes.cooldown import CooldownPolicy, wait_for_cooldown

    util_env, env = board_tag()
    with SysfsSim(tmp_path / "board", util_env=util_env, start_c=65.0, tau_s=3.0, idle_c=IDLE_C) as sim:
        sim.write_descriptor(tmp_path / "lab", env=env)
        with Device(load_lab(tmp_path / "lab").get("board")) as device:
            result = wait_for_cooldown(device, CooldownPolicy(timeout_s=40, period_s=0.25, min_observe_s=2.0))
            again = wait_for_cooldown(
                device, CooldownPolicy(timeout_s=5, period_s=0.25), idle_c=result.idle_c
            )
    assert result.cooled, result.describe()
    assert result.zone == "cpu-thermal"
    # 65 -> within 2 of 35 takes tau * ln(30 / 2) = 8 s of cooling; the agent starts after the sim.
    assert 3.0 < result.waited_s < 20.0
    assert result.temp_c is not None and result.temp_c <= IDLE_C + 2.5
    assert result.idle_c["cpu-thermal"] == pytest.approx(IDLE_C, abs=1.5)
    assert again.cooled and again.waited_s < 2.0 and again.reason == "given idle reading"


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    res = edgebench("probe", "thermal", "--model", MODEL, "--device", "nope", "--lab", tmp_path, cwd=tmp_path)
    assert (
        res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "unknown device 'nope'" in res.stderr
    )
    res = edgebench(
        "probe", "thermal", "--model", MODEL, "--duration-s", "5", "--window-s", "9", cwd=tmp_path
    )
    assert res.returncode == 2 and "--window-s: 9 s is longer than duration_s 5 s" in res.stderr
    res = edgebench("probe", "power", "--model", str(tmp_path / "missing.onnx"), cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0


def test_power_without_a_power_sensor_is_a_config_error(tmp_path: Path) -> None:
    from edgebench.testing.sysfs_sim import SimConfig, build_tree

    build_tree(SimConfig(root=tmp_path / "board", battery=False, hwmon=False))
    SysfsSim(tmp_path / "board").write_descriptor(tmp_path / "lab")
    res = probe_power(tmp_path / "lab", "1", "1", cwd=tmp_path)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("edgebench: error:")]
    assert res.returncode == 2 and len(errors) == 1, res.stderr
    assert "no power sensor" in errors[0] and "sensors.power" in errors[0] and "board.toml" in errors[0]


def test_power_on_the_emulated_adb_phone(adb_phone_factory: Any, tmp_path: Path) -> None:
    """The same tree under the emulated phone's /sys: the agent reads /sys/class/power_supply as a phone."""
    util_env, env = board_tag()
    extra = "env = { " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }"
    lab = adb_phone_factory(extra=extra)
    db = tmp_path / "results.db"
    with SysfsSim(lab.root, util_env=util_env, cpus=os.cpu_count() or 1) as sim:
        res = probe_power(
            lab.lab_dir, "5", "3", *PINNED, "--store", db, "--json", device=lab.device_name, cwd=tmp_path
        )
        expected = expected_net_mw(sim, db)
    assert res.returncode == 0, res.stderr
    assert expected > 150  # the simulator saw the phone's agent (inside its sandbox) working
    doc = json.loads(res.stdout)
    assert records_by(doc, "power_mw")[0]["params"]["source"] == "battery:battery"
    assert one(doc, "power_mw") == pytest.approx(expected, rel=0.1, abs=15)
    mean_latency = one(doc, "latency_ms", stat="mean", phase="active")
    assert one(doc, "energy_mj_per_inference") == pytest.approx(
        one(doc, "power_mw") * mean_latency / 1000, rel=0.1
    )
