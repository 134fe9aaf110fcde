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
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


# Arm's own figures for the Cortex-A76 (Software Optimization Guide): two 128-bit ASIMD FMA pipes; NEON is
# 128 bits wide, 4 fp32 lanes; an FMA counts as 2 FLOP
A76_FMA_PIPES, NEON_FP32_LANES, FLOP_PER_FMA = 2, 128 // 32, 2


def expected_fp32_tops(board: ArmBoard) -> tuple[float, list[tuple[int, float]]]:
    """The board's fp32 peak from what its topology declares (cores, cpuinfo_max_freq) and the A76's
    pipes, written out here rather than asked of edgebench: TOPS, and (cores, MHz) per cluster."""
    assert board.topology is not None
    clusters = [(len(cpus), khz / 1e3) for cpus, _, khz in board.topology.clusters]
    per_cycle = A76_FMA_PIPES * NEON_FP32_LANES * FLOP_PER_FMA
    return sum(per_cycle * mhz * 1e6 * n for n, mhz in clusters) / 1e12, clusters


def test_report_shows_the_board_with_its_arm_fingerprint_and_a_derived_peak(
    arm_board: ArmBoard, tmp_path: Path
) -> None:
    store = tmp_path / "s.db"
    common = ("--device", arm_board.name, "--lab", arm_board.lab_dir, "--store", store)
    bench = edgebench("bench", "builtin:mlp", *common, "--runs", "3", cwd=tmp_path, timeout=900)
    assert bench.returncode == 0, bench.stderr[-3000:]
    matmul = edgebench(
        "probe", "matmul", *common, "--backend", "numpy", "--dtype", "fp32", "--sizes", "64",
        "--skinny", "false", "--threads", "1", "--trials", "2", "--json", cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert matmul.returncode == 0, matmul.stderr[-3000:]
    peak, clusters = expected_fp32_tops(arm_board)
    assert peak == pytest.approx(16 * (1800 + 2400) * 1e6 / 1e12)  # the fixture's little_big on 2 cores
    records = json.loads(matmul.stdout)["records"]
    tops = max(r["value"] for r in records if r["metric"] == "effective_tops")
    with Store(store) as s:
        (device,) = {d["device"]: d for d in s.device_info()}.values()
    fp_clusters = device["fingerprint"]["cpu_clusters"]  # the clock the board's sysfs declared, read there
    assert [(len(c["cpus"]), c["max_mhz"]) for c in fp_clusters] == clusters
    texts = {}
    for suffix in ("html", "md"):
        out = tmp_path / f"report.{suffix}"
        res = edgebench("report", "--store", store, "--out", out, cwd=tmp_path, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        texts[suffix] = out.read_text()
    for suffix, text in texts.items():
        assert "aarch64" in text, suffix
        assert "SIMD: asimd asimddp asimdhp fphp" in text, suffix  # the board's Armv8.2 features
        assert "1x Cortex-A76 1800 MHz cap 446 + 1x Cortex-A76 2400 MHz cap 1024" in text, suffix
        assert f"{peak:.3g} (derived)" in text, suffix  # the ceilings table: the nominal, marked derived
        assert f"nominal peak (derived, not datasheet): fp32 {peak:.3g}" in text, suffix
        for n, mhz in clusters:  # the arithmetic: pipes x NEON width x lanes x 2, x clock x cores
            per_cycle = A76_FMA_PIPES * NEON_FP32_LANES * FLOP_PER_FMA
            term = (
                f"{n} x Cortex-A76 ({A76_FMA_PIPES}x128-bit NEON FMA x {NEON_FP32_LANES} lanes x "
                f"{FLOP_PER_FMA} = {per_cycle} FLOP/cycle) x {mhz:.0f} MHz"
            )
            assert term in text, (suffix, term)
        assert "int8 x4" in text and "fp16 x2" in text, suffix  # asimddp and fphp scale the fp32 peak
        assert f"{tops / peak:.1%}" in text, suffix  # the efficiency: measured over that derived peak


class AgentWatch:
    """The host's view of the board's bench agents while a command runs: for each agent process (started
    in the board's chroot with a bench task), the Cpus_allowed_list its /proc status showed, oldest
    process first. The kernel's answer, not the agent's: qemu-user runs each board process as a host one."""

    def __init__(self, rootfs: Path, python: str) -> None:
        self.rootfs, self.python = str(rootfs), python.encode()
        self.seen: dict[int, list[str]] = {}  # pid -> distinct lists in the order seen
        self.stop = threading.Event()

    def allowed(self, pid: int) -> str | None:
        """The Cpus_allowed_list of `pid` when it is a bench agent on the board, else None."""
        try:
            if os.readlink(f"/proc/{pid}/root") != self.rootfs:
                return None
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:  # gone, or not ours to read
            return None
        # qemu-aarch64 and the file it runs come first, then the process's own argv: the board's python,
        # the agent, --task and the task (the env and sh wrappers around it carry the same words later)
        argv = cmdline.split(b"\0")[2:]
        if argv[:1] != [self.python] or b"--task" not in argv[:-1]:
            return None
        if b'"bench"' not in argv[argv.index(b"--task") + 1]:
            return None
        lines = [ln for ln in status.splitlines() if ln.startswith("Cpus_allowed_list:")]
        return lines[0].split(":", 1)[1].strip() if lines else None

    def poll(self) -> None:
        while not self.stop.wait(0.05):
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
                allowed = self.allowed(pid)
                lists = self.seen.setdefault(pid, []) if allowed else []
                if allowed and (not lists or lists[-1] != allowed):
                    lists.append(allowed)

    def last(self) -> list[str]:
        """Each agent's last Cpus_allowed_list (after it pinned itself), agents in start order."""
        return [self.seen[pid][-1] for pid in sorted(self.seen)]


@contextmanager
def watching_agents(board: ArmBoard) -> Iterator[AgentWatch]:
    watch = AgentWatch(board.rootfs, board.python)
    poller = threading.Thread(target=watch.poll, daemon=True)
    poller.start()
    try:
        yield watch
    finally:
        watch.stop.set()
        poller.join()


def test_threads_pinned_to_a_cluster_by_name_runs_on_the_cpus_the_boards_sysfs_ranks_so(
    arm_board: ArmBoard, tmp_path: Path
) -> None:
    assert arm_board.topology is not None
    # the lab's sysfs: the cluster of lower cpu_capacity is little, the higher big (the kernel's ranking)
    by_capacity = sorted(arm_board.topology.clusters, key=lambda c: c[1])
    little, big = (",".join(map(str, cpus)) for cpus, _, _ in (by_capacity[0], by_capacity[-1]))
    quick = ("--model", "builtin:mlp", "--threads", "1", "--rounds", "1", "--runs", "2", "--warmup", "0")
    quick += ("--warmup-seconds", "0", "--min-seconds", "0", "--max-seconds", "5", "--json")
    common = ("--device", arm_board.name, "--lab", arm_board.lab_dir, "--store", tmp_path / "s.db")
    runs = {
        "affinity": ("--affinity", "little", "--no-per-cluster"),  # the sweep pinned by the cluster's name
        "clusters": ("--clusters", "big"),  # the sweep's own per-cluster group, from the board's sysfs
    }
    for how, (expected_name, expected_cpus) in zip(runs, (("little", little), ("big", big)), strict=True):
        with watching_agents(arm_board) as watch:
            res = edgebench("probe", "threads", *quick, *common, *runs[how], cwd=tmp_path, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        records = [r for r in json.loads(res.stdout)["records"] if r["metric"] == "latency_ms"]
        assert records, res.stdout[-2000:]
        cpus = [int(c) for c in expected_cpus.split(",")]
        for r in records:  # what the records say: the CPU set asked and the one the agent found itself on
            assert r["params"]["affinity"] == cpus, (how, r["params"])
            assert r["annotations"]["cpus_allowed"] == cpus, (how, r["annotations"])
        if how == "affinity":
            assert {r["annotations"]["affinity_cluster"] for r in records} == {expected_name}
        else:
            assert {r["params"]["cluster"] for r in records} == {expected_name}
        # and what the host kernel says the agent process was allowed to run on, read while it ran
        assert watch.last() == [expected_cpus], (how, watch.seen)


def test_doctor_profile_and_accuracy_run_on_the_board(arm_board: ArmBoard, tmp_path: Path) -> None:
    """The other verbs a board is measured with, on aarch64 code through the real ssh transport: doctor's
    harness-vs-bare comparison, per-op times named as the model's own nodes, and numerics of ncnn (a pnnx
    conversion made on the host, run by the aarch64 ncnn wheel) against onnxruntime's fp32 on the board."""
    import onnx

    from edgebench.models.refs import resolve_model

    common = ("--device", arm_board.name, "--lab", arm_board.lab_dir, "--no-store", "--json")
    doctor = edgebench(
        "doctor", *common, "--rounds", "2", "--runs", "5", "--matmul-n", "0", "--bandwidth-mb", "0",
        cwd=tmp_path, timeout=1200,
    )  # fmt: skip
    assert doctor.returncode in (0, 1), doctor.stderr[-3000:]  # 1: a finding (emulated timing is noisy)
    records = json.loads(doctor.stdout)["records"]
    assert {r["device"] for r in records} == {arm_board.name}
    compared = {r["runtime"] for r in records if r["metric"] == "harness_overhead"}
    assert "onnxruntime" in compared, sorted({(r["metric"], r["runtime"]) for r in records})

    profile = edgebench("profile", "builtin:mlp", *common, "--threads", "1", cwd=tmp_path, timeout=1200)
    assert profile.returncode == 0, profile.stderr[-3000:]
    records = json.loads(profile.stdout)["records"]
    ops = {r["params"]["node"] for r in records if r["metric"] == "op_time_ms"}
    layers = {n.name.split("/")[0] for n in onnx.load(resolve_model("builtin:mlp").path).graph.node}
    # onnxruntime on the board fuses MatMul+Add (and Relu) into one kernel named after the first node
    profiled = {op.removeprefix("fused ").split("/")[0] for op in ops}
    assert profiled == layers, (ops, layers)  # every layer of the model timed, nothing else

    accuracy = edgebench(
        "accuracy", "builtin:mlp", "--runtime", "ncnn", "--reference", "builtin:mlp", "--reference-runtime",
        "onnxruntime", *common, cwd=tmp_path, timeout=1200,
    )  # fmt: skip
    assert accuracy.returncode == 0, accuracy.stderr[-3000:]
    got = {r["metric"]: r["value"] for r in json.loads(accuracy.stdout)["records"]}
    assert got["max_abs_err"] < 1e-3 and got["cosine"] > 0.99999, got  # fp32 on both sides
