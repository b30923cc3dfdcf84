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
        record_stage_spending(snakemake, log)
    except (DpsadError, FloatingPointError) as err:
        log.error("%s failed: %s", snakemake.rule, err)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except BaseException as err:
        # Anything else (CUDA out of memory, a bug, a kill) goes to the rule's log with its traceback,
        # where Snakemake's --show-failed-logs and the SLURM job's log point, and still fails the job.
        if not isinstance(err, SystemExit) or err.code not in (0, None):
            log.exception("%s failed with %s", snakemake.rule, type(err).__name__)
        raise


def record_stage_spending(snakemake, log) -> None:
    """Append the private entries of the stage's ledger output (if any) to results/<dataset>/spent.jsonl."""
    ledger = getattr(snakemake.output, "ledger", None)
    dataset = getattr(getattr(snakemake, "wildcards", None), "dataset", None)
    if not ledger or not dataset or not Path(ledger).is_file():
        return
    from .privacy.ledger import read_ledgers
    from .privacy.spending import record_spending

    added = record_spending(Path("results") / dataset, read_ledgers([ledger]), source=f"{snakemake.rule}: {ledger}")
    if added:
        log.info("recorded %d use(s) of the private records in results/%s/spent.jsonl", added, dataset)


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


def stage_settings(snakemake) -> dict:
    """The rule's ``params.settings`` plus its execution-only keys (checkpoint_every), read from the config:
    those are not params, so changing them does not rerun the stage."""
    from .config import deep_merge, execution_settings

    return deep_merge(snakemake.params.settings, execution_settings(snakemake.config, snakemake.rule, snakemake.wildcards))


def job_device(snakemake) -> torch.device:
    """The configured ``device`` (auto: CUDA when present).  Read from the config, not from params: moving a
    run from one device to another must not rerun a DP stage and spend its budget again."""
    from .utils import resolve_device

    return resolve_device(snakemake.config.get("device", "auto"))


def training_processes(setting, device: torch.device, gpus_requested: int) -> int:
    """Processes for data-parallel training: ``auto`` is one per GPU the job asked the scheduler for
    (resources ``gpu``) on CUDA, else 1; an integer is taken as it is."""
    if setting in (None, "auto"):
        return max(1, int(gpus_requested or 0)) if device.type == "cuda" else 1
    return int(setting)


def launch_training(snakemake, train_fn) -> None:
    """Run ``train_fn(context, device)`` in ``distributed.processes`` processes (one per GPU on CUDA)."""
    from .distributed import launch

    settings = snakemake.config.get("distributed", {}) or {}
    requested = job_device(snakemake)
    gpus = getattr(snakemake.resources, "gpu", 0) if hasattr(snakemake, "resources") else 0
    processes = training_processes(settings.get("processes", "auto"), requested, gpus)
    backend = settings.get("backend", "auto")
    if backend == "auto":
        backend = "nccl" if requested.type == "cuda" else "gloo"
    if requested.type == "cuda" and processes > torch.cuda.device_count():
        raise DpsadError(f"distributed.processes = {processes} but only {torch.cuda.device_count()} GPUs are visible")
    launch(_distributed_entry, processes, backend, train_fn, requested)


def _distributed_entry(context, train_fn, requested) -> None:
    from .distributed import device_for

    train_fn(context, device_for(context, requested))
