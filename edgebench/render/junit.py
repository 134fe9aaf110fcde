"""A gate result as JUnit XML: one testcase per pair; failures carry the numbers.

PASS and IMPROVED pass; FAIL is a <failure>; NOISY, MISSING and INCOMPLETE are <skipped> (or <failure>
under --strict); a pair left unmeasured by a lab failure is an <error>. A suite rule that paired nothing
is a testcase of its own (`rule:METRIC[STAT]`), INCOMPLETE. Every testcase carries its numbers as
<properties> so CI dashboards can show them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ..analysis.gate import FAIL, INCOMPLETE, MISSING, NOISY, GateResult, PairVerdict

SUITE_NAME = "edgebench gate"


def _classname(v: PairVerdict) -> str:
    return f"edgebench.{v.key.device}.{v.key.runtime}.{v.key.model}"


def _testname(v: PairVerdict) -> str:
    stat = f"[{v.key.stat}]" if v.key.stat else ""
    params = f" {v.key.params}" if v.key.params != "{}" else ""
    return f"{v.key.probe}:{v.key.metric}{stat}{params}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def verdict_text(v: PairVerdict) -> str:
    """The numbers behind a verdict, one line each (the body of a failure)."""
    lines = [
        f"verdict: {v.verdict} ({v.reason})",
        f"rule: {v.rule.describe(v.unit)} on {v.rule.metric}"
        + (f" [{v.rule.stat}]" if v.key.stat else "")
        + f" ({v.rule.source})",
        f"baseline: {_number(v.baseline)} {v.unit}  (n={v.n_baseline})",
        f"candidate: {_number(v.candidate)} {v.unit}  (n={v.n_candidate})",
        f"change: {v.change_text()}",
    ]
    if v.p_value is not None:
        lines.append(f"p (one-sided): {v.p_value:.3g}  q (BH): {_number(v.q_value)}  method: {v.method}")
    else:
        lines.append(f"method: {v.method}")
    if v.samples_needed:
        lines.append(f"samples per side to settle: {v.samples_needed}")
    lines += [f"warning: {w}" for w in v.warnings]
    return "\n".join(lines)


def gate_junit(result: GateResult) -> str:
    """The JUnit XML document (as text) for a gate result."""
    strict = result.options.strict
    suite = ET.Element("testsuite", name=SUITE_NAME)
    failures = errors = skipped = 0
    for v in result.verdicts:
        case = ET.SubElement(suite, "testcase", classname=_classname(v), name=_testname(v), time="0")
        props = ET.SubElement(case, "properties")
        for name, value in (
            ("verdict", v.verdict),
            ("baseline", _number(v.baseline)),
            ("candidate", _number(v.candidate)),
            ("change", v.change_text()),
            ("unit", v.unit),
            ("p_value", _number(v.p_value)),
            ("q_value", _number(v.q_value)),
            ("n_baseline", str(v.n_baseline)),
            ("n_candidate", str(v.n_candidate)),
            ("method", v.method),
            ("threshold", v.rule.describe(v.unit)),
        ):
            ET.SubElement(props, "property", name=name, value=value)
        message = f"{v.verdict}: {v.change_text()} ({v.reason})"
        if v.lab_failure:
            ET.SubElement(case, "error", message=message, type="LabFailure").text = verdict_text(v)
            errors += 1
        elif v.verdict == FAIL or (strict and v.verdict in (NOISY, MISSING, INCOMPLETE)):
            failure = ET.SubElement(case, "failure", message=message, type=f"Gate{v.verdict.title()}")
            failure.text = verdict_text(v)
            failures += 1
        elif v.verdict in (NOISY, MISSING, INCOMPLETE):
            ET.SubElement(case, "skipped", message=message).text = verdict_text(v)
            skipped += 1
        else:
            ET.SubElement(case, "system-out").text = verdict_text(v)
    unpaired_rules = [r for r in result.rules if r.status == INCOMPLETE and not r.pairs]
    for r in unpaired_rules:
        case = ET.SubElement(
            suite, "testcase", classname="edgebench.rules", name=f"rule:{r.rule.selection()}", time="0"
        )
        message = f"INCOMPLETE: {r.note} ({r.rule.source})"
        if strict:
            ET.SubElement(case, "failure", message=message, type="GateIncomplete").text = message
            failures += 1
        else:
            ET.SubElement(case, "skipped", message=message).text = message
            skipped += 1
    suite.set("tests", str(len(result.verdicts) + len(unpaired_rules)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("baseline_run", result.baseline),
        ("candidate_run", result.candidate),
        ("alpha", f"{result.options.alpha:g}"),
        ("verdict", result.overall),
    ):
        ET.SubElement(props, "property", name=name, value=value)
    root = ET.Element(
        "testsuites",
        name=SUITE_NAME,
        tests=suite.get("tests", "0"),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
    )
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
