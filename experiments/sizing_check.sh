#!/usr/bin/env bash
# The checking sets of the dp_sizing rule (docs/defaults.md), each run over the default configuration, then
# their table.  SETS picks some: SETS="mnist2k letters1k" bash experiments/sizing_check.sh
# About 15 minutes a set on a 2-core CPU.  Every DP training here reads the set's private records: the
# curator's record (curator/) keeps each of them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results/checks
for set in ${SETS:-mnist1k_choose mnist2k letters1k}; do
    make --no-print-directory demo ARGS="--configfile config/config.yaml config/checks/$set.yaml"
    cp results/comparison.csv "results/checks/$set.csv"
done
.venv/bin/python experiments/sizing_table.py results/checks/*.csv
