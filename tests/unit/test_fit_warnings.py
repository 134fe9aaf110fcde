"""fit's warnings concern the rows asked for, and each names the next step."""

from __future__ import annotations

import re

import pytest

from edgebench.analysis import fit
from edgebench.errors import UserError
from tests.unit.test_fit import COUNTS, bench_records, fleet_records


def _store() -> list:
    """The fleet, plus models benched with no counts and a device with a single uncounted bench."""
    records = fleet_records()
    for name in ("u1", "u2", "u3"):
        records += bench_records("board", name, 3.0)
    records += bench_records("phone", "u1", 5.0)
    return records


def test_warnings_name_only_the_models_asked_about() -> None:
    records = _store()
    everything = fit.assess(records, counts=COUNTS, models=["mystery", "m3"])
    assert any("u2" in w for w in everything.warnings) and any("mystery" in w for w in everything.warnings)
    asked = fit.assess(records, counts=COUNTS, models=["mystery", "m3"], asked=["m3"], devices=["board"])
    others = re.compile(r"\b(u1|u2|u3|mystery)\b")
    assert not [w for w in asked.warnings if others.search(w)], asked.warnings
    about = fit.assess(records, counts=COUNTS, models=["mystery"], asked=["mystery"])
    said = [w for w in about.warnings if "mystery" in w]
    assert said and all("edgebench" in w or "--model" in w for w in said), said  # the next step


def test_a_device_with_no_bench_says_the_command_to_run() -> None:
    with pytest.raises(UserError, match=r"run `edgebench bench m3 --device rpi5` first"):
        fit.assess(fleet_records(), counts=COUNTS, devices=["rpi5"], asked=["m3"])
