"""What each report section needs and the command that measures it, for sections the runs left empty.

An empty section is folded into one line: its title, why it is empty (the builder's own note) and the
command that would fill it, with the report's own device and a model of its runs filled in where the store
names them, so the line can be pasted as it is.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .data import ReportData
from .markup import esc

# Section id -> the command that measures it ({device}, {model} are the report's own where it has them).
COMMANDS: Mapping[str, str] = {
    "fit": "edgebench bench {model} --device {device}",
    "regressions": (
        "edgebench run SUITE.toml (again), then edgebench gate --baseline suite:NAME~1 --candidate suite:NAME"
    ),
    "health": "edgebench doctor --device {device}",
    "variants": (
        "edgebench variants {model} --out variants && "
        "edgebench bench {model} variants/*.onnx --device {device}"
    ),
    "placement": "edgebench bench {model} --runtime ncnn --backend vulkan --device {device}",
    "accuracy": "edgebench accuracy VARIANT --reference {model} --device {device}",
    "sensitivity": "edgebench sensitivity {model} --bits 8",
    "ops": "edgebench profile {model} --device {device}",
    "ceilings": "edgebench probe matmul --device {device} && edgebench probe bandwidth --device {device}",
    "roofline": "edgebench roofline {model} --device {device}",
    "threads": "edgebench probe threads --model {model} --device {device}",
    "latency": "edgebench bench {model} --device {device}",
    "thermal": "edgebench probe thermal --model {model} --device {device}",
    "power": "edgebench probe power --model {model} --device {device}",
    "decode": "edgebench probe decode --model builtin:decoder --device {device}",
    "divergence": "edgebench accuracy VARIANT --reference {model} --device {device} --per-op",
    "streaming": "edgebench bench MODEL --stream --state OUT=IN --frame-seconds S --device {device}",
    "coldload": "edgebench bench {model} --cold-load --device {device}",
    "soak": "edgebench probe soak --model {model} --device {device}",
    "contention": "edgebench probe contention --model {model} --device {device}",
    "history": "edgebench run SUITE.toml every night (5 runs make a series)",
    "prediction": "edgebench fit --model {model} --budget latency_p99_ms=15",
    "deltas": "edgebench report --run RUN --run RUN --out reports/changes.html",
    "summary": "edgebench run SUITE.toml",
}
# Sections whose emptiness is good news, not a gap: said in one line, with no command.
NOTHING_WRONG = frozenset({"errors"})
_TAGS = re.compile(r"<[^>]+>")


@dataclass(frozen=True)
class Subject:
    """The device and model the report's commands name (placeholders where the runs have none)."""

    device: str = "DEVICE"
    model: str = "MODEL"


def subject_of(data: ReportData) -> Subject:
    """The report's first device and the first model its measurements name."""
    devices = [str(d.get("device")) for d in data.devices if d.get("device")]
    devices += [r.device for r in data.measurements if r.device]
    models = [r.model for r in data.measurements if r.model and r.probe == "bench"]
    models += [r.model for r in data.measurements if r.model]
    return Subject(devices[0] if devices else "DEVICE", models[0] if models else "MODEL")


def command_for(sid: str, subject: Subject) -> str:
    """The command that measures section `sid` ("" when none applies)."""
    template = COMMANDS.get(sid, "")
    return template.format(device=subject.device, model=subject.model) if template else ""


def folded_line(sid: str, title: str, body: str, subject: Subject) -> str:
    """One line for an empty section: title, the builder's reason (as text) and the command to run."""
    reason = " ".join(html.unescape(_TAGS.sub(" ", body)).split())
    command = command_for(sid, subject)
    measure = (
        f' <span class="measure">Measure it: <code>{esc(command)}</code></span>'
        if command and sid not in NOTHING_WRONG
        else ""
    )
    return f'<p class="folded"><b>{esc(title)}</b> · {esc(reason)}{measure}</p>'
