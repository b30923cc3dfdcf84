"""Where a job computes: the configured device, GPU checks, and data-parallel processes."""

from __future__ import annotations

import torch

from .errors import DpsadError
from .utils import resolve_device


def job_device(snakemake) -> torch.device:
    """The configured ``device`` (auto: CUDA when present).  Read from the config, not from params: moving a
    run from one device to another must not rerun a DP stage and spend its budget again.

    A job that asked the scheduler for GPUs (resources ``gpu`` > 0) and finds no CUDA stops here: it would
    otherwise train on the CPU until its time limit (a driver too old for the wheel, a wrong partition)."""
    gpus = requested_gpus(snakemake)
    if gpus > 0 and not torch.cuda.is_available():
        raise DpsadError(f"{snakemake.rule} asked for {gpus} GPU(s) but CUDA is not available here (torch "
                         f"{torch.__version__}, built for CUDA {torch.version.cuda}), expected a GPU node whose driver "
                         "supports that CUDA; or set gpus_per_job: 0 to run on the CPU")
    return resolve_device(snakemake.config.get("device", "auto"))


def requested_gpus(snakemake) -> int:
    """The GPUs the job asked the scheduler for: resources ``gpu``, else the count in a ``gres`` like gpu:2."""
    resources = getattr(snakemake, "resources", None)
    gpus = int(getattr(resources, "gpu", 0) or 0)
    gres = str(getattr(resources, "gres", "") or "")
    for part in gres.split(","):
        fields = part.split(":")
        if fields[0] == "gpu":
            gpus = max(gpus, int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1)
    return gpus


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
    gpus = requested_gpus(snakemake)
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
