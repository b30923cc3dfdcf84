"""Run a workflow stage from a Snakemake script: logging, threads, one-line errors, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from . import __version__
from .atomic import sweep_temporaries
from .errors import DpsadError
from .utils import setup_logging


def run_stage(snakemake, body) -> None:
    """Call ``body(snakemake, log)``; bad input ends the job with its one-line message and exit code 1."""
    log = setup_logging(snakemake.log[0] if snakemake.log else None)
    torch.set_num_threads(max(1, int(getattr(snakemake, "threads", 1) or 1)))
    log.info("%s: dpsad %s from %s", snakemake.rule, code_version(), Path(__file__).resolve().parent)
    sweep_killed_writes(list(snakemake.output), log)
    try:
        body(snakemake, log)
    except (DpsadError, FloatingPointError) as err:
        log.error("%s failed: %s", snakemake.rule, err)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


def sweep_killed_writes(outputs, log) -> None:
    """Delete temporaries that a killed earlier run of this job left beside its outputs (and resume files)."""
    for output in outputs:
        for path in (output, f"{output}.resume"):
            for tmp in sweep_temporaries(path):
                log.info("removed %s, left by an interrupted run", tmp)


def code_version() -> str:
    """Package version plus the git commit of the checkout, when there is one."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


def optional_input(value) -> str | None:
    """The single path of an optional named input (an empty list when absent, a path or a one-element list)."""
    if not value:
        return None
    if isinstance(value, str):
        return value
    return str(list(value)[0])


def launch_training(snakemake, train_fn, device_name: str) -> None:
    """Run ``train_fn(context, device)`` in ``config.distributed.processes`` processes (one per GPU on CUDA)."""
    from .distributed import launch
    from .utils import resolve_device

    settings = snakemake.config.get("distributed", {}) or {}
    processes = int(settings.get("processes", 1))
    requested = resolve_device(device_name)
    backend = settings.get("backend", "auto")
    if backend == "auto":
        backend = "nccl" if requested.type == "cuda" else "gloo"
    if requested.type == "cuda" and processes > torch.cuda.device_count():
        raise DpsadError(f"distributed.processes = {processes} but only {torch.cuda.device_count()} GPUs are visible")
    launch(_distributed_entry, processes, backend, train_fn, requested)


def _distributed_entry(context, train_fn, requested) -> None:
    from .distributed import device_for

    train_fn(context, device_for(context, requested))
