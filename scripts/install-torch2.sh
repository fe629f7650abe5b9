#!/usr/bin/env bash
# Installs a pinned torch 2.x from the Python package registry into a virtual environment of
# stallscope's own, beside Debian's torch 1.13: the end-to-end tests and the hook's tests run
# on both. Prints the environment's python on its last line.
#
# PyPI's default torch wheel is the CUDA build: it imports and runs on a CPU-only machine
# (torch.cuda.is_available() is False) once its nvidia-* dependencies are installed (about
# 3 GB). torchvision must be the matching release (0.24.1 for torch 2.9.1): Debian's
# torchvision under torch 2.x aborts with `std::system_error: Invalid argument`, so the venv
# does not see Debian's packages.
#
# Idempotent: an environment that already imports the pinned versions is left as it is.
#
# usage: scripts/install-torch2.sh [VENV]   (default $STALLSCOPE_TORCH2_VENV, else
#        ~/.cache/stallscope/torch-2.9.1)
set -euo pipefail

TORCH_VERSION=2.9.1
TORCHVISION_VERSION=0.24.1
VENV=${1:-${STALLSCOPE_TORCH2_VENV:-$HOME/.cache/stallscope/torch-$TORCH_VERSION}}

say() { echo "install-torch2: $*" >&2; }

have_pinned() {
    [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$TORCH_VERSION" "$TORCHVISION_VERSION" <<'EOF' 2>/dev/null
import sys
import torch, torchvision
ok = torch.__version__.split("+")[0] == sys.argv[1] and torchvision.__version__.split("+")[0] == sys.argv[2]
sys.exit(0 if ok else 1)
EOF
}

if have_pinned; then
    say "torch $TORCH_VERSION and torchvision $TORCHVISION_VERSION already in $VENV"
else
    # venv needs Debian's python3-venv (ensurepip).
    if ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
        bash "$(dirname "${BASH_SOURCE[0]}")/install-deps.sh" python3-venv >&2
    fi
    say "creating $VENV (torch $TORCH_VERSION, torchvision $TORCHVISION_VERSION; ~3 GB to download)"
    mkdir -p "$(dirname "$VENV")"
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" numpy pillow >&2
    have_pinned || { say "torch $TORCH_VERSION does not import from $VENV"; exit 1; }
fi
echo "$VENV/bin/python"
