"""An aarch64 phone in the lab: the emulated adbd over the real adb server, its shell an aarch64 userland
(Debian's arm64 mksh as /system/bin/sh, toybox's applets, the aarch64 C library, no Python) run by
qemu-user through the arm lab's binfmt_misc entry (edgebench.testing.arm_phone, pytest_arm).

The native path on it: the descriptor gives each runner one build per ABI (the x86_64 and aarch64 MNN
`benchmark.out` and `benchncnn` of ../shared/lab-tools, BUILD.md there); edgebench pushes the phone's
(arm64-v8a, from getprop) with its libraries on LD_LIBRARY_PATH, runs it and stores what it printed; a
single build for another machine is refused before anything is pushed. The shell sampler reads the phone's
sysfs during a sustained run. Timings under emulation mean nothing: these tests check behaviour only.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from edgebench.results.store import Store
from edgebench.testing.adblab import write_descriptor
from edgebench.testing.cli import edgebench
from edgebench.testing.labtools import tool_or_skip
from edgebench.testing.pytest_adb import AdbPhoneLab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]  # a first session builds the rootfs

REPO = Path(__file__).resolve().parents[2]
TOOLS = {
    # runner: (folder per ABI, binary, libraries beside it)
    "mnn_benchmark": (
        {"arm64-v8a": "mnn-3.6.1-linux-aarch64", "x86_64": "mnn-3.6.1-linux-x86_64"},
        "benchmark.out",
        {"arm64-v8a": ["libMNN.so", "libstdc++.so.6", "libgcc_s.so.1"], "x86_64": ["libMNN.so"]},
    ),
    "benchncnn": (
        {"arm64-v8a": "ncnn-20260722-linux-aarch64", "x86_64": "ncnn-20260722-linux-x86_64"},
        "benchncnn",
        {"arm64-v8a": ["libstdc++.so.6", "libgcc_s.so.1", "libgomp.so.1"], "x86_64": []},
    ),
}
ELF_MACHINE_AARCH64 = 0xB7


def tool_dir(abi_folder: str, binary: str) -> Path:
    return tool_or_skip(REPO, abi_folder, binary, f"{abi_folder}/{binary}")


def runners_toml() -> str:
    """[runners] with one build per ABI of benchmark.out and benchncnn (edgebench picks the phone's)."""
    lines = []
    for runner, (folders, binary, libs) in TOOLS.items():
        lines += [f"[runners.{runner}]", f'path = "{binary}"']
        for abi, folder in folders.items():
            where = tool_dir(folder, binary)
            lib_list = ", ".join(f'"{where / lib}"' for lib in libs[abi])
            lines += [
                f"[runners.{runner}.builds.{abi}]",
                f'push = "{where / binary}"',
                f"libs = [{lib_list}]",
            ]
    return "\n".join(lines) + "\n"


def native_arm_phone(factory: Callable[..., AdbPhoneLab], runners: str) -> AdbPhoneLab:
    lab = factory(name="armphone")
    write_descriptor(lab.lab_dir, "armphone", lab.phone, extra='agent = "native"\n' + runners)
    return lab


def adb_shell(lab: AdbPhoneLab, command: str) -> subprocess.CompletedProcess[str]:
    return lab.phone.server.run_adb("-s", lab.phone.serial, "shell", command, timeout=120)


def test_the_phone_is_aarch64_with_androids_shell_tools_and_no_python(
    arm_phone_factory: Callable[..., AdbPhoneLab],
) -> None:
    lab = arm_phone_factory()
    script = (
        "uname -m; command -v python3 || echo no-python3; command -v python || echo no-python; "
        'echo "$KSH_VERSION"; readlink /system/bin/ls; getprop ro.product.cpu.abi; echo $PATH'
    )
    res = adb_shell(lab, script)
    assert res.returncode == 0 and not res.stderr, res.stderr
    lines = res.stdout.splitlines()
    assert lines == [
        "aarch64",
        "no-python3",
        "no-python",
        lines[3],
        "toybox",
        "arm64-v8a",
        "/system/bin",
    ], res.stdout
    assert "MIRBSD KSH" in lines[3]  # /system/bin/sh is mksh, as on Android
    sh = lab.root / "system/bin/sh"
    assert sh.read_bytes()[18:20] == ELF_MACHINE_AARCH64.to_bytes(2, "little")


def test_native_runners_are_picked_for_the_phones_abi_and_their_output_stored(
    arm_phone_factory: Callable[..., AdbPhoneLab], tmp_path: Path
) -> None:
    """benchmark.out (with libMNN.so and its C++ runtime) and benchncnn (with libgomp) of the arm64-v8a
    builds pushed and run on the phone; their latencies stored; the fingerprint says what the phone is."""
    lab = native_arm_phone(arm_phone_factory, runners_toml())
    store = tmp_path / "s.db"
    for runtime in ("mnn", "ncnn"):
        res = edgebench(
            "bench", "builtin:mlp", "--runtime", runtime, "--device", "armphone", "--lab", lab.lab_dir,
            "--threads", "1", "--runs", "3", "--warmup", "1", "--timeout", "300", "--store", store, "--json",
            cwd=tmp_path, timeout=600,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        mean = next(
            r for r in json.loads(res.stdout)["records"]
            if r["metric"] == "latency_ms" and r["params"].get("stat") == "mean"
        )  # fmt: skip
        assert (
            mean["runtime"] == runtime
            and mean["value"] > 0
            and mean["annotations"]["aggregated_by"] == "tool"
        )
    with Store(store) as s:
        stored = [r for r in s.records() if r.metric == "latency_ms" and r.params.get("stat") == "mean"]
        [device] = {d["device"]: d for d in s.device_info()}.values()
    assert {(r.runtime, r.params["runner"]) for r in stored} == {
        ("mnn", "mnn_benchmark"),
        ("ncnn", "benchncnn"),
    }
    fingerprint = device["fingerprint"]
    assert fingerprint["arch"] == "aarch64" and fingerprint["abi"] == "arm64-v8a"
    assert fingerprint["abilist"].startswith("arm64-v8a,") and fingerprint["agent"] == "native"
    # what ran on the phone were the aarch64 builds (linked by name in the runner's folder)
    for runner, (_, binary, _) in TOOLS.items():
        link = lab.phone.host_path(f"/data/local/tmp/edgebench/runners/{runner}/{binary}")
        pushed = lab.phone.host_path(os.readlink(link))  # a link to the device's cache
        assert pushed.read_bytes()[18:20] == ELF_MACHINE_AARCH64.to_bytes(2, "little")


def test_a_single_build_for_another_machine_is_refused_before_any_push(
    arm_phone_factory: Callable[..., AdbPhoneLab], tmp_path: Path
) -> None:
    x86 = tool_dir("mnn-3.6.1-linux-x86_64", "benchmark.out")
    runners = (
        f'[runners]\nmnn_benchmark = {{ path = "benchmark.out", push = "{x86 / "benchmark.out"}", '
        f'libs = ["{x86 / "libMNN.so"}"] }}\n'
    )
    lab = native_arm_phone(arm_phone_factory, runners)
    res = edgebench(
        "bench", "builtin:mlp", "--runtime", "mnn", "--device", "armphone", "--lab", lab.lab_dir,
        "--runs", "3", cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "runners.mnn_benchmark" in errors[0] and "built for x86-64" in errors[0]
    assert "arm64-v8a" in errors[0] and str(x86 / "benchmark.out") in errors[0]
    assert not lab.phone.host_path("/data/local/tmp/edgebench/runners").exists()


def put(root: Path, rel: str, value: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")


def test_sustained_run_samples_the_phones_sysfs_with_its_own_shell(
    arm_phone_factory: Callable[..., AdbPhoneLab], tmp_path: Path
) -> None:
    """probe thermal on the phone: benchncnn back to back while mksh and toybox sample its sysfs."""
    lab = native_arm_phone(arm_phone_factory, runners_toml())
    put(lab.root, "sys/class/thermal/thermal_zone0/type", "cpu-thermal")
    put(lab.root, "sys/class/thermal/thermal_zone0/temp", "41500")
    for cpu in (0, 1):
        put(lab.root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq", "1800000")
        put(lab.root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_max_freq", "2000000")
        put(lab.root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq", "2000000")
        put(lab.root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/related_cpus", "0 1")
    res = edgebench(
        "probe", "thermal", "--model", "builtin:mlp", "--runtime", "ncnn", "--device", "armphone",
        "--lab", lab.lab_dir, "--threads", "1", "--runs", "3", "--duration-s", "4", "--window-s", "2",
        "--period-s", "0.25", "--no-cooldown", "--store", tmp_path / "s.db", "--json", cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    records = json.loads(res.stdout)["records"]
    temps = [r for r in records if r["metric"] == "temp_c"]
    assert temps and all(r["value"] == 41.5 for r in temps), temps[:3]
    assert any(r["metric"] == "freq_mhz" and r["value"] == 1800 for r in records)
    assert any(r["metric"] == "latency_ms" and r["value"] > 0 for r in records)
    assert {r["device"] for r in records} == {"armphone"}
