#!/usr/bin/env bash
# CI's time on this machine: each given revision (default HEAD) cloned fresh into a temporary folder and run as
# CI runs it (`CI=true bash .ci/run`, install included), one after the other; prints the seconds and the
# machine's busy and idle core-seconds (from /proc/stat) of each.  Run it alone, beside the machine reference
# (stage_throughput.py).  REVS="HEAD e38de9b" bash benchmarks/ci_time.sh   (each clone installs with an empty uv
# cache of its own, as on a fresh machine; KEEP_UV_CACHE=1 uses yours)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cpu() { read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
        echo "$((user + nice + system + irq + softirq + steal)) $((idle + iowait))"; }
for rev in ${REVS:-HEAD}; do
    work="$(mktemp -d)"
    git clone -q "$repo" "$work/ci" && git -C "$work/ci" checkout -q "$rev"
    [ -n "${KEEP_UV_CACHE:-}" ] || export UV_CACHE_DIR="$work/uv-cache"
    read -r busy0 idle0 < <(cpu); start=$(date +%s.%N)
    status=0; (cd "$work/ci" && CI=true bash .ci/run > "$work/ci.log" 2>&1) || status=$?
    end=$(date +%s.%N); read -r busy1 idle1 < <(cpu)
    summary="$(grep -E '^=+ .*(passed|failed).* in ' "$work/ci.log" | tail -1 | tr -d '=')"
    printf '%s: exit %s, %.1f s in all; busy %d core-s, idle %d core-s;%s (log: %s)\n' "$rev" "$status" \
        "$(awk "BEGIN {print $end - $start}")" $(((busy1 - busy0) / 100)) $(((idle1 - idle0) / 100)) "$summary" "$work/ci.log"
    rm -rf "$work/ci" "$work/uv-cache"
done
