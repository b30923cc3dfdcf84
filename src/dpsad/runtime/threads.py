"""The threads a job computes with (no torch import: the job runner reads it before any stage loads torch)."""

from __future__ import annotations

import os


def job_threads(snakemake) -> int:
    """The threads a job computes with: Snakemake's ``threads``, or inside a SLURM job the CPUs it was given
    (resources ``cpus_per_task``), whichever is more.  Snakemake caps ``threads`` at the submitting machine's
    cores, which says nothing of a GPU node's; the resource is not capped."""
    threads = int(getattr(snakemake, "threads", 1) or 1)
    if os.environ.get("SLURM_JOB_ID"):
        threads = max(threads, int(getattr(getattr(snakemake, "resources", None), "cpus_per_task", 0) or 0))
    return max(1, threads)
