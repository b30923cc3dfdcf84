"""Open the files the stages pass to each other, with one-line errors that name the file and its maker.

A truncated or foreign file (a killed copy, a file from elsewhere) must not
surface as a bare ``OSError`` from h5py or torch: the message names the path,
what was expected, and the rule that writes it, so the user knows what to rerun.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
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
    ("pe.pt", "train_pe"),
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


def check_room_for(path, nbytes: int) -> None:
    """Refuse to start a write of up to ``nbytes`` (its uncompressed size) that the disk or the file-size limit
    cannot hold: libhdf5 can crash (SIGSEGV) on the close after a failed write, instead of raising."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    needed = int(nbytes * 1.05) + 2**20  # HDF5's own structures and attributes
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise DpsadError(f"disk full at {path}: {free / 2**20:.1f} MiB free, expected up to {needed / 2**20:.1f} MiB")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < needed:
        raise DpsadError(f"disk full at {path}: the file-size limit (ulimit -f) is {limit / 2**20:.1f} MiB, "
                         f"expected up to {needed / 2**20:.1f} MiB")


# What h5py says (as RuntimeError or errno-less OSError, often while closing) when a write runs out of room.
HDF5_WRITE_FAULTS = ((errno.EFBIG, "File too large"), (errno.ENOSPC, "No space left"), (errno.EDQUOT, "quota exceeded"))


@contextlib.contextmanager
def create_hdf5(path):
    """``h5py.File(path, 'w')``; a full disk or a file-size limit while writing or closing it is raised as an
    ``OSError`` with its errno and no file name (``path`` is a temporary: the stage names its outputs instead),
    which the stage reports in one line (:mod:`dpsad.jobs.stage`)."""
    import sys

    import h5py

    def fault(err) -> int | None:
        return next((code for code, words in HDF5_WRITE_FAULTS if words.lower() in str(err).lower()), None)

    # h5py also reports the fault from its objects' finalisers ("Exception ignored in ... __dealloc__"), a
    # traceback each: those are the same fault, said once below.
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None if fault(unraisable.exc_value) else hook(unraisable)
    try:
        with h5py.File(path, "w") as handle:
            yield handle
    except (RuntimeError, OSError) as err:
        code = fault(err)
        if code is not None:
            raise OSError(code, os.strerror(code)) from None
        raise
    finally:
        sys.unraisablehook = hook


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


def load_torch(path, map_location="cpu", kinds: tuple[str, ...] = ()) -> dict:
    """``torch.load`` of a dpsad checkpoint, with a clear error for truncated or foreign files; ``kinds``: the
    checkpoint kinds the reader accepts (any when empty)."""
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
    if kinds and state.get("kind") not in kinds:
        raise DpsadError(f"{path}: a checkpoint of kind {state.get('kind')!r}, expected one of {list(kinds)} written "
                         f"by {writer_of(path)}; delete it and rerun that rule")
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
    "pe_population": ("images", "labels", "class_names", "settings", "plan"),
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
