#!/usr/bin/env bash
# Do `summary`, `advise` and `report` give the same figures from a thinned profile as from the
# whole one? One run recorded with every sample, then written again as the sample flight
# recorder writes by default (collector/examples/thin_profile.rs), and each view diffed.
#
#   bash bench/thinned_figures.sh WHOLE.stallscope [STALLSCOPE]
#
# WHOLE: a run profile written with `stallscope run --keep-all-samples` (or by a build before
# the flight recorder). Prints the sizes and the diffs; only the profile's own path, size and
# frame count may differ.
set -euo pipefail
whole=$1
ss=${2:-target/debug/stallscope}
cargo build -q -p stallscope-collector --example thin_profile
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
target/debug/examples/thin_profile "$whole" "$dir/thin.stallscope"
ls -l "$whole" "$dir/thin.stallscope"
for view in "summary --json" "advise"; do
    echo "== $view"
    # shellcheck disable=SC2086
    diff <($ss $view "$whole" 2>&1 | sed "s|$whole|PROFILE|") \
         <($ss $view "$dir/thin.stallscope" 2>&1 | sed "s|$dir/thin.stallscope|PROFILE|") && echo same
done
echo "== report (JSON)"
$ss report "$whole" -o "$dir/whole.json" >/dev/null
$ss report "$dir/thin.stallscope" -o "$dir/thin.json" >/dev/null
diff <(python3 -m json.tool "$dir/whole.json") <(python3 -m json.tool "$dir/thin.json") || true
