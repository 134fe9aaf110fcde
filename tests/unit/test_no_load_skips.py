"""No test skips for load: a skip is for an absent tool or platform, with its reason (a machine is never
quiet, so a check that skips when it is busy never runs where it matters). Scans the test sources."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# What a skip for load says: the machine, its load or quiet, other work, a verdict's outcome.
LOAD_WORDS = re.compile(
    r"quiet|loaded|\bload\b|busy|noisy|other work|verdict|outcome|re-run|ratio|band|disturbed", re.I
)
SKIP = re.compile(r"pytest\.skip\((.*)|skipif\((.*)|outcome == \"skip\"")


def load_skips() -> list[str]:
    """file:line of every skip whose reason or condition speaks of load or a verdict."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            match = SKIP.search(line)
            if not match:
                continue
            context = " ".join(lines[max(0, i - 2) : i + 2])  # the condition above and the reason
            if LOAD_WORDS.search(context) or 'outcome == "skip"' in line:
                found.append(f"{path.relative_to(TESTS)}:{i + 1}: {line.strip()}")
    return found


def test_no_test_skips_for_load() -> None:
    assert load_skips() == []


def test_the_scan_finds_a_skip_for_load(tmp_path: Path) -> None:
    sample = 'if verdict.outcome == "skip":\n    pytest.skip(verdict.reason)\n'
    lines = sample.splitlines()
    assert SKIP.search(lines[0]) and LOAD_WORDS.search(" ".join(lines))
