"""An aarch64 target is judged by the Arm rules, never the x86 ones: the kernel predictor takes MNN's GEMM
tile and onnxruntime's NCHWc block from the device's own fingerprint (Cortex-A76 board: arm64 NEON, tile
12, no NCHWc), and the derived peak is worked out with NEON, not AVX."""

from __future__ import annotations

from pathlib import Path

from edgebench.analysis import kernel_predict as kp
from edgebench.lab.nominal import derived_peak
from edgebench.models.kernel_samples import sample_model

# the aarch64 board's fingerprint as the agent reports it (tests/integration/test_arm_board.py)
BOARD = {
    "arch": "aarch64",
    "cores": 2,
    "max_mhz": 2400.0,
    "cpu_flags": ["asimd", "asimddp", "asimdhp", "fphp"],
    "cpu_clusters": [
        {"cpus": [0], "capacity": 446, "max_mhz": 1800.0, "core": "Cortex-A76"},
        {"cpus": [1], "capacity": 1024, "max_mhz": 2400.0, "core": "Cortex-A76"},
    ],
}
PC = {"arch": "x86_64", "cores": 2, "max_mhz": 2400.0, "cpu_flags": ["avx", "avx2", "fma", "sse2"]}
# a 1x1 convolution over 6 x 6 = 36 positions, then a hard-swish: whole GEMM tiles of 12 (MNN's arm64
# eP), not of 24 (its x86-64 one)
KEY = "kernel:convswish,c=16,o=32,h=6,w=6"


def test_the_predictor_marks_mnn_tile_reads_at_the_arm_tile_on_the_board(tmp_path: Path) -> None:
    _, path = sample_model(KEY, tmp_path)
    devices = [{"device": "board", "fingerprint": BOARD}, {"device": "pc", "fingerprint": PC}]
    predictor = kp.TargetPredictor([], {"m": str(path)}, device_info=devices)
    assert predictor.gemm_tile("board", "mnn") == 12 and predictor.gemm_tile("pc", "mnn") == 24
    assert (
        predictor.layout_block("board", "onnxruntime") == 1
        and predictor.layout_block("pc", "onnxruntime") == 8
    )

    def marked(device: str) -> list[bool]:
        kernels = predictor.graph("m", "{}", "mnn", device) or []
        return [k.reads_gemm_tiles for k in kernels if k.kind == "elementwise"]

    assert marked("board") == [True] and marked("pc") == [False]


def test_the_boards_derived_peak_is_neon_per_cluster_not_an_x86_formula() -> None:
    peak = derived_peak(BOARD)
    assert peak is not None and "128-bit NEON" in peak.basis and "AVX" not in peak.basis
    # 2 FMA pipes x 4 fp32 lanes x 2 FLOP = 16 per cycle, x (1800 + 2400) MHz, one core each
    assert abs(peak.tops["fp32"] - 16 * (1800 + 2400) * 1e6 / 1e12) < 1e-12
