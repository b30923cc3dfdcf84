"""Run a workflow stage from a Snakemake script: logging, threads, one-line errors, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from . import __version__
from .errors import DpsadError
from .utils import setup_logging


def run_stage(snakemake, body) -> None:
    """Call ``body(snakemake, log)``; bad input ends the job with its one-line message and exit code 1."""
    log = setup_logging(snakemake.log[0] if snakemake.log else None)
    torch.set_num_threads(max(1, int(getattr(snakemake, "threads", 1) or 1)))
    try:
        body(snakemake, log)
    except (DpsadError, FloatingPointError) as err:
        log.error("%s failed: %s", snakemake.rule, err)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


def code_version() -> str:
    """Package version plus the git commit of the checkout, when there is one."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__
