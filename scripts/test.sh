#!/usr/bin/env bash
# Runs every test of stallscope on a Debian machine: installs what the tests need (Debian's
# python3-torch, iproute2, …), builds, then runs the Rust tests (unit, and end-to-end around
# the real PyTorch example) and the Python marker-package tests. Safe to run twice.
# End-to-end tests that need root (network namespaces) say why they skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/setup.sh

echo "== Rust: unit and end-to-end tests"
# The scripted libnvidia-ml that the NVML end-to-end tests load (profiler/tests/nvml_library.rs).
cargo build --locked -p stallscope-fake-nvml 2>&1
cargo test --workspace --locked 2>&1

echo "== Python: the marker package and the PyTorch hook"
/usr/bin/python3 -m unittest discover -s profiler/python/tests 2>&1
