"""The released synthetic dataset: ``synthetic.h5``, its writer and its reader.

Format (``format_version`` 1):

* ``/images``: uint8, N x H x W x C.
* ``/labels``: int64, N, values in [0, len(class_names)); absent when unconditional.
* root attributes: format, format_version, dataset, method, run, epsilon, delta,
  dp_guarantee, guarantee_notes, accountant, trainings and public_trainings (JSON lists of the uids of the private
  and of the public ledger entries; files written before 0.2.3 and 0.3.2 lack them), class_names (JSON list), created_utc, config_sha256, code_version.  ``epsilon`` is NaN when
  ``dp_guarantee`` is false: no guarantee is claimed.

Readers need only h5py; :func:`load_synthetic` checks the schema first.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass

import h5py
import numpy as np

from .files.artifacts import check_room_for, create_hdf5
from .files.atomic import atomic_path
from .errors import DpsadError
from .privacy.stated import recorded_public_trainings, recorded_trainings, rounded_up

FORMAT = "dpsad-synthetic"
FORMAT_VERSION = 1
REQUIRED_ATTRS = (
    "format", "format_version", "dataset", "method", "run", "epsilon", "delta", "dp_guarantee",
    "guarantee_notes", "accountant", "class_names", "created_utc", "config_sha256", "code_version",
)


@dataclass
class SyntheticData:
    """images uint8 [N,H,W,C]; labels int64 [N] or None; attrs: the root attributes."""

    images: np.ndarray
    labels: np.ndarray | None
    attrs: dict

    @property
    def class_names(self) -> list[str]:
        return json.loads(self.attrs["class_names"])

    def torch_dataset(self):
        """A torch Dataset of (image float [C,H,W] in [0,1], label) pairs (label -1 when unlabelled)."""
        import torch
        from torch.utils.data import TensorDataset

        x = torch.from_numpy(self.images).permute(0, 3, 1, 2).float() / 255.0
        y = torch.from_numpy(self.labels) if self.labels is not None else torch.full((len(x),), -1, dtype=torch.long)
        return TensorDataset(x, y)


def write_synthetic(path, images: np.ndarray, labels: np.ndarray | None, **metadata) -> None:
    """Write ``synthetic.h5`` atomically from arrays in memory (see :func:`write_synthetic_batches`)."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise DpsadError(f"synthetic images: dtype {images.dtype}, shape {images.shape}, expected uint8 N x H x W x C")
    write_synthetic_batches(path, [(images, labels)], total=len(images), image_shape=tuple(images.shape[1:]),
                            labelled=labels is not None, **metadata)


def write_synthetic_batches(path, batches, *, total: int, image_shape: tuple[int, int, int], labelled: bool,
                            dataset: str, method: str, run: str, privacy: dict, class_names: list[str],
                            config_sha256: str, code_version: str) -> None:
    """Stream (images uint8 [b,H,W,C], labels [b] or None) batches into ``synthetic.h5``, atomically.

    Each batch is written as it arrives into chunked, compressed datasets of the
    final size, so memory holds one batch however large ``total`` is.
    ``privacy`` is the account stage's verdict (privacy.json).  Any error, or a
    count other than ``total``, leaves no file behind.
    """
    guarantee = bool(privacy["dp_guarantee"])
    epsilon = privacy.get("epsilon") if guarantee else None
    notes = guarantee_notes(privacy)
    shape = (int(total),) + tuple(int(v) for v in image_shape)
    check_room_for(path, int(np.prod(shape)) + 8 * shape[0] * labelled)
    rows_per_chunk = max(1, min(int(total), 2**20 // max(1, int(np.prod(shape[1:])))))  # about 1 MiB per chunk
    with atomic_path(path) as tmp:
        with create_hdf5(tmp) as handle:
            chunked = {"chunks": (rows_per_chunk,) + shape[1:], "compression": "gzip", "compression_opts": 4} if total else {}
            images_ds = handle.create_dataset("images", shape=shape, dtype="uint8", **chunked)
            labels_ds = handle.create_dataset("labels", shape=(shape[0],), dtype="int64") if labelled else None
            written = 0
            for images, labels in batches:
                images = np.asarray(images)
                if images.dtype != np.uint8 or images.shape[1:] != shape[1:]:
                    raise DpsadError(f"synthetic images: dtype {images.dtype}, shape {images.shape}, "
                                     f"expected uint8 N x {' x '.join(map(str, shape[1:]))}")
                if written + len(images) > total:
                    raise DpsadError(f"synthetic images: more than the {total} announced, expected exactly {total}")
                images_ds[written:written + len(images)] = images
                if labels_ds is not None:
                    labels_ds[written:written + len(images)] = np.asarray(labels, dtype=np.int64)
                written += len(images)
            if written != total:
                raise DpsadError(f"synthetic images: {written} written, expected {total}")
            attrs = handle.attrs
            attrs["format"] = FORMAT
            attrs["format_version"] = FORMAT_VERSION
            attrs["dataset"] = dataset
            attrs["method"] = method
            attrs["run"] = run
            attrs["epsilon"] = float(epsilon) if epsilon is not None else float("nan")
            attrs["delta"] = float(privacy["delta"])
            attrs["dp_guarantee"] = guarantee
            attrs["guarantee_notes"] = notes
            attrs["accountant"] = privacy.get("accountant", "")
            attrs["trainings"] = json.dumps(recorded_trainings(privacy))  # which trainings drew it: checked at release
            attrs["public_trainings"] = json.dumps(recorded_public_trainings(privacy))
            attrs["class_names"] = json.dumps(class_names)
            attrs["created_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            attrs["config_sha256"] = config_sha256
            attrs["code_version"] = code_version


GUARANTEE_ASSUMPTIONS = (
    "A record is one example of the private training split (image and label), and neighbouring datasets differ "
    "by adding or removing one record.",
    "The number of private records n is treated as public.",
    "The public split and its source (used freely, e.g. for the teacher, or a renderer and its fonts) are assumed to "
    "be public knowledge.",
    "Batch sampling and DP noise were drawn from secret seeds (operating-system entropy), not from the configuration.",
    "The accounting assumes exact Gaussian noise: attacks on the noise's floating-point form are not covered.",
    "The guarantee covers the release (this file, privacy.json and the generator weights); the curator's training "
    "logs and evaluation figures are computed without noise and are not released.",
    "The epsilon is this release's alone: releases of the same private records compose, and BUDGET.json beside "
    "the release folder states the total over every release of any of these records, under any dataset name.",
)


def guarantee_notes(privacy: dict) -> str:
    """The ``guarantee_notes`` attribute: the statement and its assumptions, one sentence each."""
    # what the public data was, and any earlier use of the records the curator declared
    trailing = (privacy["public_data"],) if privacy.get("public_data") else ()
    trailing += (privacy["declared_earlier_use"]["note"],) if privacy.get("declared_earlier_use") else ()
    trailing += tuple(privacy.get("test_settings") or ())  # what a test setting left out of the statement
    if not privacy["dp_guarantee"]:
        return " ".join(("NO differential privacy guarantee: " + "; ".join(privacy.get("reasons") or ["see privacy.json"])
                         + ".",) + trailing)
    components = privacy.get("components")
    if components is not None and not any(entry.get("private") for entry in components):
        return " ".join(("No private record was read: the data is independent of the private training split ((0, 0)-DP).",
                         GUARANTEE_ASSUMPTIONS[2]) + trailing)
    statement = (f"({rounded_up(privacy['epsilon'])}, {rounded_up(privacy['delta'], 6)})-DP with respect to the "
                 f"private training split, {privacy['accountant']} accounting.")
    return " ".join((statement,) + GUARANTEE_ASSUMPTIONS + trailing)


def load_synthetic(path) -> SyntheticData:
    """Read and check a ``synthetic.h5``; refuse anything that does not match format version 1."""
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise DpsadError(f"{path}: not a readable HDF5 file ({err})") from err
    with handle:
        attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in handle.attrs.items()}
        if attrs.get("format") != FORMAT:
            raise DpsadError(f"{path}: attribute format = {attrs.get('format')!r}, expected {FORMAT!r}")
        if attrs.get("format_version") != FORMAT_VERSION:
            raise DpsadError(f"{path}: format_version = {attrs.get('format_version')!r}, expected {FORMAT_VERSION}")
        missing = [a for a in REQUIRED_ATTRS if a not in attrs]
        if missing:
            raise DpsadError(f"{path}: missing root attributes {missing}, expected all of {list(REQUIRED_ATTRS)}")
        try:
            class_names = json.loads(attrs["class_names"])
        except (TypeError, ValueError) as err:
            raise DpsadError(f"{path}: attribute class_names = {attrs['class_names']!r} is not JSON, "
                             "expected a JSON list of strings") from err
        if not isinstance(class_names, list):
            raise DpsadError(f"{path}: attribute class_names = {attrs['class_names']!r}, expected a JSON list of strings")
        if "images" not in handle:
            raise DpsadError(f"{path}: no /images dataset, expected uint8 N x H x W x C")
        images = handle["images"]
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise DpsadError(f"{path}: /images has dtype {images.dtype} and shape {images.shape}, expected uint8 N x H x W x C (C = 1 or 3)")
        images = images[()]
        labels = None
        if "labels" in handle:
            labels = handle["labels"][()]
            num_classes = len(class_names)
            if labels.dtype != np.int64 or labels.shape != (images.shape[0],):
                raise DpsadError(f"{path}: /labels has dtype {labels.dtype} and shape {labels.shape}, expected int64 ({images.shape[0]},)")
            if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
                raise DpsadError(f"{path}: labels outside [0, {num_classes}) for {num_classes} class names")
    if bool(attrs["dp_guarantee"]) and not math.isfinite(float(attrs["epsilon"])):
        raise DpsadError(f"{path}: dp_guarantee is true but epsilon is {attrs['epsilon']}, expected a finite number")
    attrs["dp_guarantee"] = bool(attrs["dp_guarantee"])
    return SyntheticData(images=images, labels=labels, attrs=attrs)
