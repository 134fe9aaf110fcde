"""The OpenVINO environment the tests run onnxruntime's OpenVINO execution provider in: a venv of
onnxruntime-openvino (which replaces the plain onnxruntime package, so it cannot live beside it), made by
scripts/install-openvino-env.sh from PyPI on the first call and reused after."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-openvino-env.sh"


def openvino_python(timeout: float = 1200) -> str:
    """The venv's python; an AssertionError with the script's last output when it could not be made."""
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]
