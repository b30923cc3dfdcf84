"""What OpenMP's wait policy costs torch jobs that share the cores: the tiny stage run of stage_throughput.py
(two torch threads), alone and as two copies at once, with OpenMP's default wait (a waiting thread spins) and with
OMP_WAIT_POLICY=PASSIVE (it sleeps).  Prints each case's wall seconds and CPU seconds per copy.

The test suite runs more processes than the machine has cores, so tests/conftest.py sets the passive policy for
every process it starts.  Run alone on an otherwise idle machine:

    .venv/bin/python benchmarks/omp_wait_policy.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_copies(copies: int, policy: str | None, threads: int) -> tuple[float, list[float]]:
    """Start ``copies`` tiny stage runs at once; (wall seconds until all ended, CPU seconds of each)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")])
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    command = [sys.executable, str(ROOT / "benchmarks" / "stage_throughput.py"), "--config",
               str(ROOT / "config" / "paper" / "mnist.yaml"), "--tiny", "--threads", str(threads)]
    start = time.monotonic()
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL) for _ in range(copies)]
    cpu = []
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"stage_throughput.py --tiny failed with exit status {proc.returncode}")
        cpu.append(usage.ru_utime + usage.ru_stime)
    return time.monotonic() - start, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each copy (default 2)")
    args = parser.parse_args()
    print(f"stage_throughput.py --tiny, {args.threads} torch threads a copy, {os.cpu_count()} cores")
    print("| wait policy | copies at once | wall s | CPU s per copy |")
    print("|---|---|---|---|")
    for policy in (None, "PASSIVE"):
        for copies in (1, 2):
            wall, cpu = run_copies(copies, policy, args.threads)
            print(f"| {policy or 'default (spin)'} | {copies} | {wall:.1f} | {', '.join(f'{c:.1f}' for c in cpu)} |",
                  flush=True)


if __name__ == "__main__":
    main()
