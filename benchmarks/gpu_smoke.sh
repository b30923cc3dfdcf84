#!/usr/bin/env bash
# GPU smoke run: every training stage of the paper configurations (MNIST, Fashion-MNIST, CelebA 64) for a few
# hundred steps, plus sampling of 10,000 images; prints images/s, peak GPU memory, the DP/non-DP step ratio, the
# largest physical batch that fits and the hours of one GPU at the paper schedule, per stage; then the DP step
# of dpsad's engine against Opacus's GradSampleModule on the paper's UNet and one batch (bench_opacus.py).
# On a machine without CUDA the same script runs at a tiny size (seconds), so CI keeps it working.
#   bash benchmarks/gpu_smoke.sh            # STEPS=300 SAMPLES=10000 BATCH=256 by default on CUDA
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="src:benchmarks${PYTHONPATH:+:$PYTHONPATH}"
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    for paper in mnist fashion_mnist celeba64; do  # each stage's hours at the paper schedule, and its largest batch
        "$PYTHON" benchmarks/stage_throughput.py --config "config/paper/$paper.yaml" \
            --steps "${STEPS:-300}" --samples "${SAMPLES:-10000}" --hours --largest-batch
    done
    exec "$PYTHON" benchmarks/bench_opacus.py --paper --batch "${BATCH:-256}"
fi
echo "no CUDA device: tiny CPU run of the same stages (sizes are not the paper's)"
"$PYTHON" benchmarks/stage_throughput.py --config config/paper/mnist.yaml --tiny --hours
exec "$PYTHON" benchmarks/bench_opacus.py --batch 8 --repeats 1 --threads 1
