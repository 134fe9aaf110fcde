"""The reported case end to end: a suite of bench + bandwidth + matmul on `local` (no roofline probe), then
`edgebench report`, which once ended in `internal error: KeyError: 'device'`. Short params: about 10 s."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

SUITE = """
name = "crash"
devices = ["local"]
models = ["builtin:tinymlp"]
[[probe]]
kind = "bench"
params = { threads = 1, runs = 20, warmup_seconds = 0.0, min_seconds = 0.1 }
[[probe]]
kind = "bandwidth"
params = { kernel = "triad", threads = 1, array_mb = 8, max_seconds = 2 }
[[probe]]
kind = "matmul"
params = { dtype = "fp32", threads = 1, sizes = [128], skinny = false, trials = 2, max_seconds = 2 }
[policy]
cooldown = false
"""


class _States(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.states[a["id"] or ""] = a.get("data-state") or ""


def test_bench_bandwidth_matmul_suite_then_report(tmp_path: Path) -> None:
    (tmp_path / "crash.toml").write_text(SUITE)
    run = edgebench("run", "crash.toml", "--store", "s.db", "--lock-dir", tmp_path / "locks", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for out in ("r.html", "r.md"):
        res = edgebench("report", "--store", "s.db", "--out", out, cwd=tmp_path)
        assert res.returncode == 0 and "internal error" not in res.stderr, res.stderr
    doc = _States()
    doc.feed((tmp_path / "r.html").read_text())
    # The ceilings the suite measured are drawn; the models have no counts to place on them.
    assert doc.states["ceilings"] == "data" and doc.states["roofline"] == "data", doc.states
    assert (tmp_path / "r.md").read_text().startswith("# edgebench report: crash run ")
