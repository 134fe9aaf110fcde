"""A stock phone (no Python on its PATH) over the real adb server: what a native device needs of the phone
itself (no Python, its runners named in the descriptor, its own sh sampling sysfs).

Runs that replay a tool's captured output in place of the tool are parser tests:
tests/unit/test_native_replay_parsers.py. The real MNN benchmark.out runs in test_mnn_benchmark_real.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgebench.testing.adblab import write_descriptor
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration


def stock_phone(adb_phone_factory, tmp_path: Path, runners: str, env: str = ""):  # type: ignore[no-untyped-def]
    lab = adb_phone_factory(name="stock", path="/system/bin")
    write_descriptor(lab.lab_dir, "stock", lab.phone, extra=f'agent = "native"\n{env}\n[runners]\n' + runners)
    return lab


def test_phone_has_no_python(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lab = stock_phone(adb_phone_factory, tmp_path, "")
    res = lab.phone.server.run_adb("-s", lab.phone.serial, "shell", "command -v python3 || echo none")
    assert res.stdout.strip() == "none"


def test_missing_runner_names_the_descriptor(adb_phone_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lab = stock_phone(adb_phone_factory, tmp_path, "")
    res = edgebench("bench", "builtin:convnet", "--device", "stock", "--lab", str(lab.lab_dir), cwd=tmp_path)
    assert res.returncode == 2
    assert "no 'onnxruntime_perf_test' in [runners]" in res.stderr and "stock.toml" in res.stderr


def shell_ticks(phone, output: str) -> int:  # type: ignore[no-untyped-def]
    res = phone.transport.run(["grep", "-c", "^T", output], timeout=30)
    return int(res.stdout.strip() or 0)


def wait_for_ticks(phone, output: str, ticks: int, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Until the shell sampler on the phone has written `ticks` ticks (its pace is the loaded phone's)."""
    deadline = time.monotonic() + timeout_s
    while shell_ticks(phone, output) < ticks:
        assert time.monotonic() < deadline, (
            f"the shell sampler wrote fewer than {ticks} ticks in {timeout_s} s"
        )
        time.sleep(0.1)


def test_shell_sampler_on_the_stock_phone_matches_the_python_sampler(
    adb_phone_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The phone's own sh samples its sandbox sysfs (driven by real load) while the agent's Python sampler
    reads the same files from the host over a window that covers the shell's: same channels, both see the
    frequency cap drop, and the shell's temperatures lie within what the Python sampler saw."""

    from edgebench.agent.sensors import Sampler, discover
    from edgebench.lab.device import Device
    from edgebench.native.shell_sampler import sensor_log, start_sampler, stop_sampler
    from edgebench.probes.sensing import sensors_config
    from edgebench.testing.sysfs_sim import SysfsSim

    lab = stock_phone(adb_phone_factory, tmp_path, "")
    with SysfsSim(lab.root, burners=1) as sim, Device(lab.spec()) as phone:
        config = sensors_config(phone.spec, 0.2)
        python = Sampler(discover({**config, "sysfs_root": str(lab.root)}), 0.2, dumpsys=False).start()
        try:
            handle = start_sampler(phone, 0.2, 30.0, timeout=30)
            wait_for_ticks(phone, handle.output, 3)
            sim.cap_now()
            wait_for_ticks(phone, handle.output, shell_ticks(phone, handle.output) + 3)
            shell_log = sensor_log(stop_sampler(phone, handle, timeout=30), config, 0.2)
        finally:
            python_log = python.stop()

    def by_id(log: dict) -> dict[str, list]:
        return {c["id"]: c["values"] for c in log["channels"]}

    shell, python = by_id(shell_log), by_id(python_log)
    assert set(shell) == set(python) and any(k.startswith("temp:") for k in shell)
    [cap] = [k for k in shell if k.startswith("freq_cap_mhz:")]
    for series in (shell[cap], python[cap]):
        assert series[-1] < series[0]  # the cap dropped, seen by both samplers
    for key in (k for k in shell if k.startswith("temp:")):
        lo, hi = min(python[key]) - 1.0, max(python[key]) + 1.0
        assert all(lo <= v <= hi for v in shell[key][1:-1] if v is not None)
