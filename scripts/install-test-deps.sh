#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine: the Debian packages of the
# real test lab (adb server, OpenSSH server, headless Chromium, bubblewrap; busybox and mksh, the shells
# of embedded boards and phones, for the remote-command guard; debootstrap and zstd, which build and cache
# the aarch64 board's arm64 rootfs: its qemu-aarch64 is fetched by the tests themselves, from
# bookworm-backports, never installed system-wide; Mesa's lavapipe and the Vulkan loader, a real Vulkan
# driver on the CPU for the GPU backends: Mesa 25 for LiteRT's WebGPU path is fetched by the tests the same
# way; python3-venv for the OpenVINO venv), edgebench with its dev
# extra, and the PyPI packages that ship the real models the tests measure.
set -euo pipefail

DEBIAN_PACKAGES=(adb openssh-server openssh-client chromium bubblewrap procps iproute2 busybox mksh
    debootstrap zstd mesa-vulkan-drivers libvulkan1 python3-venv)

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python3 -m pip install -q -e ".[dev]"  # includes ai-edge-litert (LiteRT runtime, .tflite schema)
# Real models shipped inside wheels; --no-deps because only the .onnx files are used (their own
# dependencies pull in torch and opencv, which the tests do not need).
python3 -m pip install -q --no-deps "silero-vad==6.2.3" "rapidocr-onnxruntime==1.4.4"
# pnnx's static converter binary (ONNX -> ncnn); --no-deps: its Python side pulls CUDA torch, which the
# binary does not need (edgebench calls the binary, never the package's Python).
python3 -m pip install -q --no-deps "pnnx==20261020"
