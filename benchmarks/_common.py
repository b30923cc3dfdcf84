"""Shared helpers for the benchmark scripts."""

from __future__ import annotations

import csv
import resource
import time
from pathlib import Path


def timed(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs."""
    import torch  # here: the scripts that only read tables need no torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def number(value) -> float | None:
    """``value`` as a float, or None for a table cell that holds none ('', '-', 'n/c')."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def job_seconds(logs: Path) -> dict[str, float]:
    """{'<dataset>/<rule>_<wildcards>': wall seconds} of every Snakemake benchmark file (``logs/**/*.bench.tsv``)."""
    out = {}
    for path in sorted(Path(logs).rglob("*.bench.tsv")):
        with path.open() as handle:
            out[str(path.relative_to(logs))[:-len(".bench.tsv")]] = float(next(csv.DictReader(handle, delimiter="\t"))["s"])
    return out
