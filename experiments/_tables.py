"""Shared helpers for the experiment scripts: table cells, the seconds of Snakemake's jobs, and the command line of
the scripts that read a dataset's built runs."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def add_built_runs_arguments(parser: argparse.ArgumentParser, runs_help: str) -> None:
    """The dataset, its runs under ``results/<dataset>/``, ``--workspace`` and the ``--config`` overlays."""
    parser.add_argument("dataset", help="a dataset whose results/<dataset>/ holds the runs")
    parser.add_argument("runs", nargs="+", help=runs_help)
    parser.add_argument("--workspace", default=".", help="the directory holding results/")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="an overlay the runs were built with, merged over config/config.yaml; repeated, "
                             "layered in order as --configfile layers them")


def layered_config(parser: argparse.ArgumentParser, overlays: list[str]) -> dict:
    """config/config.yaml with ``overlays`` merged over it in order (not yet validated); a missing file is the
    parser's error."""
    import yaml

    from dpsad.config.stages import deep_merge

    layered = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    for path in overlays:
        if not Path(path).is_file():
            parser.error(f"--config {path}: no such file, expected a configuration file")
        layered = deep_merge(layered, yaml.safe_load(Path(path).read_text()) or {})
    return layered
