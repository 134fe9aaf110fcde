#!/usr/bin/env bash
# Creates the OpenVINO environment: a venv holding numpy and onnxruntime-openvino (onnxruntime built with
# the OpenVINO execution provider, OpenVINO's own libraries inside the wheel). It needs a venv of its own
# because that wheel installs the same `onnxruntime` package as the plain wheel the main environment runs.
# The agent is the standard library plus its runtime, so a `local` device whose `python =` is this venv's
# interpreter runs the agent on OpenVINO:
#     python = "~/.cache/edgebench/openvino-venv/bin/python"   (the path this script prints)
# Idempotent: a venv whose onnxruntime already offers the OpenVINO provider is left as it is (a second
# run takes about a second). Override the folder with EDGEBENCH_OPENVINO_VENV.
set -euo pipefail

VENV="${EDGEBENCH_OPENVINO_VENV:-$HOME/.cache/edgebench/openvino-venv}"
# Pinned like the other lab packages: 1.24.1 bundles OpenVINO 2025.4.1 (its CPU, GPU and NPU plugins)
ORT_OPENVINO="onnxruntime-openvino==1.24.1"
PYTHON="${PYTHON:-python3}"

ready() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$ORT_OPENVINO" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version

import onnxruntime

want = sys.argv[1].split("==")[1]
ok = "OpenVINOExecutionProvider" in onnxruntime.get_available_providers() and version("onnxruntime-openvino") == want
sys.exit(0 if ok else 1)
EOF
}

if ! ready; then
    "$PYTHON" -m venv --clear "$VENV"
    "$VENV/bin/python" -m pip install -q "numpy" "$ORT_OPENVINO"
    ready || { echo "install-openvino-env: $VENV has no OpenVINOExecutionProvider after install" >&2; exit 1; }
fi
echo "$VENV/bin/python"
