#!/usr/bin/env bash
# What DP compute buys on one checking set (docs/defaults.md, "What DP compute buys"): prepares the set, writes
# its runs at 1x-8x the demo's compute with the sizing rule's batch and steps (experiments/compute_table.py
# config, whose options follow the set's name), trains and evaluates them, keeps the comparison as
# results/compute/SET.csv and prints the table and plot.  SET is a set of config/checks/ or `demo` (the demo's
# own records).  Curator-only: every DP training reads the set's private records and is recorded in its
# spent.jsonl.
#   bash experiments/compute_check.sh mnist2k --trainings 2 --only 'dpsad_eps10_x[1248]'
set -euo pipefail
cd "$(dirname "$0")/.."
checking_set="$1"
shift
overlay="config/checks/$checking_set.yaml"
[ "$checking_set" = demo ] && overlay=""
dataset=$(.venv/bin/python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["datasets"][0])' \
    "${overlay:-config/config.yaml}")
make --no-print-directory demo TARGET="results/$dataset/data.h5" ARGS="--configfile config/config.yaml $overlay"
PYTHONPATH=src .venv/bin/python experiments/compute_table.py config "$checking_set" "$@"
make --no-print-directory demo ARGS="--configfile config/config.yaml results/compute/$checking_set.yaml"
cp results/comparison.csv "results/compute/$checking_set.csv"
PYTHONPATH=src .venv/bin/python experiments/compute_table.py table "results/compute/$checking_set.csv" --bench logs \
    --plot "results/compute/$checking_set.png"
