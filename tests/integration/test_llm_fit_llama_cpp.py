"""`edgebench fit` on GGUF LLMs with the real llama.cpp (../shared/lab-tools/llama.cpp-20261001-linux-x86_64,
BUILD.md there): three small Q8_0 GGUFs decoded on the host (`probe decode`, a `host` lab device, 1 thread),
then fit on a fourth Q8_0 GGUF never decoded.

Memory is checked against llama.cpp's own figures read here by running llama-bench -v ourselves (another
invocation than fit's: it does decode at that depth) and the tensor bytes counted with `gguf`'s reader. The
decode prediction is then checked against measuring that model: these models are a few MB, resident in a
480 MB last-level cache, and the bandwidth is measured on 64 MB arrays, so the band asked is 0.5-2x (the
issue's 15% is for DRAM-sized models, whose efficiency does not move with the cache); the error is printed.
A model over the device's memory (a later fingerprint of the device saying 16 MB) is refused with the numbers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import gguf
import pytest

from edgebench.models.refs import resolve_model
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench
from edgebench.testing.labtools import tool_or_skip

pytestmark = pytest.mark.integration

TOOL_DIR = "llama.cpp-20261001-linux-x86_64"
EVIDENCE = [
    "builtin:llama:layers=2,hidden=512,heads=8,kv_heads=2,vocab=2048,dtype=q8_0",
    "builtin:llama:layers=4,hidden=512,heads=8,kv_heads=2,vocab=2048,dtype=q8_0",
    "builtin:llama:layers=2,hidden=768,heads=12,kv_heads=4,vocab=2048,dtype=q8_0",
]
TARGET = "builtin:llama:layers=3,hidden=640,heads=10,kv_heads=2,vocab=2048,dtype=q8_0"
OTHER_QUANT = "builtin:llama:layers=3,hidden=640,heads=10,kv_heads=2,vocab=2048,dtype=q4_0"
# decodes at depth 256, 32 tokens (the median step has 256 + 15.5 positions cached), 5 repetitions: whole
# repetitions of tens of ms, so a burst of the shared host's other work moves the median less
DEPTH, NEW = 256, 32
QUICK = ["--prompt-tokens", "16", "--new-tokens", str(NEW), "--rounds", "5", "--threads", "1"]
QUICK += ["--depths", str(DEPTH), "--bandwidth-mb", "64", "--timeout", "300"]
CONTEXT = "1024"
MIB = 2**20


class Lab:
    def __init__(self, folder: Path, store: Path, env: dict[str, str]) -> None:
        self.folder, self.store, self.env = folder, store, env

    def copy(self, into: Path) -> Lab:
        """The measured store, copied (with its kept models) for a test that adds to it."""
        store = into / "s.db"
        shutil.copy(self.store, store)
        shutil.copytree(self.store.with_name("s.db.models"), into / "s.db.models")
        return Lab(self.folder, store, self.env)

    def run(self, *args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
        return edgebench(*args, "--lab", self.folder, "--store", self.store, cwd=cwd, env=self.env)

    def fit(self, model: str, *extra: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return self.run("fit", "--model", model, "--device", "host", "--context", CONTEXT, *extra, cwd=cwd)


@pytest.fixture(scope="module")
def tool() -> Path:
    found = tool_or_skip(
        Path(__file__).resolve().parents[2], TOOL_DIR, "llama-bench", "llama.cpp llama-bench"
    )
    return found / "llama-bench"


@pytest.fixture(scope="module")
def measured(tool: Path, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    """The three evidence models decoded on `host`, whose runner is the real llama-bench (not pushed)."""
    folder = tmp_path_factory.mktemp("llmfit")
    (folder / "lab").mkdir()
    (folder / "lab" / "host.toml").write_text(
        f'name = "host"\ntransport = "local"\nworkdir = "{folder / "work"}"\n'
        f'[runners]\nllama_bench = "{tool}"\n'
    )
    cache = tmp_path_factory.getbasetemp() / "xdg-cache"  # the conftest's: models written once per session
    lab = Lab(folder / "lab", folder / "s.db", {"XDG_CACHE_HOME": str(cache)})
    for model in EVIDENCE:
        res = lab.run("probe", "decode", "--model", model, "--device", "host", *QUICK, cwd=folder)
        assert res.returncode == 0, res.stderr[-2000:]
    return lab


def reported(tool: Path, model: Path, *extra: str) -> dict[str, float]:
    """llama.cpp's own figures at the context, read here: llama-bench -v decoding 1 token after 1023."""
    depth = str(int(CONTEXT) - 1)
    argv = [str(tool), "-m", str(model), "-p", "0", "-n", "1", "-d", depth, "-r", "1", "-t", "1", "-v"]
    argv += extra
    res = subprocess.run([*argv, "-o", "json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out: dict[str, float] = {}
    for key, pattern in (
        ("compute", r"CPU compute buffer size =\s+([\d.]+) MiB"),
        ("output", r"CPU\s+output buffer size =\s+([\d.]+) MiB"),
        ("kv", r"CPU KV buffer size =\s+([\d.]+) MiB"),
        ("n_ctx", r"llama_context: n_ctx\s+=\s+(\d+)"),
    ):
        found = re.search(pattern, res.stderr)
        assert found, f"llama-bench -v printed no {pattern}"
        out[key] = float(found.group(1))
    return out


def test_memory_at_a_context_is_weights_plus_kv_plus_the_buffers_llama_cpp_reports(
    measured: Lab, tool: Path, tmp_path: Path
) -> None:
    res = measured.fit(TARGET, "--json", "--no-store", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    [got] = json.loads(res.stdout)["llm"]
    path = resolve_model(TARGET).path
    tensors = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors) / MIB
    theirs = reported(tool, path)
    want = tensors + theirs["kv"] + theirs["compute"] + theirs["output"]
    print(
        f"memory_mb {got['memory_mb']:.2f} (weights {tensors:.2f} + KV {theirs['kv']:.2f} + compute "
        f"{theirs['compute']:.2f} + output {theirs['output']:.2f} = {want:.2f} MB as llama.cpp reports them)"
    )
    assert got["n_ctx"] == theirs["n_ctx"] == int(CONTEXT)
    assert got["memory_mb"] == pytest.approx(want, rel=0.10)
    assert got["parts"]["weights_mb"] == pytest.approx(tensors, rel=1e-9)
    assert got["parts"]["kv_cache_mb"] == pytest.approx(theirs["kv"], abs=0.01)
    assert got["llama_cpp"]["compute_mb"]["CPU"] == pytest.approx(theirs["compute"], abs=0.01)
    assert got["device_memory_mb"] > 1000 and got["fits"] is True and got["verdict"] == "fits"
    again = json.loads(measured.fit(TARGET, "--json", "--no-store", cwd=tmp_path).stdout)["llm"][0]
    assert again["llama_cpp"]["cached"] is True and again["memory_mb"] == got["memory_mb"]


def test_decode_is_predicted_from_the_other_q8_models_then_measured(measured: Lab, tmp_path: Path) -> None:
    lab = measured.copy(tmp_path)
    past = str(DEPTH + NEW // 2)  # 272: the measured median step's 271.5 positions, rounded up
    res = lab.fit(TARGET, "--depth", past, "--threads", "1", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    [got] = doc["llm"]
    decode = got["decode_tokens_per_s"]
    names = sorted(resolve_model(m).name for m in EVIDENCE)
    assert decode["evidence"]["count"] == 3 and sorted(decode["evidence"]["models"]) == names
    assert decode["bandwidth"]["threads"] == 1 and decode["bandwidth"]["kernel"] == "read"
    effs = sorted(p["efficiency"] for p in decode["evidence"]["points"])
    rate = effs[1] * decode["bandwidth"]["gbps"] * 1e9 / decode["bytes_per_token"]
    assert decode["p50"] == pytest.approx(rate, rel=1e-9) and decode["interval"] == "min-max of 3 models"
    assert decode["low"] <= decode["p50"] <= decode["high"]
    fits = [r for r in doc["records"] if r["metric"] == "fits"]
    assert fits and fits[0]["annotations"]["verdict"] == "fits"  # stored as a fit run's records
    res = lab.run("probe", "decode", "--model", TARGET, "--device", "host", *QUICK, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    p50 = next(
        r["value"]
        for r in json.loads(res.stdout)["records"]
        if r["metric"] == "decode_ms_per_token" and r["params"].get("stat") == "p50"
    )
    measured_rate = 1000.0 / p50
    ratio = decode["p50"] / measured_rate
    print(
        f"decode predicted {decode['p50']:.0f} tokens/s [{decode['low']:.0f}-{decode['high']:.0f}] from "
        f"efficiencies {[round(e, 3) for e in effs]}, measured {measured_rate:.0f}: error {ratio - 1:+.1%}"
    )
    assert 0.5 <= ratio <= 2.0  # cache-resident models (see the module's docstring)


def test_a_model_over_the_devices_memory_is_refused_with_the_numbers(measured: Lab, tmp_path: Path) -> None:
    lab = measured.copy(tmp_path)
    with Store(lab.store) as st:  # the device as a later fingerprint says it is: 16 MB of memory
        [latest] = [d for d in st.device_info() if d["device"] == "host"][-1:]
        st.begin_run("20991231T000000Z-tiny00", "import", {})
        st.save_device("20991231T000000Z-tiny00", "host", {**latest["fingerprint"], "memory_mb": 16.0}, {})
        st.finish_run("20991231T000000Z-tiny00", "ok")
    res = lab.fit(TARGET, "--json", cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-2000:]
    [got] = json.loads(res.stdout)["llm"]
    assert got["fits"] is False and got["verdict"] == "does not fit" and got["device_memory_mb"] == 16.0
    assert got["memory_mb"] > 16.0 and "> the device's memory 16.0 MB" in got["why"], got["why"]
    assert f"needs {got['memory_mb']:.1f} MB (weights {got['parts']['weights_mb']:.1f}" in got["why"]
    shown = lab.fit(TARGET, cwd=tmp_path)
    assert shown.returncode == 1 and "does not fit" in shown.stdout
    # another quantization: nothing to take an efficiency from, and it says so rather than guess
    res = lab.fit(OTHER_QUANT, "--json", "--no-store", cwd=tmp_path)
    [other] = json.loads(res.stdout)["llm"]
    assert other["decode_tokens_per_s"]["p50"] is None
    assert "no other Q4_0 GGUF decoded on host" in other["decode_tokens_per_s"]["unknown"]
    assert resolve_model(EVIDENCE[0]).name + " (Q8_0)" in other["decode_tokens_per_s"]["unknown"]


def test_no_llama_bench_on_the_host_is_one_line_saying_how_to_give_it(measured: Lab, tmp_path: Path) -> None:
    bare = Lab(tmp_path / "no-lab", measured.store, {**measured.env, "PATH": str(tmp_path / "empty")})
    res = bare.fit(TARGET, "--no-store", cwd=tmp_path)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "[runners] llama_bench" in lines[0] and "on PATH" in lines[0], res.stderr


def test_a_quantized_kv_cache_is_sized_as_llama_cpp_allocates_it(
    measured: Lab, tool: Path, tmp_path: Path
) -> None:
    """--kv-type q8_0: the cache, the buffers and the decode's bytes per token at that type, against what
    llama.cpp itself allocates with -ctk q8_0 -ctv q8_0 (read here from its own log)."""
    f16 = json.loads(measured.fit(TARGET, "--json", "--no-store", cwd=tmp_path).stdout)["llm"][0]
    res = measured.fit(TARGET, "--kv-type", "q8_0", "--json", "--no-store", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    [got] = json.loads(res.stdout)["llm"]
    path = resolve_model(TARGET).path
    theirs = reported(tool, path, "-ctk", "q8_0", "-ctv", "q8_0")
    tensors = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors) / MIB
    assert got["kv_type"] == "q8_0" and "-ctk" in got["llama_cpp"]["argv"]
    assert got["parts"]["kv_cache_mb"] == pytest.approx(theirs["kv"], abs=0.01)
    assert got["parts"]["kv_cache_mb"] == pytest.approx(f16["parts"]["kv_cache_mb"] * 34 / 64, rel=1e-6)
    assert got["memory_mb"] == pytest.approx(
        tensors + theirs["kv"] + theirs["compute"] + theirs["output"], rel=0.1
    )
    assert "q8_0 KV" in got["why"], got["why"]
    kv_saved = (
        (f16["parts"]["kv_cache_mb"] - got["parts"]["kv_cache_mb"]) * MIB / f16["n_ctx"]
    )  # per position
    depth = f16["decode_tokens_per_s"]["depth"]
    fewer = f16["decode_tokens_per_s"]["bytes_per_token"] - got["decode_tokens_per_s"]["bytes_per_token"]
    assert fewer == pytest.approx(kv_saved * depth, abs=2)  # a step reads the q8_0 cache so far
    res = measured.fit(TARGET, "--kv-type", "q3_k", "--no-store", cwd=tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "--kv-type q3_k" in lines[0], res.stderr


def test_probe_decode_with_a_q8_kv_cache_runs_llama_bench_so_and_sizes_its_cache(
    measured: Lab, tmp_path: Path
) -> None:
    res = measured.run(
        "probe", "decode", "--model", TARGET, "--device", "host", *QUICK, "--kv-type", "q8_0", "--no-store",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    records = json.loads(res.stdout)["records"]
    p50 = next(
        r for r in records if r["metric"] == "decode_ms_per_token" and r["params"].get("stat") == "p50"
    )
    assert p50["params"]["kv_type"] == "q8_0"  # part of the measurement's identity
    tool_said = p50["annotations"]["llama_bench"]
    assert tool_said["type_k"] == tool_said["type_v"] == "q8_0"  # what llama-bench itself ran with
    info = gguf.GGUFReader(resolve_model(TARGET).path)
    layers = int(info.fields["llama.block_count"].parts[-1][0])
    kv_heads = int(info.fields["llama.attention.head_count_kv"].parts[-1][0])
    hidden = int(info.fields["llama.embedding_length"].parts[-1][0])
    heads = int(info.fields["llama.attention.head_count"].parts[-1][0])
    positions = DEPTH + NEW
    want = 2 * layers * kv_heads * (hidden // heads) * positions * 34 / 32 / MIB
    [kv] = [r for r in records if r["metric"] == "kv_cache_mb"]
    assert kv["value"] == pytest.approx(want, rel=1e-6) and kv["annotations"]["kv_type"] == "q8_0"
    floor = next(r for r in records if r["metric"] == "decode_floor_ms")
    assert floor["annotations"]["kv_bytes_per_position"] == int(want * MIB / positions)


def test_a_kv_type_for_the_agents_own_decoder_is_refused_in_one_line(measured: Lab, tmp_path: Path) -> None:
    res = measured.run(
        "probe", "decode", "--model", "builtin:decoder", "--device", "host", "--kv-type", "q8_0", "--no-store",
        cwd=tmp_path,
    )  # fmt: skip
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert res.returncode != 0 and len(errors) == 1 and "--kv-type are llama.cpp's" in errors[0], res.stderr
