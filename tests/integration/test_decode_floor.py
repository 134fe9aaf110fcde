"""The bandwidth floor per token holds on this machine, for a built-in fp32 decoder whose weights read per
token (1.25 GiB) are at least twice the last-level cache; its int8 and int4 variants decode faster.

"Twice the LLC" is judged against the largest cache figure in play: sysfs inside this VM reports an L3 of
300 MiB (480 MiB on other hosts of the same pool), while the measured bandwidth curve (`probe bandwidth
--array-mb N`, read kernel, 2 threads) falls from ~38 GB/s at 32 MiB arrays to its DRAM plateau (5-13 GB/s)
by 128 MiB: this VM's share of the L3 is far smaller than sysfs says. The weights are past both figures:
1279 MiB >= 2 x 480 MiB, and ten times the knee of the curve.

The models are big (1.4 GB fp32): they are generated once into a persistent cache (EDGEBENCH_TEST_CACHE, else
~/.cache), content-addressed by name like every built-in, and the local device's workdir lives there too so
the pushed copy is reused.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from edgebench.models.refs import resolve_model
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

BIG = "builtin:decoder:layers=8,hidden=2048,heads=16,ffn=5632,vocab=8000"
MIB = 2**20
LARGEST_LLC_SEEN = 480 * MIB  # the biggest L3 sysfs reports on this pool of VMs
DECODE = ["--prompt-tokens", "32", "--new-tokens", "16", "--rounds", "2", "--no-store", "--json"]
SMALL = "builtin:decoder:layers=2,hidden=64,heads=4,vocab=97,ffn=128"


def bytes_on_disk(path: Path) -> tuple[int, int]:
    """(every initializer's bytes, the bytes one token reads) read from the model file itself with onnx and
    numpy alone: a table only Gather reads (an embedding) gives one row a token, all else is read whole."""
    model = onnx.load(str(path))
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    gathered = {n for n, a in arrays.items() if readers.get(n) == {"Gather"} and a.ndim == 2}
    whole = sum(a.nbytes for n, a in arrays.items() if n not in gathered)
    rows = sum(arrays[n].nbytes // arrays[n].shape[0] for n in gathered)
    return sum(a.nbytes for a in arrays.values()), whole + rows


def model_file(spec: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file a built-in decoder is generated into (content-addressed in the cache `env` names)."""
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    return Path(resolve_model(spec).path)


@pytest.fixture
def big_cache() -> dict[str, str]:
    """The environment that puts the big models and the local workdir in the persistent cache."""
    folder = Path(os.environ.get("EDGEBENCH_TEST_CACHE") or Path.home() / ".cache")
    folder.mkdir(parents=True, exist_ok=True)
    return {"XDG_CACHE_HOME": str(folder)}


def run(args: list[object], cwd: Path, env: dict[str, str]) -> dict:
    res: subprocess.CompletedProcess[str] = edgebench(*args, cwd=cwd, env=env, timeout=1800)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def get(doc: dict, metric: str, stat: str | None = None) -> dict:
    return next(
        r
        for r in doc["records"]
        if r["probe"] == "decode" and r["metric"] == metric and r["params"].get("stat") == stat
    )


def test_the_floor_holds_for_a_dram_sized_decoder_and_quantized_variants_are_faster(
    tmp_path: Path, big_cache: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32 = run(["probe", "decode", "--model", BIG, *DECODE], tmp_path, big_cache)
    floor = get(fp32, "decode_floor_ms")
    a = floor["annotations"]
    p50 = get(fp32, "decode_ms_per_token", "p50")["value"]
    efficiency = get(fp32, "decode_efficiency")["value"]
    print(
        f"\nfp32 {get(fp32, 'decode_ms_per_token', 'p50')['model']}: decode p50 {p50:.1f} ms/token, floor "
        f"{floor['value']:.1f} ms ({a['weight_bytes_per_token'] / MIB:.0f} MiB weights + "
        f"{a['kv_bytes_per_token'] / MIB:.1f} MiB KV at {a['bandwidth_gbps']:.2f} GB/s {a['bandwidth_kernel']} "
        f"x{a['bandwidth_threads']}, arrays "
        f"{a['bandwidth_array_bytes'] / MIB:.0f} MiB, LLC per sysfs {a['llc_bytes'] / MIB:.0f} MiB); "
        f"decode_efficiency {efficiency:.3f}"
    )
    assert a["regime"] == "dram" and a["uncertain"] is False and a["bandwidth_source"] == "measured"
    # The floor's bytes counted from the file on disk with onnx and numpy, not by the product
    stored, per_token = bytes_on_disk(model_file(BIG, big_cache, monkeypatch))
    assert (a["stored_weight_bytes"], a["weight_bytes_per_token"]) == (stored, per_token)
    assert a["weight_bytes_per_token"] >= 2 * max(a["llc_bytes"], LARGEST_LLC_SEEN)
    assert p50 >= 0.9 * floor["value"], (
        f"decode p50 {p50:.1f} ms is under 0.9 x the floor {floor['value']:.1f} ms"
    )
    assert efficiency == pytest.approx(floor["value"] / p50)

    # The quantized variants decode 2-3.4x faster than fp32: far past any drift of the machine's load, so
    # once each against the fp32 run above.
    per_token: dict[str, list[float]] = {"fp32": [p50], "int8": [], "int4": []}
    for dtype in ("int8", "int4"):
        doc = run(
            ["probe", "decode", "--model", f"{BIG},dtype={dtype}", *DECODE, "--no-floor"], tmp_path, big_cache
        )
        per_token[dtype].append(get(doc, "decode_ms_per_token", "p50")["value"])
    best = {dtype: min(values) for dtype, values in per_token.items()}
    ratios = {dtype: best["fp32"] / best[dtype] for dtype in ("int8", "int4")}
    print(
        f"decode ms per token (best p50 of {per_token}): fp32 {best['fp32']:.1f}, "
        + ", ".join(f"{d} {best[d]:.1f} ({r:.2f}x faster than fp32)" for d, r in ratios.items())
    )
    assert all(r > 1.0 for r in ratios.values()), ratios


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the dtypes: the first decode measures the DRAM bandwidth into it, the others read it."""
    return tmp_path_factory.mktemp("decode-store") / "edgebench.db"


@pytest.mark.parametrize("dtype", ["fp32", "int8", "int4"])
def test_the_floor_reads_the_bytes_the_file_on_disk_holds(
    tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch, shared_store: Path
) -> None:
    """The bytes behind the floor are counted from the model file with onnx and numpy (bytes_on_disk), not
    with the product's own count, for every dtype the decoders come in; and the floor is those bytes plus
    the KV cache over the bandwidth it measured."""
    import os

    env = {"XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    spec = SMALL if dtype == "fp32" else f"{SMALL},dtype={dtype}"
    doc = run(["probe", "decode", "--model", spec, "--prompt-tokens", "8", "--new-tokens", "4", "--rounds", "1",
               "--store", str(shared_store), "--json"], tmp_path, env)  # fmt: skip
    a = get(doc, "decode_floor_ms")["annotations"]
    stored, per_token = bytes_on_disk(model_file(spec, env, monkeypatch))
    assert (a["stored_weight_bytes"], a["weight_bytes_per_token"]) == (stored, per_token)
    floor_ms = (per_token + a["kv_bytes_per_token"]) / (a["bandwidth_gbps"] * 1e9) * 1e3
    assert get(doc, "decode_floor_ms")["value"] == pytest.approx(floor_ms, rel=1e-6)
