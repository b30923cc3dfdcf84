"""Open the files the stages pass to each other, with one-line errors that name the file and its maker.

A truncated or foreign file (a killed copy, a file from elsewhere) must not
surface as a bare ``OSError`` from h5py or torch: the message names the path,
what was expected, and the rule that writes it, so the user knows what to rerun.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..errors import DpsadError

# File name -> the rule that writes it (the first match wins).
WRITERS = (
    ("data.h5", "prepare_data"),
    ("features.h5", "extract_features"),
    ("labels.h5", "kmeans_labels"),
    ("synthetic.h5", "sample"),
    ("student.pt", "distill_student"),
    ("dpdm.pt", "train_dpdm"),
    ("dpgan.pt", "train_dpgan"),
    ("encoder.pt", "train_moco"),
    ("evaluator.pt", "train_evaluator"),
    ("generator.pt", "release"),
    ("privacy.json", "account"),
    ("metrics.json", "evaluate"),
    ("BUDGET.json", "release_budget"),
)


def writer_of(path) -> str:
    """The rule that writes ``path`` (teacher checkpoints: train_teacher)."""
    name = Path(str(path).removesuffix(".resume")).name
    for file_name, rule in WRITERS:
        if name == file_name:
            return rule
    if Path(path).parent.name == "teacher":
        return "train_teacher"
    return "the stage that wrote it"


def _unreadable(path, what: str, err: Exception) -> DpsadError:
    return DpsadError(f"{path}: not a readable {what} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}), "
                      f"expected the output of {writer_of(path)}; delete it and rerun that rule")


@contextlib.contextmanager
def open_hdf5(path, what: str = "dpsad HDF5 file"):
    """``h5py.File(path, 'r')`` with a clear error for missing, truncated or foreign files."""
    import h5py

    try:
        handle = h5py.File(path, "r")
    except (OSError, ValueError) as err:
        raise _unreadable(path, what, err) from err
    with handle:
        try:
            yield handle
        except KeyError as err:
            raise DpsadError(f"{path}: missing {err} in this {what}, expected the output of {writer_of(path)}; "
                             "delete it and rerun that rule") from err


def read_json(path, what: str = "dpsad JSON file") -> dict:
    """A stage's JSON output as a dict, with a clear error for missing, truncated or foreign files."""
    import json

    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise _unreadable(path, what, err) from err
    if not isinstance(value, dict):
        raise DpsadError(f"{path}: holds a JSON {type(value).__name__}, expected a {what} (an object) written by "
                         f"{writer_of(path)}")
    return value


def load_torch(path, map_location="cpu") -> dict:
    """``torch.load`` of a dpsad checkpoint, with a clear error for truncated or foreign files."""
    import pickle
    import zipfile

    import torch

    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as err:
        raise _unreadable(path, "dpsad checkpoint", err) from err
    if not isinstance(state, dict):
        raise DpsadError(f"{path}: holds a {type(state).__name__}, expected a dpsad checkpoint (a dict) written by "
                         f"{writer_of(path)}")
    missing = [key for key in CHECKPOINT_KEYS.get(state.get("kind"), ()) if key not in state]
    if missing:
        raise DpsadError(f"{path}: a {state['kind']} checkpoint without {missing}, expected the output of "
                         f"{writer_of(path)}; delete it and rerun that rule")
    return state


# What the readers of each kind of training checkpoint use (kind -> keys).
CHECKPOINT_KEYS = {
    "diffusion_model": ("model_config", "diffusion_config", "model", "ema", "settings", "step"),
    "dpsad_student": ("model_config", "diffusion_config", "model", "ema", "settings", "step"),
    "dpgan": ("gan_config", "generator", "critic", "settings", "step"),
}


def save_torch(state, path) -> None:
    """``torch.save`` to ``path`` through a temporary (complete or absent), a failed write as one line.

    torch's zip writer reports a full disk or a file-size limit as a RuntimeError ("unexpected pos",
    "iostream error"), not as an OSError with the file's name."""
    import torch

    from .atomic import atomic_path

    with atomic_path(path) as tmp:
        try:
            torch.save(state, tmp)
        except RuntimeError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DpsadError(f"writing {path} failed ({first[:120]}): the disk is full or a file-size limit "
                             "(ulimit -f) was reached, expected free space there") from None
