"""Make every job of a workflow run import the ``dpsad`` package of the checkout whose Snakefile runs.

An editable install made from another checkout (a shared ``.venv``) would
otherwise give the jobs that checkout's code while the Snakefile uses its own.
"""

from __future__ import annotations

import os


def use_package_of(src_dir: str) -> None:
    """Put ``src_dir`` first on ``PYTHONPATH``, which local and SLURM jobs inherit from Snakemake."""
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != src_dir]
    os.environ["PYTHONPATH"] = os.pathsep.join([src_dir, *entries])
