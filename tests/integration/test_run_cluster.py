"""`edgebench run --cluster` through a real Dask scheduler and `edgebench worker` processes on loopback.

A worker holds the ssh board and the adb phone (and, asked with `--device local`, its host): the suite runs
there and the records land in the controller's store. When that worker is killed mid-run, the jobs of
devices no other worker holds become error records (no hang), while `local`, held by a second worker too,
carries on there; `--resume` with a new worker then finishes exactly the missing jobs. Two workers sharing
a device keep its jobs on the one that opened its session (no waits for the other's lease), a worker
serves its host only when asked, and a worker whose scheduler dies exits non-zero.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

sys.path.insert(0, str(Path(__file__).parent))
from test_run_fleet import assert_complete_once, matmul_model, ok_jobs  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "process ended before listening"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


class Procs:
    """Processes this test started; all are stopped at the end, whatever happens."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[Any]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        log = open(self.folder / f"{name}.log", "wb")
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.folder,
            env={**os.environ, **(env or {})},
        )
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


@pytest.fixture
def scheduler(procs: Procs) -> str:
    port = free_port()
    proc = procs.start(
        "scheduler",
        ["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard", "--no-show"],
    )
    wait_port(port, proc)
    return f"tcp://127.0.0.1:{port}"


def start_worker(
    procs: Procs,
    name: str,
    scheduler: str,
    lab: Path,
    locks: Path,
    cache: Path,
    devices: tuple[str, ...] = (),
) -> subprocess.Popen[Any]:
    argv = [
        sys.executable,
        "-m",
        "edgebench",
        "worker",
        "--scheduler",
        scheduler,
        "--lab",
        str(lab),
        "--name",
        name,
        "--lock-dir",
        str(locks),
        "--idle-release",
        "5",
    ]
    for d in devices:
        argv += ["--device", d]
    proc = procs.start(name, argv, env={"XDG_CACHE_HOME": str(cache)})
    deadline = time.monotonic() + 60
    while "joined" not in procs.log(name):
        assert proc.poll() is None, procs.log(name)
        assert time.monotonic() < deadline, procs.log(name)
        time.sleep(0.1)
    return proc


def write_suite(folder: Path, devices: list[str]) -> Path:
    (folder / "models").mkdir(exist_ok=True)
    matmul_model(folder / "models" / "small.onnx", 64, 1)
    matmul_model(folder / "models" / "wide.onnx", 256, 2)
    path = folder / "cluster.toml"
    path.write_text(f"""
name = "cluster"
devices = {json.dumps(devices)}
models = ["models/small.onnx", "models/wide.onnx"]
[[probe]]
kind = "bench"
params = {{ threads = [1, 2], runs = 50, warmup = 1, warmup_seconds = 0.0, min_seconds = 0.0 }}
[policy]
retries = 1
backoff = 0.2
quarantine_after = 2
cooldown = false
worker_grace = 3
""")
    return path


def controller(suite: Path, scheduler: str, store: Path, *extra: str) -> subprocess.Popen[str]:
    # The controller's working directory has no lab: devices resolve on the workers.
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgebench",
            "run",
            str(suite),
            "--cluster",
            scheduler,
            "--store",
            str(store),
            "--json",
            *extra,
        ],
        cwd=suite.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def fleet_lab(ssh_board: Any, adb_phone_factory: Any, tmp_path: Path) -> tuple[Path, list[str]]:
    lab = tmp_path / "worker-lab"
    ssh_board.write_descriptor(lab)
    adb_phone_factory(name="phone", lab_dir=lab)
    return lab, ["local", ssh_board.name, "phone"]


def test_suite_runs_on_the_worker_that_holds_the_board(
    procs: Procs, scheduler: str, fleet_lab: tuple[Path, list[str]], tmp_path: Path
) -> None:
    lab, devices = fleet_lab
    cache, locks = tmp_path / "worker-cache", tmp_path / "locks"
    start_worker(procs, "w1", scheduler, lab, locks, cache, devices=tuple(devices))
    suite = write_suite(tmp_path, devices)
    store = tmp_path / "controller.db"

    run = controller(suite, scheduler, store)
    out, err = run.communicate(timeout=240)
    assert run.returncode == 0, err
    doc = json.loads(out)
    assert doc["status"] == "ok" and doc["errors"] == []
    assert {(r["device"], r["model"]) for r in doc["records"]} == {
        (d, m) for d in devices for m in ("small", "wide")
    }
    assert_complete_once(store, doc["run_id"], 12)
    with sqlite3.connect(store) as db:
        fingerprints = dict(db.execute("SELECT device, fingerprint FROM devices").fetchall())
        provenance = json.loads(db.execute("SELECT provenance FROM runs").fetchone()[0])
    assert set(fingerprints) == set(devices) and provenance["cluster"] == scheduler
    # The models reached the worker by content, once each, into its own cache.
    shipped = sorted(p.name for p in (cache / "edgebench" / "cluster-files").glob("*/*.onnx"))
    assert shipped == ["small.onnx", "wide.onnx"]
    assert not (lab / "edgebench.db").exists() and not (tmp_path / "edgebench.db").exists()


def test_a_lost_worker_fails_its_devices_jobs_and_local_moves_on(
    procs: Procs, scheduler: str, fleet_lab: tuple[Path, list[str]], tmp_path: Path
) -> None:
    lab, devices = fleet_lab
    board = devices[1]
    cache, locks = tmp_path / "worker-cache", tmp_path / "locks"
    w1 = start_worker(procs, "w1", scheduler, lab, locks, cache, devices=tuple(devices))
    start_worker(procs, "w2", scheduler, tmp_path / "no-lab", locks, cache, devices=("local",))
    suite = write_suite(tmp_path, devices)
    store = tmp_path / "controller.db"

    run = controller(suite, scheduler, store)
    deadline = time.monotonic() + 120
    while not any(d == board for _, d, _ in ok_jobs(store)):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1]
        time.sleep(0.1)
    os.kill(w1.pid, signal.SIGKILL)  # the host holding the board and the phone drops off the network
    w1.wait(10)  # reaped, as its supervisor would: a zombie still counts as a live lease holder
    started = time.monotonic()
    try:
        out, err = run.communicate(timeout=180)
    except subprocess.TimeoutExpired as exc:
        run.kill()
        raise AssertionError(f"the controller hung; its stderr: {(exc.stderr or b'').decode()}") from None
    assert time.monotonic() - started < 90  # bounded by the worker grace and retries, never a hang
    assert run.returncode == 1, err
    assert "Traceback" not in err
    doc = json.loads(out)
    summary = {s["device"]: s for s in doc["summary"]}
    assert (summary["local"]["ok"], summary["local"]["failed"]) == (4, 0)  # carried on by w2
    failed = {e["device"] for e in doc["errors"]}
    assert board in failed and failed <= {board, "phone"}
    assert all(e["kind"] == "lab" for e in doc["errors"])
    run_id = doc["run_id"]
    before = {key for key, _, _ in ok_jobs(store, run_id)}

    start_worker(procs, "w3", scheduler, lab, locks, cache, devices=tuple(devices))  # the host is back
    resumed = controller(suite, scheduler, store, "--resume", run_id)
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err
    doc = json.loads(out)
    assert doc["status"] == "ok" and doc["errors"] == []
    assert sum(s["skipped"] for s in doc["summary"]) == len(before)
    assert_complete_once(store, run_id, 12)


def test_two_workers_sharing_a_board_keep_its_jobs_on_one_worker(
    procs: Procs, scheduler: str, ssh_board: Any, tmp_path: Path
) -> None:
    lab, locks, cache = tmp_path / "lab", tmp_path / "locks", tmp_path / "worker-cache"
    ssh_board.write_descriptor(lab, name="board")
    for name in (
        "w1",
        "w2",
    ):  # two hosts' workers with a cable to the same board; default idle release (60 s)
        argv = [sys.executable, "-m", "edgebench", "worker", "--scheduler", scheduler, "--lab", str(lab),
                "--name", name, "--lock-dir", str(locks), "--device", "board"]  # fmt: skip
        proc = procs.start(name, argv, env={"XDG_CACHE_HOME": str(cache)})
        deadline = time.monotonic() + 60
        while "joined" not in procs.log(name):
            assert proc.poll() is None and time.monotonic() < deadline, procs.log(name)
            time.sleep(0.1)
    suite = write_suite(tmp_path, ["board"])
    store = tmp_path / "controller.db"
    start = time.monotonic()
    run = controller(suite, scheduler, store)
    out, err = run.communicate(timeout=400)
    wall = time.monotonic() - start
    assert run.returncode == 0, err
    run_id = json.loads(out)["run_id"]
    assert_complete_once(store, run_id, 4)

    from edgebench.descriptors import load_lab
    from edgebench.execution.leases import lease_history

    holds = [e for e in lease_history(load_lab(lab).get("board"), locks) if e["run_id"] == run_id]
    assert [e["event"] for e in holds] == ["acquired", "released"]  # one worker held it for the whole run
    with sqlite3.connect(store) as db:
        busy = sum(w for (w,) in db.execute("SELECT wall_s FROM jobs WHERE run_id=?", (run_id,)))
    # A hop to the other worker used to wait out the first one's idle lease (60 s) per hop.
    assert wall < 2.5 * busy + 20, f"run took {wall:.1f} s for {busy:.1f} s of jobs"


def test_a_worker_serves_its_host_only_when_asked(procs: Procs, scheduler: str, tmp_path: Path) -> None:
    from edgebench.descriptors import load_lab
    from edgebench.execution.cluster import served_by_default

    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "twin.toml").write_text('name = "twin"\ntransport = "local"\n')
    assert served_by_default(load_lab(lab)) == []
    argv = [sys.executable, "-m", "edgebench", "worker", "--scheduler", scheduler, "--lab", str(lab)]
    lonely = procs.start("lonely", argv)
    assert lonely.wait(60) == 2
    assert "the worker holds no devices" in procs.log("lonely") and "--device local" in procs.log("lonely")


def test_a_worker_exits_non_zero_when_its_scheduler_dies(procs: Procs, tmp_path: Path) -> None:
    port = free_port()
    dask = procs.start(
        "scheduler",
        ["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard", "--no-show"],
    )
    wait_port(port, dask)
    worker = start_worker(procs, "w1", f"tcp://127.0.0.1:{port}", tmp_path / "lab", tmp_path / "locks",
                          tmp_path / "cache", devices=("local",))  # fmt: skip
    dask.kill()
    dask.wait(10)
    assert worker.wait(90) == 3  # a supervisor (systemd Restart=on-failure) brings it back
    lines = [ln for ln in procs.log("w1").splitlines() if ln.startswith("edgebench: error:")]
    assert len(lines) == 1 and "lost the Dask scheduler" in lines[0], procs.log("w1")
