#!/usr/bin/env bash
# Download the pure-Python wheels that experiments/gpu_check.py installs on a GPU machine without
# network access (BackPACK, Cockpit, Opacus and those of their requirements that such a machine may
# lack) into DEST (default: .wheels, ignored by git), and check that they are small enough to travel
# with the working tree (MAX_KIB, default 8192 KiB).
#
#   bash experiments/gpu_wheels.sh [DEST]        # PYTHON=... to choose the interpreter whose pip runs
#
# The versions are those the test suite runs with; the wheels are py3-none-any, so the Python and
# platform of the GPU machine do not matter (3.12 and manylinux x86-64 are named because pip needs a
# target to download for).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DEST=${1:-.wheels}
MAX_KIB=${MAX_KIB:-8192}
WHEELS=(backpack-for-pytorch==1.7.1 cockpit-for-pytorch==1.0.2 opacus==1.6.0 unfoldNd==0.2.3
        json-tricks==3.17.3 einops==0.8.2)
mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --dest "$DEST" "${WHEELS[@]}"
size=$(du -sk "$DEST" | cut -f1)
ls -l "$DEST"
echo "$DEST: ${size} KiB"
if [ "$size" -gt "$MAX_KIB" ]; then
    echo "more than ${MAX_KIB} KiB: too large to travel with the working tree" >&2
    exit 1
fi
