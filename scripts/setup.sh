#!/usr/bin/env bash
# Sourced by demo.sh and test.sh: installs the Debian packages stallscope's example and tests
# need, and makes sure a Rust toolchain is on PATH (rustup when cargo is missing).
bash "$(dirname "${BASH_SOURCE[0]}")/install-deps.sh"
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  export PATH="$HOME/.cargo/bin:$PATH"
fi
