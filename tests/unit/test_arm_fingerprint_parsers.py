"""Parser tests over /proc/cpuinfo and sysfs in the formats real aarch64 devices write (a Cortex-A76/A55
big.LITTLE phone, a Raspberry Pi 5, a Neoverse-V1 server with 256-bit SVE), laid out in a sysroot the
agent's fingerprint reads; the derived Arm nominal peak against hand-computed figures; ISA-keyed runtime
rules (MNN's GEMM tile, onnxruntime's NCHWc block) never applying x86 values to an Arm device."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebench.agent.info import core_name, cpu_clusters, fingerprint
from edgebench.analysis.kernels import Kernel, mark_gemm_tile_reads, runs_gemm_tiles
from edgebench.lab.health import DeviceCheck, _fill_agent_facts, check_rows
from edgebench.lab.nominal import derived_peak
from edgebench.render.report.frames import arm_details
from edgebench.runtimes import runtime
from edgebench.runtimes.onnxruntime import nchwc_block

mnn_gemm_tile = runtime("mnn").gemm_tile

PHONE_FEATURES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
)
V1_FEATURES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop "
    "sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 "
    "i8mm bf16 dgh rng"
)


def _cpuinfo(cpus: list[tuple[str, str, str, str]], tail: str = "") -> str:
    """/proc/cpuinfo as arm64 Linux prints it: one block per processor (features, implementer, variant,
    part, revision), "CPU architecture: 8" without the tab, a blank line between blocks."""
    blocks = [
        f"processor\t: {i}\nBogoMIPS\t: 38.40\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
        f"CPU architecture: 8\nCPU variant\t: {variant}\nCPU part\t: {part}\nCPU revision\t: {rev}\n"
        for i, (features, variant, part, rev) in enumerate(cpus)
    ]
    return "\n".join(blocks) + "\n" + tail


def _sysroot(
    root: Path, cpuinfo: str, capacity: list[int], policies: dict[int, tuple[list[int], int]], sve: int = 0
) -> Path:
    """A sysroot: proc/cpuinfo, per-CPU cpu_capacity, cpufreq policies with cpuN/cpufreq symlinks to them
    (as the kernel lays them out), and the SVE default vector length in bytes when given."""
    (root / "proc/sys/abi").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text(cpuinfo)
    if sve:
        (root / "proc/sys/abi/sve_default_vector_length").write_text(f"{sve}\n")
    cpu = root / "sys/devices/system/cpu"
    for i, cap in enumerate(capacity):
        (cpu / f"cpu{i}").mkdir(parents=True)
        (cpu / f"cpu{i}/cpu_capacity").write_text(f"{cap}\n")
    for first, (cpus, khz) in policies.items():
        policy = cpu / f"cpufreq/policy{first}"
        policy.mkdir(parents=True)
        (policy / "cpuinfo_max_freq").write_text(f"{khz}\n")
        (policy / "related_cpus").write_text(" ".join(map(str, cpus)) + "\n")
        for c in cpus:
            (cpu / f"cpu{c}/cpufreq").symlink_to(f"../cpufreq/policy{first}")
    return root


@pytest.fixture
def phone(tmp_path: Path) -> Path:
    a55, a76 = (PHONE_FEATURES, "0x1", "0xd05", "0"), (PHONE_FEATURES, "0x3", "0xd0b", "1")
    # MediaTek Helio G90T (MT6785): 6 x Cortex-A55 at 2.0 GHz, 2 x Cortex-A76 at 2.05 GHz
    info = _cpuinfo([a55] * 6 + [a76] * 2, "Hardware\t: MT6785\n")
    policies = {0: ([0, 1, 2, 3, 4, 5], 2000000), 6: ([6, 7], 2050000)}
    return _sysroot(tmp_path / "phone", info, [446] * 6 + [1024] * 2, policies)


@pytest.fixture
def rpi5(tmp_path: Path) -> Path:
    tail = "Revision\t: d04170\nSerial\t\t: 5c2d9e1f0a3b4c6d\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n"
    info = _cpuinfo([(PHONE_FEATURES, "0x4", "0xd0b", "1")] * 4, tail)
    return _sysroot(tmp_path / "rpi5", info, [1024] * 4, {0: ([0, 1, 2, 3], 2400000)})


@pytest.fixture
def server(tmp_path: Path) -> Path:
    info = _cpuinfo([(V1_FEATURES, "0x1", "0xd40", "1")] * 4)
    return _sysroot(tmp_path / "server", info, [1024] * 4, {i: ([i], 2600000) for i in range(4)}, sve=32)


def _arm(fp: dict) -> dict:
    """The host-read fingerprint as the aarch64 device's agent reports it (this host's uname is x86)."""
    return {**fp, "arch": "aarch64", "cores": len(sum((c["cpus"] for c in fp["cpu_clusters"]), []))}


def test_a_big_little_phone_has_two_clusters_named_from_the_midr(phone: Path) -> None:
    fp = fingerprint(str(phone))
    assert fp["cpu_flags"] == ["asimd", "asimddp", "asimdhp", "fphp"]
    assert fp["cpu_clusters"] == [
        {
            "cpus": [0, 1, 2, 3, 4, 5],
            "capacity": 446,
            "max_mhz": 2000.0,
            "core": "Cortex-A55",
            "midr_part": "0xd05",
        },
        {
            "cpus": [6, 7],
            "capacity": 1024,
            "max_mhz": 2050.0,
            "core": "Cortex-A76",
            "midr_part": "0xd0b",
        },
    ]
    assert fp["max_mhz"] == 2050.0 and fp["sve_vector_bits"] is None


def test_a_raspberry_pi_5_is_one_cluster_of_four_a76(rpi5: Path) -> None:
    fp = fingerprint(str(rpi5))
    assert [(c["core"], c["cpus"], c["max_mhz"]) for c in fp["cpu_clusters"]] == [
        ("Cortex-A76", [0, 1, 2, 3], 2400.0)
    ]
    assert "i8mm" not in fp["cpu_flags"] and "asimddp" in fp["cpu_flags"]


def test_a_neoverse_server_reports_sve_its_length_and_one_cluster_over_per_cpu_policies(server: Path) -> None:
    fp = fingerprint(str(server))
    assert {"sve", "i8mm", "bf16", "asimddp"} <= set(fp["cpu_flags"]) and "sve2" not in fp["cpu_flags"]
    assert fp["sve_vector_bits"] == 256
    assert [(c["core"], c["cpus"]) for c in fp["cpu_clusters"]] == [("Neoverse-V1", [0, 1, 2, 3])]


def test_the_midr_comes_from_sysfs_when_cpuinfo_has_none_and_unknown_parts_keep_their_hex(
    tmp_path: Path,
) -> None:
    root = _sysroot(tmp_path, "processor\t: 0\nFeatures\t: fp asimd\n\n", [1024], {0: ([0], 2000000)})
    regs = root / "sys/devices/system/cpu/cpu0/regs/identification"
    regs.mkdir(parents=True)
    (regs / "midr_el1").write_text("0x00000000410fd990\n")  # implementer 0x41, part 0xd99: not a known core
    (cluster,) = cpu_clusters(str(root))
    assert cluster["core"] == "unknown (0x41:0xd99)" and cluster["midr_part"] == "0xd99"
    assert core_name(0x41, 0xD0C) == "Neoverse-N1" and core_name(0x51, 0xD0B) == "unknown (0x51:0xd0b)"


def test_the_arm_nominal_peak_is_pipes_times_width_times_clock_times_cores_per_cluster(
    phone: Path, rpi5: Path, server: Path
) -> None:
    # phone: 6 x A55 (1 x 128-bit FMA: 1 x 4 lanes x 2 = 8 FLOP/cycle) x 2.0 GHz = 96.0 GFLOP/s
    #      + 2 x A76 (2 x 128-bit: 16 FLOP/cycle) x 2.05 GHz = 65.6 GFLOP/s  -> 0.1616 TOPS fp32
    peak = derived_peak(_arm(fingerprint(str(phone))))
    assert peak is not None and peak.source == "derived"
    assert peak.tops["fp32"] == pytest.approx(0.1616)
    assert peak.tops["fp16"] == pytest.approx(0.3232)  # asimdhp: 8 fp16 lanes
    assert peak.tops["int8"] == pytest.approx(0.6464)  # sdot: 4 multiply-adds per 32-bit lane
    assert "6 x Cortex-A55" in peak.basis and "2 x Cortex-A76" in peak.basis and "2050 MHz" in peak.basis
    # Raspberry Pi 5: 4 x A76 x 16 FLOP/cycle x 2.4 GHz = 153.6 GFLOP/s
    pi = derived_peak(_arm(fingerprint(str(rpi5))))
    assert (
        pi is not None
        and pi.tops["fp32"] == pytest.approx(0.1536)
        and pi.tops["int8"] == pytest.approx(0.6144)
    )
    # Neoverse-V1, SVE at 256 bits: 2 pipes x 8 lanes x 2 = 32 FLOP/cycle x 2.6 GHz x 4 = 332.8 GFLOP/s;
    # i8mm (smmla): 8x fp32, bf16 2x
    v1 = derived_peak(_arm(fingerprint(str(server))))
    assert v1 is not None and v1.tops["fp32"] == pytest.approx(0.3328)
    assert v1.tops["int8"] == pytest.approx(2.6624) and v1.tops["bf16"] == pytest.approx(0.6656)
    assert "256-bit SVE" in v1.basis
    # a core not in the table: 2 x 128-bit pipes assumed, and said: 16 x 2.0 GHz x 2 = 64 GFLOP/s
    odd = {
        "arch": "aarch64",
        "cpu_flags": ["asimd"],
        "cpu_clusters": [{"cpus": [0, 1], "max_mhz": 2000.0, "core": "unknown (0x61:0x022)"}],
    }
    guess = derived_peak(odd)
    assert guess is not None and guess.tops["fp32"] == pytest.approx(0.064) and "assumed" in guess.basis


def test_an_arm_fingerprint_never_gets_the_x86_tile_or_nchwc_block() -> None:
    arm = {"arch": "aarch64", "cpu_flags": ["asimd", "asimddp", "i8mm"]}
    x86 = {"arch": "x86_64", "cpu_flags": ["avx2", "fma", "avx512f"]}
    assert nchwc_block(arm) == 1 and nchwc_block(x86) == 16
    assert mnn_gemm_tile(arm) == 12 and mnn_gemm_tile(x86) == 24
    assert mnn_gemm_tile({"arch": "riscv64"}) is None and mnn_gemm_tile({}) is None
    # a 1x1 convolution over 36 output positions: whole arm64 tiles (12), not whole x86 ones (24)
    conv = Kernel("conv", 2 * 16 * 32 * 36, 0.0, 0.0, op_type="Conv", geometry=(16.0, 32.0, 36.0, 16.0))
    dims_in, dims_out = (1, 16, 6, 6), (1, 32, 6, 6)
    assert runs_gemm_tiles(conv, dims_in, dims_out, mnn_gemm_tile(arm))
    assert not runs_gemm_tiles(conv, dims_in, dims_out, mnn_gemm_tile(x86))
    assert not runs_gemm_tiles(conv, dims_in, dims_out, mnn_gemm_tile({"arch": "riscv64"}))
    # the profile side: MNN's unary op after that convolution is marked at the arm64 tile only
    unary = Kernel("elementwise", 0.0, 0.0, 0.0, op_type="UnaryOp")
    ran = [(conv, dims_in, dims_out), (unary, dims_out, dims_out)]
    marks = {tile: mark_gemm_tile_reads(ran, tile)[1].reads_gemm_tiles for tile in (12, 24, None)}
    assert marks == {12: True, 24: False, None: False}


def test_the_predictor_keys_each_devices_tile_and_block_by_its_isa() -> None:
    from edgebench.analysis.kernel_predict import TargetPredictor

    infos = [
        {"device": "pi5", "fingerprint": {"arch": "aarch64", "cpu_flags": ["asimd"]}},
        {"device": "local", "fingerprint": {"arch": "x86_64", "cpu_flags": ["avx2", "fma"]}},
    ]
    predictor = TargetPredictor([], {}, device_info=infos)
    assert [predictor.gemm_tile(d, "mnn") for d in ("pi5", "local", "unknown")] == [12, 24, 24]
    assert [predictor.layout_block(d, "onnxruntime") for d in ("pi5", "local", "unknown")] == [1, 8, 1]
    assert predictor.layout_block("local", "mnn") == 1  # MNN has no NCHWc layout


def test_devices_check_and_the_report_show_the_arm_features_clusters_and_a_derived_peak(phone: Path) -> None:
    fp = _arm(fingerprint(str(phone)))
    report = DeviceCheck("phone", "adb", reachable=True, usable=True)
    _fill_agent_facts(report, fp)
    (row,) = check_rows([report])
    assert (
        "asimddp" in row[2] and "6x Cortex-A55 2000 MHz cap 446 + 2x Cortex-A76 2050 MHz cap 1024" in row[2]
    )
    details = arm_details(fp)
    assert "SIMD: asimd asimddp" in details and "derived, not datasheet" in details
    assert "fp32 0.162" in details
    assert arm_details({"arch": "x86_64", "cpu_flags": ["avx2"]}) == ""  # x86 rows are unchanged
