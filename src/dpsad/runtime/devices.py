"""Where a job computes: the configured device, GPU checks, seeded generators, and data-parallel processes."""

from __future__ import annotations

import logging
import os
import sys

import torch

from .distributed import (WORKER_ENV, SINGLE, LaunchPlan, device_for, end_worker, is_worker, launch_command,
                          run_launcher, worker_context)
from ..errors import DpsadError
from .threads import job_threads


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present, then CPU.  Explicit names are checked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DpsadError(f"device '{name}' requested but CUDA is not available, expected 'auto' or 'cpu' on this machine")
    if name.startswith("cuda:") and int(name.split(":")[1]) >= torch.cuda.device_count():
        raise DpsadError(f"device '{name}' requested but this machine has {torch.cuda.device_count()} CUDA device(s), "
                         "expected 'cuda' or an index below that count")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DpsadError(f"device 'mps' requested but this torch ({torch.__version__}) has no usable MPS (Apple GPU) "
                         "backend here, expected 'auto' or 'cpu' on this machine")
    return torch.device(name)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``seed`` (a configuration's seed: public, never a DP seed)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


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


def launch_plan(snakemake, device: torch.device) -> LaunchPlan:
    """Launchers and processes for the job: one launcher per SLURM task (resources ``tasks``, over ``nodes``),
    each starting one process per GPU it sees on CUDA (``distributed.processes: auto``), else the configured
    number (1 by default on the CPU)."""
    resources = getattr(snakemake, "resources", None)
    tasks = int(getattr(resources, "tasks", 1) or 1)
    nodes = int(getattr(resources, "nodes", 1) or 1)
    agents = max(tasks, nodes)
    setting = (snakemake.config.get("distributed", {}) or {}).get("processes", "auto")
    gpus = requested_gpus(snakemake)
    if setting in (None, "auto"):
        per_agent = max(1, gpus // agents) if device.type == "cuda" else 1
    else:
        per_agent = int(setting)
    return LaunchPlan(agents=agents, processes_per_agent=per_agent, nodes=nodes)


def launch_training(snakemake, train_fn) -> None:
    """Run ``train_fn(context, device)``: in this process, or in the processes of torch's launcher (one per GPU).

    In a launched process (:func:`dpsad.runtime.distributed.is_worker`) this trains and ends the process: the job's own
    process, which waits for the launcher, writes everything after the training (plots, spending records)."""
    if is_worker():
        context = worker_context()
        try:
            train_fn(context, device_for(context, job_device(snakemake)))
            context.barrier()  # no process tears its connections down while another still reads from them
        finally:
            end_worker()
        raise SystemExit(0)
    requested = job_device(snakemake)
    plan = launch_plan(snakemake, requested)
    if plan.world_size <= 1:
        train_fn(SINGLE, requested)
        return
    if requested.type == "cuda" and plan.processes_per_agent > torch.cuda.device_count():
        raise DpsadError(f"{plan.processes_per_agent} processes per launcher but only {torch.cuda.device_count()} GPUs "
                         "are visible, expected one GPU per process (distributed.processes or the gpu resource)")
    backend = (snakemake.config.get("distributed", {}) or {}).get("backend", "auto")
    if backend == "auto":
        backend = "nccl" if requested.type == "cuda" else "gloo"
    threads = max(1, job_threads(snakemake) // plan.processes_per_agent)
    env = {**os.environ, WORKER_ENV: backend, "OMP_NUM_THREADS": str(threads)}
    slurm_job = os.environ.get("SLURM_JOB_ID")
    try:
        command = launch_command(plan, [sys.argv[0]], slurm_job=slurm_job,
                                 run_id=f"dpsad-{slurm_job}-{os.getpid()}")
    except ValueError as err:
        raise DpsadError(f"{snakemake.rule}: {err}") from err
    logging.getLogger("dpsad").info("%d training processes (%d launcher(s) of %d): %s", plan.world_size, plan.agents,
                                    plan.processes_per_agent, " ".join(command))
    code = run_launcher(command, env)
    if code != 0:
        raise DpsadError(f"{snakemake.rule}: the {plan.world_size} training processes ended with exit code {code}, "
                         "expected 0 (their errors are above, in the job's output)")
