"""What a training keeps and reads back: the settings digest a checkpoint is resumed under, checkpoint reading,
the loss rows, and the finiteness checks that stop a training with its last good checkpoint kept."""

from __future__ import annotations

import csv
import hashlib
import json
import math

import torch
from torch import nn

from ..files.atomic import atomic_path


def settings_digest(settings: dict) -> str:
    """A stable hash of the settings a checkpoint was trained under (resume only into the same run).

    The workflow's settings carry ``inputs_sha256`` (:func:`dpsad.jobs.stage.stage_settings`): the same run
    means the same settings and inputs of the same content."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def load_checkpoint(path, map_location="cpu", kinds: tuple[str, ...] = ()) -> dict:
    """A checkpoint written by the training loop (of one of ``kinds``, when given); truncated or foreign
    files are one-line errors."""
    from ..files.artifacts import load_torch

    return load_torch(path, map_location=map_location, kinds=kinds)


class LossLog:
    """Rows of (step, name=value, ...) kept in memory (and in resume checkpoints), written as CSV once at the end.

    Writing the CSV only when the stage finishes means a killed job leaves no
    output behind that Snakemake would have to treat as incomplete.
    """

    def __init__(self, rows: list[dict] | None = None):
        self.rows = list(rows or [])

    def add(self, **row) -> None:
        self.rows.append(row)

    def write_csv(self, path) -> None:
        """The rows as CSV; with none (a training shorter than its logging interval), the header ``step`` alone:
        the file is the rule's output, and a missing one failed the job after its DP training had finished, which
        then ran again with new noise."""
        fields = list(dict.fromkeys(k for row in self.rows for k in row)) or ["step"]
        with atomic_path(path) as tmp:
            with open(tmp, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=fields)
                writer.writeheader()
                writer.writerows(self.rows)


def check_finite(value: float, step: int, checkpoint: str) -> None:
    if not math.isfinite(value):
        raise FloatingPointError(
            f"loss became {value} at step {step}, expected a finite loss; stopping. The last good checkpoint is kept "
            f"at {checkpoint} (lower the learning rate or check the data)"
        )


def check_parameters_finite(model: nn.Module, step: int, checkpoint: str) -> None:
    """Stop when a parameter became NaN or infinite.

    Under DP the decision to stop must not depend on a private loss; the
    parameters after a noisy update are already released, so testing them is free.
    """
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            raise FloatingPointError(
                f"parameter {name} became non-finite at step {step}; stopping, expected finite weights. The last good "
                f"checkpoint is kept at {checkpoint} (lower the learning rate)"
            )
