"""Verbs: report (HTML / Markdown comparison report) and fit (which model fits which chip)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import UserError
from .common import (
    JSON_OPT,
    LAB_OPT,
    STORE_OPT,
    console,
    make_table,
    note,
    open_store,
    print_json,
    records_json,
    resolve_runs,
    warn,
)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("fit")(fit)


def suite_runs(st, suite: Path) -> list[str]:
    """The runs of a suite (by the name in its file), and the gate runs that compared them."""
    from ..execution.suite import load_suite

    name = load_suite(suite).name
    runs = st.runs()
    ids = [r.run_id for r in runs if r.suite == name]
    if not ids:
        raise UserError(f"{suite}: no run of suite '{name}' in {st.path} (run `edgebench run {suite}` first)")
    gated = {g["run_id"] for g in st.gates() if g["candidate"] in ids or g["baseline"] in ids}
    return [r.run_id for r in runs if r.run_id in set(ids) | gated]


def _gate_rules(suite: Path | None):
    """The rules `edgebench gate --suite` would apply: the suite's [[gate]] tables over the defaults."""
    from ..analysis.gate import default_rules, merge_rules
    from ..execution.suite import rules_from_suite

    if suite is None:
        return None, ""
    overrides = rules_from_suite(suite)
    if not overrides:
        return default_rules(), "the default gate rules (the suite has no [[gate]] table)"
    return merge_rules(default_rules(), overrides), f"the [[gate]] rules of {suite.name} over the defaults"


def _budgets(suite: Path | None, items: list[str] | None):
    from ..analysis.budgets import budgets_from_suite, parse_budgets

    base = budgets_from_suite(suite) if suite is not None else ()
    return parse_budgets(items or [], base)


_OUT = typer.Option(
    None,
    "--out",
    "-o",
    help="Report file (required): .html for HTML, .md for Markdown, e.g. reports/nightly.html; other "
    "suffixes are refused unless --format is given.",
)
_RUNS = typer.Option(
    None,
    "--run",
    help="Run id or reference: latest, latest~1, suite:NAME, tag:NAME, a prefix (repeatable; default: "
    "every run, or with --suite that suite's runs).",
)
_SUITE_REPORT = typer.Option(
    None, "--suite", help="Suite file: its runs (unless --run is given) and its [budget] table."
)
_BUDGET = typer.Option(
    None, "--budget", help="KEY=VALUE: latency_p99_ms, memory_mb, energy_mj, load_ms (repeatable)."
)
_FORMAT = typer.Option(None, "--format", help="html or md (default: from the --out suffix, else html).")
_TITLE = typer.Option(None, "--title", help="Report title.")
_MODELS = typer.Option(
    None,
    "--model",
    "-m",
    help="Only this model (repeatable): a name measured in the store, or a model file or builtin:NAME "
    "(whose counts let fit predict it where it was never benched).",
)
_STRICT = typer.Option(False, "--strict", help="Uncertain verdicts fail too (exit 1).")
_DEVICES = typer.Option(None, "--device", "-d", help="Only this device (repeatable).")
_SUITE_FIT = typer.Option(None, "--suite", help="Take budgets from this suite's budget table.")
_SHAPES = typer.Option(
    None,
    "--shape",
    help="NAME=DIMS for every --model file with that input, MODEL:NAME=DIMS for one (repeatable).",
)
_NO_STORE = typer.Option(False, "--no-store", help="Do not keep the verdicts in the store.")
_CONTEXT = typer.Option(
    None,
    "--context",
    help="GGUF LLMs: the context (positions) memory is judged at: weights + KV cache + the buffers llama.cpp "
    "reports for it (default: the model's own context length).",
)
_FIT_THREADS = typer.Option(
    None, "--threads", help="GGUF LLMs: the thread count decode tokens/s is predicted at."
)
_KV_TYPE = typer.Option(
    None,
    "--kv-type",
    help="GGUF LLMs: the KV cache type of K and V memory and decode are judged at (llama.cpp's -ctk/-ctv: "
    "f16, q8_0, q4_0...; default f16).",
)
_DEPTH = typer.Option(
    None,
    "--depth",
    help="GGUF LLMs: positions cached at the decode step predicted (default: half the context).",
)


def report(
    out: Path = _OUT,
    store: Path = STORE_OPT,
    run: list[str] = _RUNS,
    suite: Path = _SUITE_REPORT,
    budget: list[str] = _BUDGET,
    fmt: str = _FORMAT,
    title: str = _TITLE,
) -> int:
    """Write a self-contained comparison report (HTML with plots, or a Markdown summary)."""
    from ..render.report import format_for, load_report_data, render, write_report

    if out is None:
        raise UserError("--out is required (e.g. --out reports/nightly.html, or .md for Markdown)")
    kind = format_for(out, fmt)
    budgets = _budgets(suite, budget)
    rules, rules_source = _gate_rules(suite)
    with open_store(store) as st:
        run_ids = resolve_runs(st, run) if run else (suite_runs(st, suite) if suite is not None else None)
        data = load_report_data(st, run_ids, budgets, title, rules, rules_source)
    text = render(data, kind)
    write_report(text, out)
    warn(data.fit_warnings)
    note(f"edgebench: wrote {kind} report of {len(data.runs)} run(s) to {out}")
    return 0


def fit(
    store: Path = STORE_OPT,
    model: list[str] = _MODELS,
    device: list[str] = _DEVICES,
    budget: list[str] = _BUDGET,
    suite: Path = _SUITE_FIT,
    shape: list[str] = _SHAPES,
    strict: bool = _STRICT,
    no_store: bool = _NO_STORE,
    as_json: bool = JSON_OPT,
    context: int = _CONTEXT,
    threads: int = _FIT_THREADS,
    depth: int = _DEPTH,
    kv_type: str = _KV_TYPE,
    lab: Path = LAB_OPT,
) -> int:
    """Does the model fit the chip? Exit 0 fits, 1 does not fit (or, with --strict, uncertain)."""
    from ..analysis.fit import assess
    from ..analysis.fit_result import verdict_exit_code
    from ..analysis.observations import MEASURING_PROBES
    from ..execution.provenance import host_provenance
    from ..models.kv_cache import DEFAULT_KV_CACHE_TYPE
    from ..records import new_run_id

    budgets = _budgets(suite, budget)
    ggufs = _gguf_models(model or [], context, threads, depth, kv_type)
    if ggufs:
        sizes = (context, depth, threads, kv_type or DEFAULT_KV_CACHE_TYPE)
        return _fit_llm(store, ggufs, list(device or []), budgets, sizes, lab, (strict, no_store, as_json))
    with open_store(store) as st:
        runs = st.runs()
        order = [r.run_id for r in runs]
        records = [r for r in st.records() if r.probe not in ("fit", "gate")]
        measured = {r.model for r in records if r.probe in MEASURING_PROBES and r.model}
        selected, counts, notes = _fit_models(model or [], measured, shape, st.path)
        result = assess(
            records,
            budgets,
            counts=counts,
            samples=st.samples(),
            device_info=st.device_info(),
            devices=list(device) if device else None,
            models=list(counts),
            run_order=order,
            asked=sorted(selected) or None,
        )
        if selected:
            result.verdicts = [v for v in result.verdicts if v.model in selected]
            result.variants = [r for r in result.variants if {r.variant, r.reference} & selected]
        if not result.verdicts:
            what = f" of {', '.join(sorted(selected))}" if selected else ""
            raise UserError(
                f"{store}: no bench measurements or predictions{what} to judge (run `edgebench bench`)"
            )
        run_id = new_run_id()
        out = result.to_records(run_id)
        if not no_store:
            st.import_records(run_id, out, kind="fit", provenance=host_provenance())
    if not budgets:
        result.warnings.insert(0, "no budgets given (--budget latency_p99_ms=15 ...): showing values only")
    result.warnings[:0] = notes
    warn(result.warnings)
    code = verdict_exit_code(result.verdicts, strict)
    if as_json:
        summary = [s.to_dict() for s in result.cv_summaries()]
        print_json(records_json(out, run_id=run_id, cv=summary, warnings=result.warnings, exit_code=code))
        return code
    _show(result, run_id, no_store)
    return code


def _fit_models(
    refs: list[str], measured: set[str], shape: list[str] | None, store: Path
) -> tuple[set[str], dict, list[str]]:
    """--model selects rows: a name measured in the store, or a model file (whose counts let fit predict
    it where it was never benched), counted at its --shape values (plain, or MODEL:INPUT=DIMS for one of
    them; edgebench.cli.shapes). Returns the names selected, the counts and notes for the user."""
    from ..analysis.model_counts import count_model
    from ..errors import ModelError
    from ..models.refs import resolve_model
    from .shapes import check_plain_used, onnx_input_ranks, parse_shape_args, shapes_for

    selected: set[str] = set()
    counts = {}
    notes = []
    resolved_names = {}
    for ref in refs:
        if not (ref in measured and not Path(ref).exists()):
            try:
                resolved_names[ref] = resolve_model(ref).name
            except ModelError:
                pass
    args = parse_shape_args(shape, [*refs, *resolved_names.values()])
    inputs_of: dict[str, dict[str, int | None]] = {}
    for ref in refs:
        if ref in measured and not Path(ref).exists():
            selected.add(ref)
            continue
        try:
            resolved = resolve_model(ref)
        except ModelError as exc:
            if "/" in ref or Path(ref).suffix or ref.startswith("builtin:"):
                raise  # a file the user named: its own error (missing, corrupt)
            known = ", ".join(sorted(measured)[:8]) or "none"
            raise UserError(
                f"--model {ref}: neither a model measured in {store} (measured: {known}) nor a model file"
            ) from exc
        selected.add(resolved.name)
        if resolved.format != "onnx":  # an MNN file still gets its measured verdicts, just no prediction
            notes.append(
                f"{ref}: FLOPs and bytes are counted on ONNX models; pass the ONNX it came from "
                "to predict it where it was not benched"
            )
            continue
        inputs_of[ref] = onnx_input_ranks(resolved.path)
        shapes = shapes_for(args, [ref, resolved.name], inputs_of[ref], ref)
        counts[resolved.name] = count_model(resolved.path, resolved.name, shapes)
        warn(counts[resolved.name].warnings, f"{resolved.name}: ")
    if (args.plain or args.per_model) and not inputs_of:
        raise UserError("--shape: applies to the --model files counted; none was given")
    if args.plain:
        check_plain_used(args, inputs_of)
    return selected, counts, notes


def _gguf_models(
    refs: list[str], context: int | None, threads: int | None, depth: int | None, kv_type: str | None = None
) -> list:
    """The --model files when every one is a GGUF (fit's LLM path), else []; GGUFs mixed with other models,
    or an LLM option without a GGUF, is a usage error."""
    from ..models.kv_cache import KV_CACHE_TYPES
    from ..models.refs import resolve_model

    if kv_type is not None and kv_type not in KV_CACHE_TYPES:
        raise UserError(f"--kv-type {kv_type}: not a KV cache type (one of {', '.join(KV_CACHE_TYPES)})")

    def is_gguf(ref: str) -> bool:  # by name, as ModelRef.format tells: the ONNX path resolves nothing here
        return Path(ref).suffix.lower() == ".gguf" or ref.split(":")[:2] == ["builtin", "llama"]

    ggufs = [resolve_model(ref) for ref in refs if is_gguf(ref)]  # a missing or bad file: its own error
    if ggufs and len(ggufs) != len(refs):
        raise UserError(
            "--model: GGUF LLMs are judged apart (memory at --context, decode tokens/s): give them in a fit "
            "of their own"
        )
    llm_options = (("--context", context), ("--threads", threads), ("--depth", depth), ("--kv-type", kv_type))
    for flag, value in llm_options:
        if value is not None and not ggufs:
            raise UserError(f"{flag}: applies to GGUF LLMs (--model X.gguf or builtin:llama:...)")
        if isinstance(value, int) and value < (2 if flag == "--context" else 0 if flag == "--depth" else 1):
            raise UserError(f"{flag} {value}: too small")
    if context is not None and depth is not None and depth >= context:
        raise UserError(f"--depth {depth}: must be under --context {context}")
    return ggufs


def _fit_llm(
    store: Path, ggufs: list, devices: list[str], budgets, sizes: tuple, lab: Path, flags: tuple
) -> int:
    """fit on GGUF LLMs (edgebench.analysis.llm_fit): each model's memory at the context against each
    device's memory, its decode tokens/s predicted from other GGUFs' efficiency there; stored as a fit run."""
    from functools import partial

    from ..analysis import llm_fit as lf
    from ..analysis.fit_result import FitResult, verdict_exit_code
    from ..execution.provenance import host_provenance
    from ..models.cache import models_cache_dir
    from ..models.gguf_models import read_gguf
    from ..records import new_run_id
    from ..runtimes import owner_of
    from .common import open_lab

    context, depth, threads, kv_type = sizes
    strict, no_store, as_json = flags
    rt = owner_of("gguf")
    assert rt is not None and rt.decode_tool
    with open_store(store) as st:
        order = [r.run_id for r in st.runs()]
        records = [r for r in st.records() if r.probe in ("decode", "bandwidth")]
        info = st.device_info()
        judged = {r.model for r in records if r.metric == "decode_efficiency"}  # only these are read
        kept = {j.model: j.path for j in st.job_models(order) if j.probe == "decode" and j.model in judged}
    targets = _llm_devices(devices, records, info, store)
    binary, env, source = lf.host_llama_bench(open_lab(lab), targets, rt.decode_tool)
    quants = lf.measured_quantizations(kept, records)
    cache = models_cache_dir().parent / "llama-buffers.json"
    found = []
    for m in ggufs:
        gguf = read_gguf(m.path)
        ctx = context or gguf.context_length
        at = depth if depth is not None else ctx // 2
        if at >= ctx:
            raise UserError(f"--depth {at}: must be under the context {ctx} of {m.name}")
        run = partial(lf.run_buffers, str(binary), m.path, ctx, env, kv_type)
        buffers, cached = lf.cached_buffers(cache, lf.buffers_key(gguf, ctx, binary, kv_type), run)
        need = lf.memory_need(gguf, ctx, buffers, cached, kv_type)
        for dev in targets:
            ident = (dev, rt.name, m.name)
            ev = lf.efficiency_evidence(records, quants, ident, lf.quantization_of(gguf), at, threads, order)
            bw = _read_bandwidth(records, dev, ev.threads, order)
            pred = lf.predict_decode(gguf, at, ev, bw, kv_type)
            found.append(lf.judge_llm(ident, need, lf.device_memory(info, dev, order), pred, budgets))
    result = FitResult(budgets=tuple(budgets), verdicts=[f.to_verdict() for f in found])
    run_id = new_run_id()
    out = result.to_records(run_id)
    if not no_store:
        with open_store(store) as st:
            st.import_records(run_id, out, kind="fit", provenance=host_provenance())
    warnings = [f"{f.device} {f.model}: {w}" for f in found for w in f.warnings]
    unchecked = sorted({k for f in found for k in f.unchecked})
    if unchecked:
        warnings.append(
            f"budgets not judged on GGUF LLMs: {', '.join(unchecked)} (memory_mb and decode_tokens_per_s_min "
            "are)"
        )
    note(f"edgebench: llama.cpp's buffers from {binary} ({source})")
    warn(warnings)
    code = verdict_exit_code(result.verdicts, strict)
    if as_json:
        llm = [f.to_dict() for f in found]
        print_json(records_json(out, run_id=run_id, llm=llm, warnings=warnings, exit_code=code))
        return code
    _show_llm(found, run_id, no_store)
    return code


def _llm_devices(asked: list[str], records: list, info: list[dict], store: Path) -> list[str]:
    """The devices an LLM fit judges: those asked, each known to the store (a fingerprint or a measurement),
    else every device the store knows."""
    known = sorted({i["device"] for i in info} | {r.device for r in records})
    for name in asked:
        if name not in known:
            raise UserError(
                f"--device {name}: nothing of it in {store} (known: {', '.join(known) or 'none'}); its "
                f"memory and bandwidth come from a run on it (`edgebench probe bandwidth --device {name}`)"
            )
    if not asked and not known:
        raise UserError(
            f"{store}: no device measured yet: run a probe on one (e.g. `edgebench probe bandwidth`)"
        )
    return list(dict.fromkeys(asked)) or known


def _read_bandwidth(records: list, device: str, threads: int | None, order: list[str]):
    """The device's read bandwidth at `threads` from the store (analysis.bandwidth), as the decode floor
    picks it within a run."""
    from ..analysis.bandwidth import latest_dram_bandwidth

    return latest_dram_bandwidth(records, device, "read", threads, order)


def _show_llm(found: list, run_id: str, no_store: bool) -> None:
    """The LLM verdicts as a table: memory and its parts against the device's, decode tokens/s predicted."""
    from rich.text import Text

    style = {"fits": "green", "does not fit": "bold red", "uncertain": "yellow"}
    table = make_table(
        f"fit ({'not stored' if no_store else 'run ' + run_id})",
        [
            "device",
            "model",
            "verdict",
            "memory MB (weights + KV + buffers)",
            "device MB",
            "decode tokens/s",
            "evidence",
        ],
    )
    for f in found:
        m, d = f.memory, f.decode
        rate = f"{d.p50:.4g} [{d.low:.4g}-{d.high:.4g}]" if d.p50 is not None else f"unknown: {d.unknown}"
        table.add_row(
            Text(f.device),
            Text(f.model),
            Text(f.verdict, style=style.get(f.verdict, "")),
            Text(f"{m.memory_mb:.1f} ({m.weights_mb:.1f} + {m.kv_cache_mb:.1f} + {m.buffers_mb:.1f})"),
            Text(f"{f.device_memory.mb:.0f}" if f.device_memory.mb else "unknown"),
            Text(rate),
            Text(", ".join(p.model for p in d.evidence.points) or "-"),
        )
    console().print(table)


def ratio_text(ratio: float | None) -> str:
    """value / limit as people read it: "0.62x budget", "36x budget"."""
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x budget" if ratio < 10 else f"{ratio:.0f}x budget"


def _memory_text(memory: dict) -> str:
    """The memory beside a verdict's values: the model's range over invocations, then the baseline the
    runtime and harness take (not charged to memory_mb), then the whole process's peak."""
    parts = []
    if memory.get("model_mb"):
        lo, hi = memory["model_mb"]
        parts.append(f"model memory {lo:.4g}-{hi:.4g} MB" if hi - lo >= 0.05 else f"model memory {hi:.4g} MB")
    if memory.get("baseline_mb") is not None:
        parts.append(f"+ runtime/harness baseline {memory['baseline_mb']:.4g} MB")
    if memory.get("process_peak_mb") is not None:
        parts.append(f"(process peak {memory['process_peak_mb']:.4g} MB)")
    return ("; " if parts else "") + " ".join(parts)


def _show_variants(rows) -> None:
    """One row per variant against its fp32 reference: speed-up with its interval, size, accuracy, verdict."""
    from rich.text import Text

    style = {"fits": "green", "does not fit": "bold red", "uncertain": "yellow"}
    table = make_table(
        "variants against their fp32 reference",
        ["device", "variant", "reference", "p50 speed-up [95% CI]", "size", "cosine", "SNR dB", "verdict"],
    )
    for r in rows:
        ci = f" [{r.speedup_low:.3g}-{r.speedup_high:.3g}]" if r.speedup_low is not None else ""
        table.add_row(
            Text(r.device),
            Text(r.variant),
            Text(r.reference),
            Text(f"{r.speedup:.3g}x{ci}" if r.speedup is not None else "-"),
            Text(f"{r.size_ratio:.2g}x" if r.size_ratio is not None else "-"),
            Text(f"{r.cosine:.6g}" if r.cosine is not None else "-"),
            Text(f"{r.snr_db:.3g}" if r.snr_db is not None else "-"),
            Text(r.verdict or "-", style=style.get(r.verdict, "")),
        )
    console().print(table)


def _show(result, run_id: str, no_store: bool) -> None:
    """The verdicts as a table on stdout (full width when piped), the trust figures after it."""
    from rich.text import Text

    from ..analysis.fit_result import (
        KERNEL_PREDICTOR,
        MIN_JUDGED_KERNEL_MODELS,
        MIN_JUDGED_MODELS,
        ROOFLINE_PREDICTOR,
        kernel_next_step,
        whole_model_next_step,
    )

    style = {"fits": "green", "does not fit": "bold red", "uncertain": "yellow"}
    table = make_table(
        f"fit ({'not stored' if no_store else 'run ' + run_id})",
        ["device", "model", "runtime", "verdict", "basis", "limiting", "value / limit", "values", "why"],
    )
    for v in result.verdicts:
        shown = v.values or {k.replace(":", " "): x for k, x in v.predicted.items()}
        values = ", ".join(
            f"{k}={x:.4g}"
            + (f" [{v.intervals[k][0]:.4g}-{v.intervals[k][1]:.4g}]" if k in v.intervals else "")
            for k, x in shown.items()
        )
        values += _memory_text(v.memory)
        table.add_row(
            Text(v.device),
            Text(v.model),
            Text(v.runtime or "-"),
            Text(v.verdict or "-", style=style.get(v.verdict, "")),
            Text(v.basis, style="cyan" if v.basis == "predicted" else ""),
            Text(v.limiting or "-"),
            Text(ratio_text(v.ratio)),
            Text(values),
            Text(v.why),
        )
    console().print(table)
    if result.variants:
        _show_variants(result.variants)
    names = {"latency_min_ms": "fastest inference", "latency_p50_ms": "p50", "memory_mb": "peak memory"}
    for s in result.cv_summaries(ROOFLINE_PREDICTOR):
        if s.device == "*" and s.holdout == "model" and s.quantity in names:
            share = (
                f"{s.within:.0%} of {s.pairs} held-out pairs within ±10%, median error {s.median_abs_err:.1%}"
                if s.judged
                else f"too few models to judge ({s.models} held out, {MIN_JUDGED_MODELS} needed: "
                f"{whole_model_next_step(s.device)})"
            )
            note(f"edgebench: cross-validated whole-model prediction of {names[s.quantity]}: {share}")
    for k in result.cv_summaries(KERNEL_PREDICTOR):
        bounds = f", measured / predicted {k.interval[0]:.2f}-{k.interval[1]:.2f}" if k.interval else ""
        where = "all devices" if k.device == "*" else f"{k.device} {k.runtime or ''}".strip()
        if not k.judged:
            note(
                f"edgebench: cross-validated per-kernel prediction of p50 on {where}: too few models to "
                f"judge ({k.models} held out, {MIN_JUDGED_KERNEL_MODELS} needed: "
                f"{kernel_next_step(k.device, k.threads)})"
            )
            continue
        note(
            f"edgebench: cross-validated per-kernel prediction of p50 on {where}: {k.within:.0%} of "
            f"{k.pairs} held-out profiles within ±10%, median error {k.median_abs_err:.1%}{bounds}"
        )
