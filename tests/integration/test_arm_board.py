"""An aarch64 board in the lab (arm64 Debian under qemu-user, its own sshd): the real CLI over the real ssh
transport sees an aarch64 machine, runs the agent with the aarch64 wheels on it, and pushes and runs the
aarch64 `llama-bench` (../shared/lab-tools/llama.cpp-20261001-linux-aarch64, BUILD.md there).

Timings under emulation mean nothing: these tests check behaviour only. The board's set-up is the
`arm_board` fixture's (edgebench.testing.pytest_arm): about 5 minutes the first time on a machine, seconds
once its rootfs is cached.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edgebench.results.store import Store
from edgebench.testing.arm_board import WHEELS, ArmBoard
from edgebench.testing.cli import edgebench
from edgebench.testing.labtools import tool_or_skip

# a first session builds the rootfs within the first test's set-up: more than the suite's 600 s default
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

LLAMA_DIR = "llama.cpp-20261001-linux-aarch64"
LLAMA_MODEL = "builtin:llama:layers=2,hidden=256,heads=4,kv_heads=2,vocab=512,dtype=q4_0"
ELF_MACHINE_AARCH64 = 0xB7
# the wheels pinned in the board's venv, by the names the agent reports them under
WANTED = {name.split("==")[0]: name.split("==")[1] for name in WHEELS}


def elf_machine(path: Path) -> int:
    """e_machine of an ELF file (little-endian 16 bits at offset 18)."""
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return int.from_bytes(head[18:20], "little")


def test_devices_check_sees_an_aarch64_board_with_its_arm_features(
    arm_board: ArmBoard, tmp_path: Path
) -> None:
    res = edgebench("devices", "--check", "--lab", arm_board.lab_dir, "--json", cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    (board,) = [d for d in json.loads(res.stdout)["devices"] if d["name"] == arm_board.name]
    assert board["status"] == "ok" and board["transport"] == "ssh"
    assert board["arch"] == "aarch64"  # uname on the board, not the host's x86_64
    # qemu's Cortex-A76: Armv8.2 SIMD (asimd, dot product, half precision), and no SVE
    assert {"asimd", "asimddp", "fphp", "asimdhp"} <= set(board["cpu_flags"])
    assert not {"sve", "sve2", "sme"} & set(board["cpu_flags"])
    clusters = board["cpu_clusters"]  # the fixture's sysfs: a little core, then a big one
    assert [c["capacity"] for c in clusters] == [446, 1024]
    assert {c["core"] for c in clusters} == {"Cortex-A76"}
    assert board["runtimes"]["onnxruntime"] == WANTED["onnxruntime"]
    assert board["runtimes"]["mnn"] == WANTED["mnn"] and board["runtimes"]["ncnn"] == WANTED["ncnn"]
    assert board["python"].startswith("3.11.")  # Debian 12's python3, not this host's
    table = edgebench("devices", "--check", "--lab", arm_board.lab_dir, cwd=tmp_path, timeout=900)
    assert table.returncode == 0 and "aarch64" in table.stdout and "asimddp" in table.stdout


def test_bench_on_the_board_stores_an_aarch64_fingerprint_and_its_wheels(
    arm_board: ArmBoard, tmp_path: Path
) -> None:
    store = tmp_path / "s.db"
    res = edgebench(
        "bench", "builtin:mlp", "--device", arm_board.name, "--lab", arm_board.lab_dir, "--runs", "5",
        "--json", "--store", store, cwd=tmp_path, timeout=1200,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    records = json.loads(res.stdout)["records"]
    assert {r["device"] for r in records} == {arm_board.name} and {r["runtime"] for r in records} == {
        "onnxruntime"
    }
    assert any(r["metric"] == "latency_ms" and r["value"] > 0 for r in records)
    with Store(store) as s:
        (device,) = [d for d in s.device_info() if d["device"] == arm_board.name]
    fingerprint = device["fingerprint"]
    assert fingerprint["arch"] == "aarch64"
    assert fingerprint["python"].startswith("3.11.")
    for name, version in WANTED.items():  # the aarch64 wheels the agent imported on the board
        assert fingerprint["runtimes"][name] == version, (name, fingerprint["runtimes"])
    assert {c["core"] for c in fingerprint["cpu_clusters"]} == {"Cortex-A76"}


def test_probe_decode_pushes_and_runs_the_aarch64_llama_bench(arm_board: ArmBoard, tmp_path: Path) -> None:
    tool = tool_or_skip(Path(__file__).resolve().parents[2], LLAMA_DIR, "llama-bench", "aarch64 llama-bench")
    binary = tool / "llama-bench"
    assert elf_machine(binary) == ELF_MACHINE_AARCH64
    lab = tmp_path / "lab"
    path = arm_board.write_descriptor(lab)
    path.write_text(
        path.read_text() + f'[runners]\nllama_bench = {{ path = "llama-bench", push = "{binary}" }}\n'
    )
    store = tmp_path / "s.db"
    res = edgebench(
        "probe", "decode", "--model", LLAMA_MODEL, "--device", arm_board.name, "--lab", lab,
        "--threads", "1", "--prompt-tokens", "8", "--new-tokens", "4", "--rounds", "3", "--no-floor",
        "--json", "--store", store, cwd=tmp_path, timeout=1200,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    records = [r for r in json.loads(res.stdout)["records"] if r["probe"] == "decode"]
    metrics = {r["metric"] for r in records}
    assert {"ttft_ms", "prefill_tokens_per_s", "decode_ms_per_token", "decode_tokens_per_s"} <= metrics
    assert {r["runtime"] for r in records} == {"llama.cpp"} and {r["device"] for r in records} == {
        arm_board.name
    }
    decode = next(r for r in records if r["metric"] == "decode_ms_per_token" and r["params"]["stat"] == "p50")
    printed = decode["annotations"]["llama_bench"]  # the tool's own JSON, as printed on the board
    assert printed["n_gen"] == 4 and printed["n_threads"] == 1 and len(printed["samples_ns"]) == 3
    assert "CPU" in str(printed["backends"])
    # the runner the board ran is the aarch64 binary the descriptor pushes, byte for byte
    link = arm_board.workdir / "runners" / "llama_bench" / "llama-bench"
    ran = arm_board.rootfs / os.readlink(link).lstrip("/")  # a board path, seen from the host
    assert ran.read_bytes() == binary.read_bytes() and elf_machine(ran) == ELF_MACHINE_AARCH64
    with Store(store) as s:
        stored = s.records(metric="decode_ms_per_token")
        (device,) = [d for d in s.device_info() if d["device"] == arm_board.name]
    assert len(stored) == len([r for r in records if r["metric"] == "decode_ms_per_token"])
    assert device["fingerprint"]["arch"] == "aarch64"
