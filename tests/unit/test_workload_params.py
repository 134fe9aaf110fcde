"""Workload knobs as typed params (flags and suite keys), the fit budgets on streaming RTF and cold load,
and the matching rules of the per-op comparison on small graphs."""

from __future__ import annotations

import pytest

from edgebench.analysis import budgets as budget_defs
from edgebench.analysis import fit
from edgebench.errors import UserError
from edgebench.probes.params import ParamError
from edgebench.probes.registry import BenchParams, ContentionParams, SoakParams, state_pairs, values
from edgebench.records import Record


def test_stream_params_parse_and_refuse_with_the_key() -> None:
    p = BenchParams.parse(
        {
            "stream": True,
            "state": ["stateN=state"],
            "frame_seconds": 0.032,
            "frames": 10,
            "value": ["sr=16000"],
        }
    )
    assert state_pairs(p.state) == {"stateN": "state"} and values(p.value) == {"sr": 16000}
    ident = p.identity()
    assert ident["stream"] is True and ident["frame_seconds"] == 0.032 and "frames" not in ident
    cases = [
        ({"state": ["a=b"]}, "state", "applies to streaming"),
        ({"stream": True}, "frame_seconds", "needs the time one frame holds"),
        ({"stream": True, "frame_seconds": 0.01, "state": ["ab"]}, "state", "expected OUT=IN"),
        ({"stream": True, "frame_seconds": 0.01, "state": ["a=x", "b=x"]}, "state", "fed by two outputs"),
        ({"value": ["sr=fast"]}, "value", "is not a number"),
        ({"stream": True, "frame_seconds": 0.01, "cold_load": True}, "cold_load", "plain bench"),
        ({"frame_seconds": -1}, "frame_seconds", "must be positive"),
    ]
    for raw, key, words in cases:
        with pytest.raises(ParamError) as err:
            BenchParams.parse(raw)
        assert err.value.key == key and words in str(err.value), raw


def test_soak_and_contention_params() -> None:
    assert SoakParams.parse({"minutes": 0.1, "period_s": 1}).identity() == {"threads": 0, "minutes": 0.1}
    with pytest.raises(ParamError, match="fewer than 3 samples"):
        SoakParams.parse({"minutes": 0.05, "period_s": 2})
    c = ContentionParams.parse({"corunner_threads": "1-3", "threads": [1, 2]})
    assert c.corunner_threads == (1, 2, 3) and c.threads == (1, 2)


def rec(metric: str, value: float, **params: object) -> Record:
    return Record("r1", "phone", "bench", "vad", "onnxruntime", metric, value, "", dict(params))


def test_fit_budgets_on_rtf_and_cold_load() -> None:
    records = [rec("latency_ms", 2.0, threads=1, stat=s) for s in ("p50", "p99", "min")]
    stream = {"threads": 1, "stream": True, "frame_s": 0.032}
    records += [rec("rtf", v, stat=s, **stream) for s, v in (("p50", 0.2), ("p99", 0.45))]
    records.append(rec("load_ms", 400.0, threads=1, cache="cold"))
    budgets = budget_defs.parse_budgets(["rtf_p99=0.5", "cold_load_ms=300"])
    [verdict] = fit.assess(records, budgets).verdicts
    assert verdict.values == {"rtf_p99": 0.45, "cold_load_ms": 400.0}
    assert verdict.fits is False and verdict.limiting == "cold_load_ms"
    with pytest.raises(UserError, match="rtf_<p50"):
        budget_defs.parse_budgets(["rtf_p42=1"])


def test_a_model_measured_only_frame_by_frame_is_fitted() -> None:
    stream = {"threads": 1, "stream": True, "frame_s": 0.032}
    records = [rec("frame_latency_ms", v, stat=s, **stream) for s, v in (("p50", 6.0), ("p99", 9.0))]
    records += [rec("rtf", 0.28, stat="p99", **stream)]
    [verdict] = fit.assess(records, budget_defs.parse_budgets(["rtf_p99=0.3", "latency_p99_ms=10"])).verdicts
    assert verdict.fits is True and verdict.values == {"rtf_p99": 0.28, "latency_p99_ms": 9.0}


def test_per_op_matching_rules_on_quantized_graph_names() -> None:
    from onnx import helper

    from edgebench.probes.divergence import match_tensors

    def graph(nodes):  # type: ignore[no-untyped-def]
        return helper.make_model(helper.make_graph(nodes, "g", [], []))

    reference = graph([
        helper.make_node("MatMul", ["x", "w"], ["mm0"], name="fc0/MatMul"),
        helper.make_node("Add", ["mm0", "b"], ["a0"], name="fc0/Add"),
        helper.make_node("Relu", ["a0"], ["h0"], name="fc0/Relu"),
        helper.make_node("MatMul", ["h0", "w1"], ["y"], name="fc1/MatMul"),
    ])  # fmt: skip
    candidate = graph([
        helper.make_node("Gemm", ["x", "w", "b"], ["_y"], name="fc0/MatMul/MatMulAddFusion"),
        helper.make_node("QuantizeLinear", ["_y", "s", "z"], ["_z"], name="h0_QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["_z", "s", "z"], ["_10"], name="h0_DequantizeLinear"),
        helper.make_node("MatMul", ["_10", "w1"], ["y"], name="fc1/MatMul"),
    ])  # fmt: skip
    got = {m.reference.name: (m.candidate, m.rule) for m in match_tensors(reference, candidate)}
    assert got == {"a0": ("_y", "fusion"), "h0": ("_10", "dequantized"), "y": ("y", "name")}
    renamed = graph([
        helper.make_node("Relu", ["a0"], ["_k"], name="fc0/Relu"),
        helper.make_node("Identity", ["h0_DequantizeLinear_Output"], ["h0_DequantizeLinear_Output"], name="q"),
    ])  # fmt: skip
    got = {m.reference.name: (m.candidate, m.rule) for m in match_tensors(reference, renamed)}
    assert got["h0"] == ("_k", "node")
