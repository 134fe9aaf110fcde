"""`probe decode`: prefill and decode tokens/s of an LLM decoder on a device, its KV cache and its
bandwidth floor per token."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from ..probes.registry import DecodeParams
from ..records import Record
from .common import JSON_OPT, LAB_OPT, STORE_OPT, note, open_lab, print_json, records_json, render_table
from .params import probe_flags
from .probe_compute import DEVICE_OPT, NO_STORE_OPT, TIMEOUT_OPT, run_one

MODEL_OPT = typer.Option(
    ...,
    "--model",
    "-m",
    help="Decoder ONNX model (or .mnn), builtin:decoder:layers=L,hidden=H,..., a GGUF (llama.cpp), or "
    "builtin:llama:layers=L,hidden=H,ffn=F,heads=N,kv_heads=K,vocab=V,dtype=D",
)
RUNTIME_OPT = typer.Option(
    None, "--runtime", help="onnxruntime, mnn or llama.cpp (default: from the model file; .gguf: llama.cpp)."
)
TABLE = (
    ("ttft_ms", "p50"),
    ("prefill_tokens_per_s", None),
    ("decode_ms_per_token", "p50"),
    ("decode_ms_per_token", "p90"),
    ("decode_ms_per_token", "p99"),
    ("decode_tokens_per_s", None),
    ("kv_cache_mb", None),
    ("peak_rss_mb", None),
    ("load_ms", None),
    ("decode_floor_ms", None),
    ("decode_efficiency", None),
)


def register(probe_app: typer.Typer) -> None:
    probe_app.command("decode")(decode)


@probe_flags("decode")
def decode(
    model: str = MODEL_OPT,
    device: str = DEVICE_OPT,
    runtime: str = RUNTIME_OPT,
    timeout: float = TIMEOUT_OPT,
    store: Path = STORE_OPT,
    no_store: bool = NO_STORE_OPT,
    lab: Path = LAB_OPT,
    as_json: bool = JSON_OPT,
    params: DecodeParams = DecodeParams(),
) -> int:
    """Prefill P tokens, then T greedy decode steps with the KV cache fed back, on the device: time to first
    token, tokens/s, KV cache, peak memory, and the floor (weights + KV read per token) / DRAM bandwidth."""
    from ..models.refs import resolve_model
    from ..probes.common import runtime_of
    from ..probes.decode import stored_dram_bandwidth
    from ..probes.decode_llama import KERNEL
    from ..runtimes import runtime as runtime_named

    if params.floor and not no_store:
        # llama.cpp's floor reads at the decode's threads; the agent's decode takes the best of any
        own_tool = runtime_named(runtime_of(resolve_model(model), runtime)).decode_tool is not None
        kernel, threads = (KERNEL, params.threads or None) if own_tool else (None, None)
        found = stored_dram_bandwidth(store, open_lab(lab).get(device).name, kernel, threads)
        if found is not None:
            note(f"edgebench: DRAM bandwidth {found.gbps:.3g} GB/s from run {found.run_id} (the store)")
            params = dataclasses.replace(params, bandwidth=found.to_params())
    if params.floor and params.bandwidth is None:
        note(f"edgebench: no stored DRAM bandwidth for {device}: measuring it first (probe bandwidth)")
    run_id, records = run_one(device, "decode", params, timeout, store, no_store, lab, model, runtime)
    decoded = [r for r in records if r.probe == "decode"]
    if as_json:
        print_json(records_json(records, run_id=run_id, summary=summary(decoded)))
        return 0
    rows = [
        [
            r.metric + (f" {r.params['stat']}" if "stat" in r.params else ""),
            r.value,
            r.unit,
            r.annotations.get("n"),
        ]
        for metric, stat in TABLE
        for r in decoded
        if r.metric == metric and r.params.get("stat") == stat
    ]
    name = decoded[0].model if decoded else model
    render_table(f"decode {name} on {device} (run {run_id})", ["metric", "value", "unit", "n"], rows)
    for line in floor_lines(decoded):
        note(line)
    return 0


def summary(records: list[Record]) -> dict[str, float | None]:
    """The headline figures by name, for --json readers."""
    out: dict[str, float | None] = {}
    for metric, stat in TABLE:
        for r in records:
            if r.metric == metric and r.params.get("stat") == stat:
                out[metric if stat is None else f"{metric}_{stat}"] = r.value
    return out


def floor_lines(records: list[Record]) -> list[str]:
    """How the floor was found, and whether it binds."""
    eff = next((r for r in records if r.metric == "decode_efficiency"), None)
    if eff is None:
        return []
    a = eff.annotations
    flag = " (uncertain)" if a.get("uncertain") else ""
    weights, kv = a["weight_bytes_per_token"] / 2**20, a["kv_bytes_per_token"] / 2**20
    return [
        f"floor: {weights:.1f} MiB weights + {kv:.2f} MiB KV per token at {a['bandwidth_gbps']:.3g} GB/s "
        f"({a['bandwidth_source']} run {a['bandwidth_run']}) = {a['floor_ms']:.4g} ms; regime {a['regime']}",
        f"decode_efficiency: {eff.value:.3f} (floor / p50 {a['measured_p50_ms']:.4g} ms){flag}",
    ]
