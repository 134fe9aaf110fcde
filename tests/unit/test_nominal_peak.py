"""A nominal peak derived from the ISA (FMA units x vector width x clock x cores), marked derived, and the
descriptor's datasheet overriding it; the report's ceilings table shows it for local."""

from __future__ import annotations

import pytest

from edgebench.agent.info import fingerprint
from edgebench.lab.nominal import derived_peak, nominal_peak
from edgebench.records import RecordContext
from edgebench.render.report.frames import ceilings

SPR = {
    "arch": "x86_64",
    "cores": 2,
    "max_mhz": 2100.0,
    "cpu_flags": ["avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16", "fma"],
}


def test_x86_and_arm_peaks_are_the_isa_arithmetic() -> None:
    peak = derived_peak(SPR)
    assert peak is not None and peak.source == "derived"
    assert peak.tops["fp32"] == pytest.approx(64 * 2100e6 * 2 / 1e12)  # 2 FMA x 16 lanes x 2
    assert peak.tops["int8"] == pytest.approx(2048 * 2100e6 * 2 / 1e12)  # AMX tiles
    assert "AMX-INT8" in peak.basis and "2100 MHz" in peak.basis
    avx2 = derived_peak({**SPR, "cpu_flags": ["avx2", "fma"]})
    assert avx2 is not None and avx2.tops["fp32"] == pytest.approx(32 * 2100e6 * 2 / 1e12)
    a76 = derived_peak({"arch": "aarch64", "cores": 4, "max_mhz": 2400.0, "cpu_flags": ["asimd", "asimddp"]})
    assert a76 is not None and a76.tops["fp32"] == pytest.approx(16 * 2400e6 * 4 / 1e12)
    assert a76.tops["int8"] == pytest.approx(64 * 2400e6 * 4 / 1e12)
    assert derived_peak({**SPR, "max_mhz": None}) is None  # no clock, no figure


def test_the_datasheet_overrides_and_this_host_gets_a_figure() -> None:
    info = {"fingerprint": SPR, "descriptor": {"spec": {"peak_tops": {"fp32": 0.5}}}}
    peak = nominal_peak(info)
    assert peak is not None and peak.source == "datasheet" and peak.tops["fp32"] == 0.5
    here = fingerprint()
    assert here["cores"] and "cpu_flags" in here and "max_mhz" in here
    if here["max_mhz"]:
        assert nominal_peak({"fingerprint": here}) is not None


def test_the_ceilings_table_shows_the_derived_nominal_and_the_efficiency_against_it() -> None:
    ctx = RecordContext("r", "local", "matmul")
    rec = ctx.record("effective_tops", 0.134, "TOPS", dtype="fp32", backend="onnxruntime", stat="best")
    info = [{"device": "local", "fingerprint": SPR, "descriptor": {"spec": {}}}]
    row = ceilings([rec], info).iloc[0]
    assert row.nominal_source.startswith("derived") and row.datasheet == pytest.approx(0.2688)
    assert row.efficiency == pytest.approx(0.134 / 0.2688)
    spec = [{"device": "local", "fingerprint": SPR, "descriptor": {"spec": {"peak_tops": {"fp32": 1.0}}}}]
    assert ceilings([rec], spec).iloc[0].nominal_source == "datasheet"
