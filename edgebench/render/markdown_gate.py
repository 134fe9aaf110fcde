"""A gate result as Markdown: a summary line and one table row per pair (for PR comments, CI summaries)."""

from __future__ import annotations

from ..analysis.gate import GateResult, PairVerdict

_MARK = {
    "PASS": "PASS",
    "IMPROVED": "IMPROVED",
    "FAIL": "**FAIL**",
    "NOISY": "*NOISY*",
    "MISSING": "*MISSING*",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _num(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.4g} {unit}".strip()


def _row(v: PairVerdict) -> str:
    stat = f" [{v.key.stat}]" if v.key.stat else ""
    params = "" if v.key.params == "{}" else v.key.params
    q = "-" if v.q_value is None else f"{v.q_value:.2g}"
    cells = [
        _MARK.get(v.verdict, v.verdict),
        v.key.device,
        v.key.model,
        v.key.runtime,
        f"{v.key.probe}:{v.key.metric}{stat}",
        params,
        _num(v.baseline, v.unit),
        _num(v.candidate, v.unit),
        v.change_text(),
        q,
        f"{v.n_baseline}/{v.n_candidate}",
        v.reason,
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def gate_markdown(result: GateResult) -> str:
    """The Markdown document for a gate result."""
    counts = ", ".join(f"{n} {k}" for k, n in result.counts().items() if n)
    lines = [
        f"## edgebench gate: {result.overall}",
        "",
        f"Baseline `{result.baseline}`, candidate `{result.candidate}`: {counts or 'nothing compared'}"
        f" (alpha {result.options.alpha:g}, Benjamini-Hochberg across pairs"
        f"{', strict' if result.options.strict else ''}).",
        "",
        "| verdict | device | model | runtime | metric | params | baseline | candidate | change [CI] | q | n "
        "| why |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [_row(v) for v in result.verdicts]
    for n in result.notes:
        lines += ["", f"> {n}"]
    if result.unpaired_candidate:
        lines += [
            "",
            f"{result.unpaired_candidate} candidate measurement(s) have no baseline to compare with.",
        ]
    return "\n".join(lines) + "\n"
