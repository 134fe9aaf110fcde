"""Report and fit on a real store: a fleet of generated models benched with `edgebench bench` on two devices
(the host at one thread and at two, each its own descriptor), ceilings probed, `fit` with predictions for a
model never benched on one of them, and the HTML report rendered by headless Chromium."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgebench.models.builtin import build_convnet, build_encoder, build_mlp
from edgebench.render.report.html import SECTIONS
from edgebench.results.store import Store
from edgebench.testing.verdict import OTHERS_QUIET, OthersWatch, Verdict, band_verdict, until_conclusive

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WINDOW = (1280, 2400)
# Three families over a range of FLOPs and weight bytes, about a second of benching each: memory-bound
# GEMV stacks on both sides of the last-level cache, compute-bound convolutions with channel counts the CPU
# kernels block evenly (a count that pads to the next SIMD block costs more than its FLOPs say, which
# static counts cannot see), and attention blocks.
FLEET = {
    "mlp_a": lambda: build_mlp(hidden=512, width=512, layers=3),
    "mlp_b": lambda: build_mlp(hidden=1024, width=512, layers=3),
    "mlp_c": lambda: build_mlp(hidden=1024, width=1024, layers=3),
    "mlp_d": lambda: build_mlp(hidden=1536, width=1024, layers=3),
    "mlp_e": lambda: build_mlp(hidden=2048, width=1024, layers=3),
    "mlp_f": lambda: build_mlp(hidden=2048, width=2048, layers=3),
    "conv_a": lambda: build_convnet(size=48, channels=32),
    "conv_b": lambda: build_convnet(size=64, channels=32),
    "conv_c": lambda: build_convnet(size=64, channels=48),
    "conv_d": lambda: build_convnet(size=80, channels=48),
    "conv_e": lambda: build_convnet(size=96, channels=64),
    "enc_a": lambda: build_encoder(seq=32, d_model=128, heads=4, ffn=512),
    "enc_b": lambda: build_encoder(seq=64, d_model=128, heads=4, ffn=512),
    "enc_c": lambda: build_encoder(seq=96, d_model=192, heads=4, ffn=768),
    "enc_d": lambda: build_encoder(seq=128, d_model=256, heads=4, ffn=1024),
    "enc_e": lambda: build_encoder(seq=192, d_model=256, heads=4, ffn=1024),
}
HELD_OUT = "conv_h"  # benched on cpu2 only: fit must predict it on cpu1 (the steadier device)
HELD_OUT_BUILD = lambda: build_convnet(size=72, channels=48)  # noqa: E731
DEVICES = {"cpu1": 1, "cpu2": 2}  # device -> thread count it is benched with


@dataclass
class Fleet:
    root: Path
    db: Path
    lab: Path
    models: dict[str, Path]
    env: dict[str, str]
    others_share: float = 0.0  # how much of the machine other work took while the fixture benched

    def cli(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgebench", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = self.cli(*args)
        assert out.returncode == 0, (args, out.stderr[-2000:])
        return out

    def in_process(self, *args: str) -> str:
        """The real command line run in this process (saves an interpreter start per bench): its stdout."""
        from edgebench.cli import main

        out, err = io.StringIO(), io.StringIO()
        with (
            pytest.MonkeyPatch.context() as mp,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            mp.setenv("XDG_CACHE_HOME", self.env["XDG_CACHE_HOME"])
            mp.setattr(sys, "argv", ["edgebench", *args])  # what the run's provenance records
            mp.chdir(self.root)
            with pytest.raises(SystemExit) as exc:
                main(list(args))
        assert exc.value.code in (0, None), (args, err.getvalue()[-2000:])
        return out.getvalue()

    def bench(self, model: str, device: str) -> None:
        self.in_process(
            "bench",
            str(self.models[model]),
            "--device",
            device,
            "--lab",
            str(self.lab),
            "--threads",
            str(DEVICES[device]),
            "--runs",
            "400",  # p99 needs 368 samples for a bounded interval
            "--min-seconds",
            "0.1",
            "--warmup",
            "3",
            "--warmup-seconds",
            "0.1",  # tiny models: three runs warm them; the default half second is 16 s of this fixture
            "--store",
            str(self.db),
            "--json",
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    root = tmp_path_factory.mktemp("fleet")
    lab = root / "devices"
    lab.mkdir()
    for name in DEVICES:
        (lab / f"{name}.toml").write_text(f'name = "{name}"\ntransport = "local"\nsoc = "host CPU"\n')
    models = {}
    for name, build in [*FLEET.items(), (HELD_OUT, HELD_OUT_BUILD)]:
        models[name] = root / "models" / f"{name}.onnx"
        models[name].parent.mkdir(exist_ok=True)
        onnx.save(build(), models[name])
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache")}
    f = Fleet(root, root / "lab.db", lab, models, env)
    with OthersWatch() as watch:
        for device in DEVICES:
            for name in FLEET:
                f.bench(name, device)
        f.bench(HELD_OUT, "cpu2")
    f.others_share = watch.others_share
    # Ceilings on cpu1 only (quick settings): cpu2's calibration has to do without.
    f.ok(
        "probe",
        "matmul",
        "--device",
        "cpu1",
        "--lab",
        str(lab),
        "--dtype",
        "fp32",
        "--backend",
        "numpy",
        "--threads",
        "1",
        "--sizes",
        "256,512",
        "--skinny",
        "none",
        "--trials",
        "3",
        "--store",
        str(f.db),
    )
    f.ok(
        "probe",
        "bandwidth",
        "--device",
        "cpu1",
        "--lab",
        str(lab),
        "--threads",
        "1",
        "--array-mb",
        "64",
        "--trials",
        "3",
        "--store",
        str(f.db),
    )
    f.ok(
        "probe",
        "threads",
        "--model",
        str(models["enc_b"]),
        "--device",
        "cpu1",
        "--lab",
        str(lab),
        "--runs",
        "30",
        "--min-seconds",
        "0.1",
        "--store",
        str(f.db),
    )
    return f


def _p99(db: Path, device: str, model: str) -> float:
    with Store(db) as st:
        return next(
            r.value
            for r in st.records(device=device, model=model, probe="bench", metric="latency_ms")
            if r.params.get("stat") == "p99"
        )


def test_fit_measured_predicted_and_cross_validated(fleet: Fleet) -> None:
    small, big = _p99(fleet.db, "cpu1", "mlp_a"), _p99(fleet.db, "cpu1", "conv_e")
    limit = math.sqrt(small * big)  # between the two, far from both
    models = [a for name, path in fleet.models.items() for a in ("--model", str(path))]
    out = fleet.cli(
        "fit",
        "--store",
        str(fleet.db),
        *models,
        "--budget",
        f"latency_p99_ms={limit:.4f}",
        "--budget",
        "memory_mb=100000",
        "--json",
    )
    doc = json.loads(out.stdout)
    assert out.returncode == doc["exit_code"] == 1, out.stderr[-2000:]  # conv_e does not fit: exit 1
    fits = {(r["device"], r["model"]): r for r in doc["records"] if r["metric"] == "fits"}
    small_fit, big_fit = fits[("cpu1", "mlp_a")]["annotations"], fits[("cpu1", "conv_e")]["annotations"]
    assert fits[("cpu1", "mlp_a")]["value"] == 1.0 and small_fit["basis"] == "measured"
    assert small_fit["verdict"] == "fits" and small_fit["ratio"] < 1
    assert fits[("cpu1", "conv_e")]["value"] == 0.0 and big_fit["basis"] == "measured"
    assert (
        big_fit["limiting"] == "latency_p99_ms"
        and big_fit["verdict"] == "does not fit"
        and big_fit["ratio"] > 1
    )
    held = fits[("cpu1", HELD_OUT)]["annotations"]
    assert held["basis"] == "predicted" and held["verdict"] in ("fits", "does not fit", "uncertain")
    # A prediction's verdict follows its interval (from the device's cross-validation) against the limit.
    interval = held["intervals"].get("latency_p99_ms")
    if interval is not None:
        lo, hi = interval
        expected = "fits" if hi <= limit else "does not fit" if lo > limit else "uncertain"
        assert held["verdict"] == expected, (interval, limit)
    else:
        assert held["verdict"] == "uncertain" and "no prediction interval" in held["why"]
    predicted = {
        r["params"].get("stat"): r["value"]
        for r in doc["records"]
        if r["metric"] == "predicted_latency_ms" and (r["device"], r["model"]) == ("cpu1", HELD_OUT)
    }
    assert predicted["p50"] > 0 and predicted["p99"] >= predicted["p50"]
    assert any(r["metric"] == "predicted_memory_mb" and r["model"] == HELD_OUT for r in doc["records"])

    # The cross-validation figure is in the records: every measured pair held out once.
    cv = {
        (r["params"]["holdout"], r["params"]["quantity"], r["metric"]): r["value"]
        for r in doc["records"]
        if r["device"] == "*" and r["metric"] in ("cv_within_10pct", "cv_median_abs_err")
    }
    pairs = {
        r["annotations"]["pairs"]
        for r in doc["records"]
        if r["device"] == "*"
        and r["metric"] == "cv_within_10pct"
        and r["params"]["quantity"] == "latency_p50_ms"
    }
    assert pairs == {2 * len(FLEET) + 1}
    assert all(
        0.0 <= cv[(h, q, "cv_within_10pct")] <= 1.0
        for h in ("pair", "model")
        for q in ("latency_min_ms", "latency_p50_ms", "latency_p99_ms", "memory_mb")
        if h == "model" or q != "memory_mb"
    )
    for quantity in ("latency_min_ms", "latency_p50_ms", "latency_p99_ms"):
        print(
            f"fit cross-validation, {quantity}, model held out: "
            f"{cv[('model', quantity, 'cv_within_10pct')]:.0%} of {2 * len(FLEET) + 1} pairs within +-10%, "
            f"median error {cv[('model', quantity, 'cv_median_abs_err')]:.1%}"
        )
    # The calibrated cost itself (the fastest inference) is what the counts predict; percentiles add how
    # much this shared 2-core machine disturbs each run (single runs swing by more than 10% here), so the
    # pass lines sit well above that noise: the goal (90% within +-10%) is met on a quiet device.
    assert cv[("model", "latency_min_ms", "cv_median_abs_err")] < 0.3
    assert cv[("model", "latency_p50_ms", "cv_median_abs_err")] < 0.6
    assert cv[("model", "memory_mb", "cv_median_abs_err")] < 0.1

    # Now measure the pair fit had to predict: the prediction holds up against the real thing. The
    # calibration was benched earlier, so other work arriving in between moves one side only: an out of
    # band min is benched again (the lowest of all kept: load only slows) until the verdict is conclusive
    # within the budget. Judged tightly (0.7..1.4) where nothing else took the machine during the fixture's
    # benches and these; never quiet, the lowest min must still lie within 1.6x of the prediction (the
    # kernels' noise on this machine is ~10%, a predictor 2x off is a defect); beyond 2x it fails at once.
    shares = [fleet.others_share]
    measured: dict[str, float] = {}

    def one_round() -> None:
        with OthersWatch() as watch:
            fleet.bench(HELD_OUT, "cpu1")
        shares.append(watch.others_share)
        measured.update(held_out_on_cpu1(fleet))

    def verdict(final: bool) -> Verdict:
        ratio = predicted["min"] / measured["min"]
        text = (f"held-out {HELD_OUT} on cpu1: min predicted/measured {ratio:.2f}; other work took "
                + ", ".join(f"{x:.0%}" for x in shares) + " of the machine (calibration, then each bench)")  # fmt: skip
        return band_verdict(
            text, ratio, "benches", max(shares) < OTHERS_QUIET, 0.7, 1.4, 2.0, final, loaded=1.6
        )

    found, _ = until_conclusive(one_round, verdict, budget_s=60.0, min_rounds=1)
    for stat in ("min", "p50"):
        print(
            f"held-out {HELD_OUT} on cpu1, {stat}: predicted {predicted[stat]:.3f} ms, measured "
            f"{measured[stat]:.3f} ms ({predicted[stat] / measured[stat] - 1:+.1%})"
        )
    print(found.reason)
    assert 0.4 < predicted["p50"] / measured["p50"] < 2.5  # p50 adds this machine's disturbance per run
    with Store(fleet.db) as st:
        assert "fit" in [r.kind for r in st.runs()]
    assert found.outcome == "pass", found.reason


def held_out_on_cpu1(fleet: Fleet) -> dict[str, float]:
    """The held-out model's lowest min and p50 over its benches on cpu1."""
    with Store(fleet.db) as st:
        found: dict[str, float] = {}
        for r in st.records(device="cpu1", model=HELD_OUT, metric="latency_ms"):
            stat = r.params.get("stat")
            if stat in ("min", "p50") and r.value is not None:
                found[stat] = min(found.get(stat, math.inf), r.value)
    return found


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, str] = {}
        self.plots: list[str] = []
        self.images: list[str] = []
        self.refs: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        if tag == "section":
            self.sections[a.get("id", "")] = a.get("data-state", "")
        if tag == "figure" and a.get("data-plot"):
            self.plots.append(a["data-plot"])
        if tag == "img":
            self.images.append(a.get("src", ""))
        for attr in ("src", "href", "srcset", "action", "data", "poster", "xlink:href"):
            if attr in a:
                self.refs.append((tag, attr, a[attr]))


def _parse(text: str) -> _Dom:
    dom = _Dom()
    dom.feed(text)
    return dom


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[object]:
    """Run headless Chromium with a fresh profile and no background networking; reap it afterwards."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (Debian package chromium)")
    started: list[subprocess.Popen[str]] = []

    def run(*args: str) -> str:
        profile = tmp_path / f"profile{len(started)}"
        argv = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-default-apps",
            "--hide-scrollbars",
            "--mute-audio",
            f"--user-data-dir={profile}",
            *args,
        ]
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        started.append(proc)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, argv
        return out

    try:
        yield run
    finally:
        for proc in started:
            try:  # the whole session: crashpad and zygote helpers included
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def test_report_renders_in_headless_chromium(fleet: Fleet, chromium, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = fleet.root / "reports" / "fleet.html"
    done = fleet.ok(
        "report",
        "--store",
        str(fleet.db),
        "--out",
        str(out),
        "--budget",
        "latency_p99_ms=2",
        "--budget",
        "memory_mb=150",
        "--title",
        "fleet report",
    )
    assert "wrote html report" in done.stderr
    text = out.read_text()

    # Self-contained: no address, nothing to fetch, no script (base64 may hold "//": data URIs aside).
    plain = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text).replace("<!DOCTYPE html>", "")
    assert not re.search(r"https?:", plain, re.IGNORECASE) and "//" not in plain
    dom = _parse(text)
    for tag, attr, ref in dom.refs:
        assert ref.startswith("data:image/png;base64,") or (tag == "a" and ref.startswith("#")), (
            tag,
            attr,
            ref,
        )
    assert not {"script", "link", "iframe", "object", "embed"} & dom.tags and "url(" not in text

    # Chromium's DOM after loading: every section, every plot of this store.
    loaded = _parse(chromium("--dump-dom", out.as_uri()))
    assert list(loaded.sections) == [sid for sid, _, _ in SECTIONS]
    for sid in ("fit", "health", "ceilings", "roofline", "threads", "latency", "prediction", "summary"):
        assert loaded.sections[sid] == "data", (sid, loaded.sections)
    for sid in ("thermal", "power", "ops", "accuracy", "variants", "sensitivity"):  # none here: said cleanly
        assert loaded.sections[sid] == "empty"
    expected = {
        "ceilings-cpu1",
        "roofline-cpu1",
        "roofline-cpu2",
        "threads-cpu1",
        "latency-cpu1",
        "latency-cpu2",
        "fit-cv",
    }
    assert expected <= set(loaded.plots), loaded.plots
    assert len(loaded.images) == len(loaded.plots) >= len(expected)

    # The screenshot: the size asked for, and a page with content (tables, colours, plots), not blank.
    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", out.as_uri())
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == WINDOW
        px = np.asarray(img.convert("RGB"), dtype=int)
    r, g, b = px[..., 0], px[..., 1], px[..., 2]
    non_white = float(np.mean(px.min(axis=2) < 235))
    colours = len(np.unique((px // 16).reshape(-1, 3), axis=0))
    assert non_white > 0.05 and colours > 20, (non_white, colours)
    # the matrix is coloured against the budgets: green (under) and red (over) cells are on screen
    greens = int(np.sum((g > r + 15) & (g > b + 10)))
    reds = int(np.sum((r > g + 15) & (r > b + 15)))
    assert greens > 500 and reds > 500, (greens, reds)

    md = fleet.root / "reports" / "fleet.md"
    fleet.ok("report", "--store", str(fleet.db), "--out", str(md), "--budget", "latency_p99_ms=2")
    summary = md.read_text()
    assert (
        "| verdict | device | model | runtime | p50 |" in summary
        and "conv_e" in summary
        and "<" not in summary
    )


# ---- the report a lab reads: every kind of answer, at two widths -----------------------------------------
NIGHTLY_DEMO = """name = "nightly"
devices = ["local"]
models = ["builtin:mlp", "builtin:convnet", "builtin:encoder"]
[[probe]]
kind = "bench"
params = { threads = 1, runs = 120, warmup = 2, warmup_seconds = 0.1, min_seconds = 0, shapes = { x = [1, 1024] } }
models = ["mlp"]
[[probe]]
kind = "bench"
params = { threads = 1, runs = 120, warmup = 2, warmup_seconds = 0.1, min_seconds = 0 }
models = ["convnet", "encoder"]
[[probe]]
kind = "matmul"
params = { backend = "onnxruntime", dtype = "fp32", threads = 1, sizes = [[256, 512]], skinny = false, trials = 3, max_seconds = 10 }
[[probe]]
kind = "bandwidth"
params = { kernel = "triad", threads = 1, array_mb = 64, max_seconds = 10 }
[[probe]]
kind = "roofline"
params = { bench = false, matmul = { backend = "onnxruntime", dtype = "fp32", threads = 1, sizes = [256, 512], skinny = false, trials = 3, max_seconds = 10 }, bandwidth = { kernel = "triad", threads = 1, array_mb = 64, max_seconds = 10 } }
"""
DEMO_VARIANTS = ("fp16", "int8-dynamic", "int8-static")
SHOT_WIDTHS = (1400, 800)
SHOT_HEIGHT = 2600


@pytest.fixture(scope="module")
def demo_lab(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """A lab's store as the docs show it: two nightly suite runs (one gate between them), variants of the
    convnet benched and checked for accuracy, an encoder profile, a sensitivity scan, ceilings."""
    root = tmp_path_factory.mktemp("demo")
    (root / "suites").mkdir()
    (root / "suites" / "nightly.toml").write_text(NIGHTLY_DEMO)
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache")}
    f = Fleet(root, root / "lab.db", root / "devices", {}, env)
    store = ["--store", str(f.db)]
    for _ in range(2):
        f.ok("run", "suites/nightly.toml", "--tag", "nightly", *store)
    res = f.cli("gate", "--baseline", "suite:nightly~1", "--candidate", "suite:nightly", *store)
    assert res.returncode in (0, 1), res.stderr
    f.ok("variants", "builtin:convnet", "--out", "variants", "--only", ",".join(DEMO_VARIANTS), *store)
    files = sorted(str(p) for p in (root / "variants").iterdir() if p.suffix in (".onnx", ".mnn"))
    fast = [
        "--threads",
        "1",
        "--runs",
        "120",
        "--min-seconds",
        "0",
        "--warmup",
        "2",
        "--warmup-seconds",
        "0.1",
    ]
    f.ok("bench", "builtin:convnet", *files, *fast, *store)
    f.ok("accuracy", *files, "--reference", "builtin:convnet", *store)
    f.ok("profile", "builtin:encoder", "--runs", "10", *store)
    f.ok("sensitivity", "builtin:convnet", "--bits", "8", *store)
    return f


def test_report_screenshots_at_two_widths(demo_lab: Fleet, chromium, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = demo_lab.root / "reports" / "lab.html"
    budgets = ["--budget", "latency_p99_ms=12", "--budget", "memory_mb=120"]
    demo_lab.ok("report", "--store", str(demo_lab.db), "--out", str(out), *budgets, "--title", "lab report")
    text = out.read_text()
    loaded = _parse(chromium("--dump-dom", out.as_uri()))
    sections = list(loaded.sections)
    assert sections[:3] == ["fit", "regressions", "health"]  # the answer first
    for sid in ("fit", "regressions", "health", "variants", "accuracy", "sensitivity", "ops", "ceilings"):
        assert loaded.sections[sid] == "data", (sid, loaded.sections)
    # The variants table: one row per variant with its size against fp32 and its accuracy.
    variants = text[text.index('id="variants"') : text.index('id="accuracy"')]
    for v in DEMO_VARIANTS:
        assert f"<b>{v}</b>" in variants, v
    assert re.search(r"0\.[0-9]{2}x", variants) and "cosine" in variants
    ops = text[text.index('id="ops"') : text.index('id="ceilings"')]
    assert 'data-shapes="' in ops and "input shapes not recorded" not in ops  # shapes of the profile
    regressions = text[text.index('id="regressions"') : text.index('id="health"')]
    assert "gate run" in regressions  # the stored gate between the two nightly runs is the one shown
    from PIL import Image

    shots = {}
    for width in SHOT_WIDTHS:
        shot = tmp_path / f"report-{width}.png"
        chromium(f"--screenshot={shot}", f"--window-size={width},{SHOT_HEIGHT}", out.as_uri())
        with Image.open(shot) as img:
            assert img.size == (width, SHOT_HEIGHT)
            px = np.asarray(img.convert("RGB"), dtype=int)
        assert float(np.mean(px.min(axis=2) < 235)) > 0.04  # a page with content, not blank
        shots[width] = shot
    keep = os.environ.get("EDGEBENCH_SCREENSHOTS")  # e.g. docs: where the committed screenshots go
    if keep:
        for width, shot in shots.items():
            shutil.copy(shot, Path(keep) / f"report-{width}.png")


# ---- the roofline's labels, as the browser lays them out at 1400 px ---------------------------------------
LABEL_CHECK = """<script>
window.addEventListener("load", () => {
  const out = [];
  for (const fig of document.querySelectorAll("figure[data-labels]")) {
    const img = fig.querySelector("img");
    const r = img.getBoundingClientRect();
    const boxes = JSON.parse(fig.dataset.labels).map((b) => [
      r.left + b[0] * r.width, r.top + window.scrollY + b[1] * r.height,
      r.left + b[2] * r.width, r.top + window.scrollY + b[3] * r.height]);
    const overlaps = [];
    for (let i = 0; i < boxes.length; i++)
      for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i], b = boxes[j];
        if (a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]) overlaps.push([i, j]);
      }
    out.push({plot: fig.dataset.plot, boxes, overlaps, shown: r.width, natural: img.naturalWidth,
              font_px: parseFloat(fig.dataset.labelPx) * r.width / img.naturalWidth,
              img: [r.left, r.top + window.scrollY, r.right, r.bottom + window.scrollY]});
  }
  const pre = document.createElement("pre");
  pre.id = "label-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def test_roofline_labels_never_overlap_and_read_at_1400_px(demo_lab: Fleet, chromium, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The browser's own layout of the report at 1400 px: every roofline label box (exported by the plot)
    apart from every other, inside its image, text at least 10 CSS px; the screenshot has ink in each box."""
    out = demo_lab.root / "reports" / "labels.html"
    demo_lab.ok("report", "--store", str(demo_lab.db), "--out", str(out))
    text = out.read_text()
    assert "<script" not in text  # the report has none; the check is added to a copy only
    probe = tmp_path / "labels-check.html"
    probe.write_text(text.replace("</body>", LABEL_CHECK + "</body>"))
    dom = chromium("--dump-dom", "--window-size=1400,3000", "--virtual-time-budget=5000", probe.as_uri())
    m = re.search(r'<pre id="label-check">(.*?)</pre>', dom, re.S)
    assert m, "the label check did not run"
    import html as _html

    figures = json.loads(_html.unescape(m.group(1)))
    assert figures and all(f["plot"].startswith("roofline-") for f in figures)
    from PIL import Image

    bottom = max(f["img"][3] for f in figures)
    shot = tmp_path / "labels.png"
    height = int(min(bottom + 50, 16000))
    chromium(f"--screenshot={shot}", f"--window-size=1400,{height}", out.as_uri())
    with Image.open(shot) as img:
        px = np.asarray(img.convert("RGB"), dtype=int)
    for f in figures:
        assert len(f["boxes"]) >= 3, f
        assert f["overlaps"] == [], f  # no two labels intersect as displayed
        assert f["font_px"] >= 10, f  # legible at this width
        x0, y0, x1, y1 = f["img"]
        for b in f["boxes"]:
            assert x0 - 0.5 <= b[0] < b[2] <= x1 + 0.5 and y0 - 0.5 <= b[1] < b[3] <= y1 + 0.5, (b, f["img"])
            region = px[int(b[1]) : int(math.ceil(b[3])), int(b[0]) : int(math.ceil(b[2]))]
            ink = float(np.mean(region.min(axis=2) < 180))
            assert ink > 0.03, (b, ink)  # the label's text is drawn where its box says
