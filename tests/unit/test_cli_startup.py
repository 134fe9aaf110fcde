"""The command line starts without the heavy libraries: a lab's scripts call `edgebench results`, `gate` and
`--help` many times a night, and each verb imports what it measures or analyses only when it runs."""

from __future__ import annotations

import subprocess
import sys

HEAVY = (
    "numpy",
    "onnx",
    "onnxruntime",
    "scipy",
    "pandas",
    "matplotlib",
    "tenacity",
    "edgebench.execution.oneshot",
    "edgebench.analysis.ceilings",
    "edgebench.analysis.cost",
    "edgebench.probes.decode",
)


def test_building_every_verb_imports_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "from edgebench.cli import build_app\n"
        "build_app()\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "", f"imported while building the command line: {out.stdout.strip()}"
