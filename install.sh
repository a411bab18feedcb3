#!/usr/bin/env bash
# Create .venv (if missing) and install cockpit-lite with its demo and test dependencies.
# torch comes first and stays pinned while the rest installs: an unpinned torch, or one
# dragged in by torchvision (a dependency of BackPACK that cockpit-lite never imports),
# would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
$PIP install -q "torch==${TORCH_VERSION}"
constraint="$(mktemp)"
trap 'rm -f "$constraint"' EXIT
echo "torch==${TORCH_VERSION}" > "$constraint"
# the original Cockpit (and Opacus), for the comparison tests and benchmarks; Cockpit needs setuptools<81
# the integrations' extras (Lightning, Hugging Face, TensorBoard) are tested too; the
# constraint keeps lightning and transformers from bringing another torch
$PIP install -q -c "$constraint" -e ".[test,demo,compare,lightning,hf,tensorboard]" "setuptools<81"
# the torchvision wheel BackPACK pulls in is built for another torch and fails to load
# ("operator torchvision::nms does not exist"); cockpit-lite never imports it, but
# torchmetrics (a Lightning dependency) imports it whenever it is installed: remove it then
# (the same one-line remedy docs/install.md gives for an installation without this script)
if $PIP show -q torchvision 2>/dev/null && ! .venv/bin/python -c "import torchvision" 2>/dev/null; then
    echo "install.sh: removing torchvision, it does not load with torch ${TORCH_VERSION} (see docs/install.md)"
    $PIP uninstall -y -q torchvision
fi
