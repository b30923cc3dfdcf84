#!/usr/bin/env bash
# GPU smoke run: every training stage of config/paper/mnist.yaml for a few hundred steps, plus sampling
# of 10,000 images; prints images/s, peak GPU memory and the DP/non-DP step ratio per stage.
# On a machine without CUDA the same script runs at a tiny size (seconds), so CI keeps it working.
#   bash benchmarks/gpu_smoke.sh            # STEPS=300 SAMPLES=10000 by default on CUDA
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="src:benchmarks${PYTHONPATH:+:$PYTHONPATH}"
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    exec "$PYTHON" benchmarks/stage_throughput.py --config config/paper/mnist.yaml \
        --steps "${STEPS:-300}" --samples "${SAMPLES:-10000}"
fi
echo "no CUDA device: tiny CPU run of the same stages (sizes are not the paper's)"
exec "$PYTHON" benchmarks/stage_throughput.py --config config/paper/mnist.yaml --tiny
