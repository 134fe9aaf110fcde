"""A gate result as Markdown for a PR comment or CI summary: the verdict line, then the pairs that need a
look (change first, largest first), the rules and what each covered, and the PASS rows folded away."""

from __future__ import annotations

from ..analysis.gate import PASS, GateResult, PairVerdict

_MARK = {
    "PASS": "PASS",
    "IMPROVED": "IMPROVED",
    "FAIL": "**FAIL**",
    "NOISY": "*NOISY*",
    "MISSING": "*MISSING*",
    "INCOMPLETE": "**INCOMPLETE**",
}
_ICON = {"PASS": "✅", "FAIL": "❌", "INCOMPLETE": "⚠️", "LAB FAILURE": "🔌"}
_HEAD = "| change [CI] | verdict | measurement | baseline → candidate | n | why |"
_ALIGN = "| ---: | --- | --- | --- | ---: | --- |"
# A PR comment holds 65536 characters but is read on one screen or two: past this many rows a table says
# how many it left out, and a reason longer than MAX_WHY characters is cut (the JSON and JUnit keep all).
MAX_ROWS = 25
MAX_WHY = 400
MAX_NOTES = 10


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _num(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.4g} {unit}".strip()


def _measurement(v: PairVerdict) -> str:
    stat = f"[{v.key.stat}]" if v.key.stat else ""
    params = "" if v.key.params == "{}" else f" `{v.key.params}`"
    return f"{v.key.device} · {v.key.model} · {v.key.runtime}<br>`{v.key.probe}:{v.key.metric}{stat}`{params}"


def _row(v: PairVerdict) -> str:
    why = v.reason + "".join(f"<br>⚠ {w}" for w in v.warnings)
    if len(why) > MAX_WHY:
        why = why[: MAX_WHY - 1] + "…"
    q = "" if v.q_value is None or "q=" in v.reason else f" (q={v.q_value:.2g})"
    cells = [
        f"**{v.change_text()}**" if v.change is not None else "-",
        _MARK.get(v.verdict, v.verdict),
        _measurement(v),
        f"{_num(v.baseline, v.unit)} → {_num(v.candidate, v.unit)}",
        f"{v.n_baseline}/{v.n_candidate}",
        why + q,
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _by_change(v: PairVerdict) -> float:
    return -abs(v.change) if v.change is not None else 0.0


def _table(rows: list[PairVerdict]) -> list[str]:
    lines = [_HEAD, _ALIGN] + [_row(v) for v in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        lines.append(
            f"| | | {len(rows) - MAX_ROWS} more row(s) left out: see the JUnit or JSON output | | | |"
        )
    return lines


def gate_markdown(result: GateResult) -> str:
    """The Markdown document for a gate result."""
    counts = ", ".join(f"{n} {k}" for k, n in result.counts().items() if n)
    lines = [
        f"## {_ICON.get(result.overall, '')} edgebench gate: {result.overall}".replace("  ", " "),
        "",
        f"Baseline `{result.baseline}`, candidate `{result.candidate}`: {counts or 'nothing compared'}"
        f" (alpha {result.options.alpha:g}, Benjamini-Hochberg across pairs"
        f"{', strict' if result.options.strict else ''}).",
    ]
    attention = sorted((v for v in result.verdicts if v.verdict != PASS), key=_by_change)
    passed = sorted((v for v in result.verdicts if v.verdict == PASS), key=_by_change)
    if attention:
        lines += ["", *_table(attention)]
    lines += ["", "| rule | threshold | from | pairs | status |", "| --- | --- | --- | ---: | --- |"]
    for r in result.rules:
        detail = ", ".join(f"{n} {k}" for k, n in r.counts.items() if n) or r.note
        status = _MARK.get(r.status, r.status) + (f": {detail}" if detail else "")
        lines.append(
            f"| `{r.rule.selection()}` | {r.rule.describe()} | {_cell(r.rule.source)} | {r.pairs} | "
            f"{_cell(status)} |"
        )
    if passed:
        lines += [
            "",
            f"<details><summary>{len(passed)} PASS</summary>",
            "",
            *_table(passed),
            "",
            "</details>",
        ]
    for n in result.notes[:MAX_NOTES]:
        lines += ["", f"> {n}"]
    if len(result.notes) > MAX_NOTES:
        lines += ["", f"> {len(result.notes) - MAX_NOTES} more note(s) left out: see the JSON output"]
    if result.unpaired_candidate:
        lines += [
            "",
            f"{result.unpaired_candidate} candidate measurement(s) have no baseline to compare with.",
        ]
    return "\n".join(lines) + "\n"
