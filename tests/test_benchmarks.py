"""The GPU smoke script keeps working on a CPU machine (tiny size): every stage prints a row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")
def test_gpu_smoke_runs_every_stage_at_tiny_size_without_cuda():
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(["bash", "benchmarks/gpu_smoke.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")}
    stages = ["teacher", "dpdm", "dpsad student (all)", "dpsad discriminator", "moco"]
    for stage in stages:
        assert stage in rows, (stage, out.stdout)
    assert any(name.startswith("dpgan critic") for name in rows) and any(name.startswith("sample ") for name in rows)
    for name, cells in rows.items():
        assert float(cells[2]) > 0, name  # images/s measured
    for name in ["dpdm", "dpsad student (all)", "dpsad discriminator"]:
        assert rows[name][1].strip() == "hooks" and rows[name][4].strip().endswith("x"), name  # DP/non-DP ratio
    assert "no CUDA device" in out.stdout and "config/paper/mnist.yaml" in out.stdout
