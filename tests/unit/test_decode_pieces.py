"""The decode probe in pieces: the decoder convention (accepted names, one-line errors naming the tensor),
the agent's loop against a bare onnxruntime greedy loop, and the records and floor from a reply."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from edgebench.agent.decode import find_io, prompt_ids
from edgebench.agent.main import TaskError, run_task
from edgebench.agent.session import InputInfo
from edgebench.errors import ModelError
from edgebench.jobs import Job, JobOutcome
from edgebench.lab.device import AgentReply
from edgebench.models.decoders import decoder_model, kv_bytes_per_position, parse_decoder, per_token_bytes
from edgebench.probes.decode import (
    DramBandwidth,
    ReadBytes,
    decode_records,
    dram_bandwidth,
    inspect_decoder,
    stored_dram_bandwidth,
)
from edgebench.records import RecordContext
from edgebench.results.store import Store
from edgebench.testing.decode_ref import greedy_tokens

TINY = "decoder:layers=2,hidden=64,heads=4,vocab=97,ffn=128"
KV = [1, 4, None, 16]


def infos(*names: str) -> list[InputInfo]:
    out = [InputInfo("input_ids", [1, None], "int64"), InputInfo("attention_mask", [1, None], "int64")]
    return out + [InputInfo(n, KV, "float32") for n in names]


def presents(layers: int) -> list[str]:
    return ["logits"] + [f"present.{i}.{p}" for i in range(layers) for p in ("key", "value")]


def renamed(path: Path, old: str, new: str, out: Path) -> Path:
    """The model with one graph input (or output) renamed everywhere it is used."""
    model = onnx.load(str(path))
    for value in [*model.graph.input, *model.graph.output]:
        if value.name == old:
            value.name = new
    for node in model.graph.node:
        node.input[:] = [new if n == old else n for n in node.input]
        node.output[:] = [new if n == old else n for n in node.output]
    onnx.save(model, out)
    return out


# ---- the convention -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["past_key_values.{}.{}", "past.{}.{}"])
def test_both_cache_namings_are_accepted(family: str) -> None:
    names = [family.format(i, p) for i in range(2) for p in ("key", "value")]
    io = find_io(infos(*names), presents(2))
    assert io.layers == 2 and [s.past for s in io.cache] == names
    assert [s.present for s in io.cache][:2] == ["present.0.key", "present.0.value"]
    assert (io.cache[0].heads, io.cache[0].head_dim) == (4, 16) and io.positions is None


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (
            ["past_key_values.0.keys", "past_key_values.0.value"],
            presents(1),
            "input 'past_key_values.0.keys' is not a KV cache input (accepted: input_ids, attention_mask, "
            "position_ids, use_cache_branch, past_key_values.N.key|value or past.N.key|value)",
        ),
        (
            ["past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key"],
            presents(2),
            "missing input 'past_key_values.1.value' (the model has 2 layers of KV cache)",
        ),
        (
            ["past_key_values.0.key", "past_key_values.0.value"],
            ["logits", "present.0.key"],
            "missing output 'present.0.value' for input 'past_key_values.0.value'",
        ),
        (
            ["past.0.key", "past_key_values.0.value"],
            presents(1),
            "KV cache inputs mix two namings (past.{}.{} and past_key_values.{}.{})",
        ),
        (["token_type_ids"], presents(1), "input 'token_type_ids' is not a decoder input"),
        ([], presents(1), "no KV cache inputs (expected past_key_values.N.key|value"),
    ],
)
def test_a_broken_convention_is_one_line_naming_the_tensor(
    inputs: list[str], outputs: list[str], message: str
) -> None:
    with pytest.raises(TaskError) as info:
        find_io(infos(*inputs), outputs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_missing_input_ids_and_dynamic_heads_are_named() -> None:
    with pytest.raises(TaskError, match="missing input 'input_ids'"):
        find_io([InputInfo("attention_mask", [1, None], "int64")], presents(1))
    dynamic = infos() + [
        InputInfo(f"past.0.{p}", [1, "heads", None, 16], "float32") for p in ("key", "value")
    ]
    with pytest.raises(TaskError, match=r"input 'past.0.key' is \[1, 'heads', None, 16\]: a KV cache is"):
        find_io(dynamic, presents(1))


def test_the_host_refuses_a_misnamed_model_before_pushing(tmp_path: Path) -> None:
    _, path = decoder_model(TINY, tmp_path)
    bad = renamed(path, "past_key_values.1.key", "past_key_values.1.k", tmp_path / "bad.onnx")
    with pytest.raises(ModelError) as info:
        inspect_decoder(bad)
    assert str(info.value).startswith("bad.onnx: input 'past_key_values.1.k' is not a KV cache input")
    good = inspect_decoder(path)
    assert good.per_token == per_token_bytes(parse_decoder(TINY))


# ---- the agent's loop against a bare one -------------------------------------------------------------
def test_the_agent_decodes_the_tokens_a_bare_loop_decodes(tmp_path: Path) -> None:
    _, path = decoder_model(TINY, tmp_path)
    task = {
        "kind": "decode", "model": str(path), "prompt_tokens": 12, "new_tokens": 9, "rounds": 2, "seed": 5,
        "warmup": 1, "warmup_seconds": 0.0,
    }  # fmt: skip
    doc = run_task(task)
    r = doc["result"]
    c = parse_decoder(TINY)
    assert r["tokens"] == greedy_tokens(path, prompt_ids(5, 12, c.vocab), 9)
    assert len(r["ttft_ms"]) == 2 and [len(s) for s in r["step_ms"]] == [9, 9]
    assert r["kv_cache_bytes"] == kv_bytes_per_position(c) * (12 + 9) == r["kv_bytes_per_position"] * 21
    assert r["check"] == {
        "tokens": 10,
        "tokens_agree": 10,
        "last_logits_rel_diff": pytest.approx(0, abs=1e-5),
    }
    assert r["rounds_agree"] and r["vocab"] == c.vocab and r["position_ids"] and doc["warnings"] == []


def test_the_past_naming_and_a_merged_decoders_branch_input_decode_the_same(tmp_path: Path) -> None:
    _, path = decoder_model(TINY, tmp_path)
    model = onnx.load(str(path))
    for value in model.graph.input:
        value.name = value.name.replace("past_key_values.", "past.")
    for node in model.graph.node:
        node.input[:] = [n.replace("past_key_values.", "past.") for n in node.input]
    # Optimum's merged decoders take a use_cache_branch flag; this one ignores it, the agent must feed it.
    model.graph.input.append(
        onnx.helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    )
    other = tmp_path / "past.onnx"
    onnx.save(model, other)
    task = {
        "kind": "decode",
        "prompt_tokens": 6,
        "new_tokens": 5,
        "rounds": 1,
        "warmup": 0,
        "warmup_seconds": 0,
    }
    want = run_task({**task, "model": str(path)})["result"]
    got = run_task({**task, "model": str(other)})["result"]
    assert got["tokens"] == want["tokens"] and got["cache_inputs"] == ["past.0.key", "past.0.value"]


def test_too_long_a_run_for_the_models_positions_is_refused(tmp_path: Path) -> None:
    _, path = decoder_model(TINY + ",ctx=16", tmp_path)
    with pytest.raises(TaskError, match="prompt_tokens \\+ new_tokens = 20 is over the model's 16 positions"):
        run_task({"kind": "decode", "model": str(path), "prompt_tokens": 12, "new_tokens": 8})


# ---- records and the floor ---------------------------------------------------------------------------
MIB = 2**20


def reply(steps: list[list[float]], prompt: int = 8, kv_pp: int = 4096) -> AgentReply:
    new = len(steps[0])
    return AgentReply(
        {
            "runtime_version": "x", "prompt_tokens": prompt, "new_tokens": new, "ttft_ms": [4.0, 5.0, 6.0],
            "step_ms": steps, "kv_cache_bytes": kv_pp * (prompt + new), "kv_bytes_per_position": kv_pp,
            "peak_rss_mb": 70.0, "load_ms": 12.0, "first_prefill_ms": 9.0, "tokens": list(range(new + 1)),
            "check": {"tokens": new + 1, "tokens_agree": new + 1, "last_logits_rel_diff": 0.0},
        }
    )  # fmt: skip


def context() -> RecordContext:
    return RecordContext("run", "dev", "decode", "m", "onnxruntime", {"prompt_tokens": 8, "new_tokens": 4})


def by_key(records: list) -> dict:
    return {(r.metric, r.params.get("stat")): r for r in records}


def test_records_come_from_the_kept_steps() -> None:
    out = decode_records(context(), reply([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]]), None, None)
    got = by_key(out.records)
    assert got[("ttft_ms", "p50")].value == 5.0 and got[("ttft_ms", "min")].value == 4.0
    assert got[("prefill_tokens_per_s", None)].value == pytest.approx(8 / 0.005)
    assert got[("decode_ms_per_token", "p50")].value == 2.0
    assert got[("decode_ms_per_token", "mean")].value == pytest.approx(2.25)
    assert got[("decode_tokens_per_s", None)].value == pytest.approx(8 / 0.018)
    assert got[("kv_cache_mb", None)].value == pytest.approx(4096 * 12 / MIB)
    assert ("decode_ms_per_token", "p90") not in got  # 8 steps: p90 refused, and said
    assert any("p90 needs at least 36 samples" in w for w in out.warnings)
    assert all(r.params["prompt_tokens"] == 8 and r.params["new_tokens"] == 4 for r in out.records)
    [steps] = [s for s in out.samples if s.metric == "decode_ms_per_token"]
    assert (
        steps.values == (1.0, 2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 2.0)
        and steps.key() == got[("decode_ms_per_token", "p50")].key().series()
    )


def test_the_floor_is_weights_plus_kv_over_dram_bandwidth() -> None:
    weights = ReadBytes(per_token=400 * MIB, stored=500 * MIB, gathered={}, custom_ops=())
    bw = DramBandwidth(2.0, "bw-run", "store", "read", 2, 4096 * MIB, 100 * MIB)
    out = decode_records(context(), reply([[300.0] * 4] * 3), weights, bw)
    got = by_key(out.records)
    floor = got[("decode_floor_ms", None)]
    want = (400 * MIB + 4096 * (8 + 1.5)) / 2e9 * 1e3  # the median step reads 9.5 positions of cache
    assert floor.value == pytest.approx(want)
    a = floor.annotations
    assert a["bandwidth_run"] == "bw-run" and a["regime"] == "dram" and a["uncertain"] is False
    assert a["floor_first_ms"] < floor.value < a["floor_last_ms"]
    assert got[("decode_efficiency", None)].value == pytest.approx(want / 300.0)
    assert out.warnings == [
        f"decode_ms_per_token {stat} needs at least {need} samples for a 95% confidence interval inside the "
        "samples, got 12; decode more (--new-tokens, --rounds)"
        for stat, need in (("p90", 36), ("p99", 368))
    ]


def test_an_unbacked_floor_is_flagged() -> None:
    small = ReadBytes(per_token=10 * MIB, stored=12 * MIB, gathered={}, custom_ops=())
    bw = DramBandwidth(2.0, "bw-run", "measured", "read", 1, 64 * MIB, 100 * MIB)
    out = decode_records(context(), reply([[1.0] * 12]), small, bw)
    eff = by_key(out.records)[("decode_efficiency", None)]
    assert eff.annotations["uncertain"] and eff.annotations["regime"] == "cache"
    assert any("arrays of 64 MiB, not 4x the last-level cache" in w for w in out.warnings)
    assert any("under 2x the last-level cache (100 MiB)" in w for w in out.warnings)
    big = ReadBytes(per_token=400 * MIB, stored=500 * MIB, gathered={}, custom_ops=())
    dram = DramBandwidth(2.0, "bw-run", "store", "read", 1, 4096 * MIB, 100 * MIB)
    beaten = decode_records(context(), reply([[100.0] * 12]), big, dram)
    assert by_key(beaten.records)[("decode_efficiency", None)].annotations["beats_floor"]
    assert any("beats the bandwidth floor" in w for w in beaten.warnings)


def bandwidth_record(run: str, gbps: float, array_mb: int, llc_mb: int | None, kernel: str = "read"):  # type: ignore[no-untyped-def]
    ctx = RecordContext(run, "dev", "bandwidth")
    notes = {"llc_bytes": llc_mb * MIB if llc_mb else None}
    return ctx.record(
        "bandwidth_gbps",
        gbps,
        "GB/s",
        notes,
        kernel=kernel,
        threads=1,
        array_bytes=array_mb * MIB,
        stat="best",
    )


def test_dram_sized_figures_win_and_the_store_gives_the_latest(tmp_path: Path) -> None:
    cache_sized = bandwidth_record("a", 30.0, 64, 32)  # 2x the LLC: the cache inflates it
    dram = bandwidth_record("a", 6.0, 256, 32)
    found = dram_bandwidth([cache_sized, dram], "store")
    assert found is not None and found.gbps == 6.0 and found.dram_sized
    assert not dram_bandwidth([cache_sized], "store").dram_sized  # type: ignore[union-attr]
    with Store(tmp_path / "s.db") as store:
        for run, gbps, array in (("r1", 5.0, 256), ("r2", 7.0, 256), ("r3", 40.0, 16)):
            store.begin_run(run, "probe", {})
            job = Job("dev", "bandwidth")
            store.save_job(run, JobOutcome(job, "ok", [bandwidth_record(run, gbps, array, 32)]))
            store.finish_run(run, "ok")
    got = stored_dram_bandwidth(tmp_path / "s.db", "dev")
    assert got is not None and (got.gbps, got.run_id, got.source) == (7.0, "r2", "store")  # r3 is not DRAM
    assert stored_dram_bandwidth(tmp_path / "none.db", "dev") is None
