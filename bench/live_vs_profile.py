#!/usr/bin/env python3
"""Does a profile give the summary its run printed? The live `--summary-json` of a run against
`stallscope summary --json` of its profile, field by field, leaving out `profile` and
`profiler_cpu_seconds` (which only the live run knows).

    python3 bench/live_vs_profile.py STALLSCOPE RUN.stallscope RUN.json

(`bench/run_cost.py --keep DIR` leaves both for each run.)
"""
import json
import subprocess
import sys


def diff(x, y, path=""):
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            diff(x.get(k), y.get(k), f"{path}.{k}")
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            diff(u, v, f"{path}[{i}]")
    elif x != y:
        print(f"  {path}: live {x!r} / profile {y!r}")


def main():
    ss, profile, live_json = sys.argv[1:4]
    with open(live_json) as f:
        live = json.load(f)
    out = subprocess.run([ss, "summary", "--json", profile], capture_output=True, text=True,
                         check=True).stdout
    read = json.loads(out)
    for k in ("profile", "profiler_cpu_seconds"):
        live.pop(k, None)
        read.pop(k, None)
    print(profile, "identical" if live == read else "differs:")
    if live != read:
        diff(live, read)
        sys.exit(1)


if __name__ == "__main__":
    main()
