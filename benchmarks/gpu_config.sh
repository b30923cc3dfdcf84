#!/usr/bin/env bash
# The GPU configuration (config/gpu/mnist28.yaml) end to end in a workspace of its own, then its figures: the
# comparison table, each job's seconds (logs/**/*.bench.tsv), the GPU and the torch that ran it.
#   bash benchmarks/gpu_config.sh [WORKSPACE [OVERLAY.yaml ...]]   # WORKSPACE defaults to ../dpsad-gpu; overlays
# (absolute paths) are merged over the configuration, in order
# Training jobs ask for 8 threads; CORES (default 32) lets four of them share one GPU at a time.
# LIMIT (seconds, default none) stops Snakemake there; what finished is still summarised.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work="${1:-../dpsad-gpu}"
shift || true
PYTHON="${PYTHON:-.venv/bin/python}"
case "$PYTHON" in /*) ;; */*) PYTHON="$root/$PYTHON" ;; esac
mkdir -p "$work"
for entry in Snakefile workflow config profiles src; do ln -sfn "$root/$entry" "$work/$entry"; done
cd "$work"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "| device:",
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (no CUDA)")'
# a run stopped from outside (a time limit, a lost machine) leaves Snakemake's lock: cleared as `make demo` does
"$PYTHON" -m dpsad.jobs.preflight || exit 1
start=$(date +%s)
${LIMIT:+timeout "$LIMIT"} "$PYTHON" -m snakemake all --cores "${CORES:-32}" --configfile config/gpu/mnist28.yaml "$@"
status=$?
echo "snakemake exit $status after $(( $(date +%s) - start )) s of wall time"
PYTHONPATH="$root/experiments:$PYTHONPATH" "$PYTHON" - <<'PY'
from _tables import job_seconds
seconds = job_seconds("logs")
for job, spent in sorted(seconds.items(), key=lambda item: -item[1]):
    print(f"{spent:9.1f} s  {job}")
print(f"{sum(seconds.values()):9.1f} s  of job time in {len(seconds)} jobs")
PY
cat results/comparison.md 2>/dev/null || echo "no comparison table (the run did not finish)"
exit $status
