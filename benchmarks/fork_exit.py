"""What a forked child of the tests' job server costs at its end: a process that has imported the job server's
heavy libraries forks children that run a small torch product, then end (a) with ``sys.exit`` (the interpreter's
finalization frees every inherited object, and each free copies a page shared with the parent), (b) the same
after ``gc.freeze()`` in the parent, (c) as tests/forked_exit.py ends them (atexit handlers, then ``os._exit``).

    .venv/bin/python benchmarks/fork_exit.py [--repeats 5]

Prints each way's median CPU seconds a child (user + system, from the parent's RUSAGE_CHILDREN) and wall
seconds from the fork to the parent's wait.  Run it alone.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from forked_exit import run_then_exit  # noqa: E402

# the heaviest of tests/job_server.py's libraries
LIBRARIES = ("torch", "torch._dynamo", "numpy", "scipy.optimize", "dp_accounting", "opacus.grad_sample.conv",
             "sklearn.metrics", "sklearn.cluster", "h5py", "matplotlib.figure")


def small_job() -> None:
    import torch

    (torch.randn(64, 64) @ torch.randn(64, 64)).sum().item()


def end_with_sys_exit() -> None:
    small_job()
    sys.exit(0)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_child(way: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one forked child that ends the given way."""
    if way == "sys.exit after gc.freeze":
        gc.freeze()
    cpu, start = children_cpu(), time.perf_counter()
    pid = os.fork()
    if pid == 0:
        if way == "forked_exit":
            run_then_exit(small_job)
        end_with_sys_exit()
    os.waitpid(pid, 0)
    wall = time.perf_counter() - start
    if way == "sys.exit after gc.freeze":
        gc.unfreeze()
    return children_cpu() - cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for name in LIBRARIES:
        importlib.import_module(name)
    print(f"| a forked child ends by | CPU s (median of {args.repeats}) | wall s |\n|---|---|---|")
    for way in ("sys.exit", "sys.exit after gc.freeze", "forked_exit"):
        runs = [one_child(way) for _ in range(args.repeats)]
        print(f"| {way} | {statistics.median(r[0] for r in runs):.2f} | {statistics.median(r[1] for r in runs):.2f} |")


if __name__ == "__main__":
    main()
