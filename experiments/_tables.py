"""Shared helpers for the experiment scripts: table cells and the seconds of Snakemake's jobs."""

from __future__ import annotations

import csv
from pathlib import Path


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
