#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs the example DDP training (2 ranks, gloo on CPU)
# under stallscope: installs Debian's python3-torch and friends, builds stallscope, runs.
# Safe to run twice. Extra arguments go to the example (e.g. --workers 0 --data-delay-ms 20).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/setup.sh
cargo build --release --locked -p stallscope

exec target/release/stallscope run --summary-json stallscope-demo-summary.json \
  -o stallscope-demo.stallscope -- \
  /usr/bin/python3 examples/pytorch_ddp/train.py --nproc 2 --iters 60 "$@"
