#!/usr/bin/env bash
# Runs every test of stallscope on a Debian machine: installs what the tests need (Debian's
# python3-torch 1.13, a pinned torch 2.x from PyPI in stallscope's own venv, iproute2, …),
# builds, then runs the Rust tests (unit, and end-to-end around the real PyTorch example) and
# the Python marker-package tests, the torch ones on both torches. Safe to run twice.
# End-to-end tests that need root (network namespaces) say why they skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/setup.sh
# torch 2.x beside Debian's 1.13 (~3 GB the first time; kept in ~/.cache/stallscope).
TORCH2_PYTHON=$(bash scripts/install-torch2.sh)

echo "== Rust: unit and end-to-end tests"
# The scripted libnvidia-ml that the NVML end-to-end tests load (profiler/tests/nvml_library.rs).
cargo build --locked -p stallscope-fake-nvml 2>&1
cargo test --workspace --locked --no-fail-fast 2>&1

echo "== Rust: the single-node end-to-end tests again, on torch 2.x ($TORCH2_PYTHON)"
STALLSCOPE_TEST_PYTHON="$TORCH2_PYTHON" cargo test --locked --no-fail-fast -p stallscope \
    --test run_single_node --test run_two_local_ranks --test fsdp --test pipeline \
    --test slowdown --test hang --test hang_nodes --test pytorch_examples --test remote_data 2>&1

echo "== Python: the marker package and the PyTorch hook, on Debian's torch 1.13"
/usr/bin/python3 -m unittest discover -s profiler/python/tests 2>&1
echo "== Python: the marker package and the PyTorch hook, on torch 2.x"
"$TORCH2_PYTHON" -m unittest discover -s profiler/python/tests 2>&1
