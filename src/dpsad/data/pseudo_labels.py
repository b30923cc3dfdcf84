"""``labels.h5``, the k-means stage's pseudo-labels: one int64 label per record of every split.

Layout: a group per split (``train``, ``public``, ``test``) with a dataset
``labels``; root attributes ``class_names`` (JSON list), ``fit_split``,
``features`` and ``records_id`` (the preparation of data.h5 they were computed
from, :mod:`dpsad.privacy.books.preparation`).  Written atomically.
"""

from __future__ import annotations

import json

import numpy as np

from ..files.artifacts import create_hdf5, open_hdf5
from ..files.atomic import atomic_path
from ..privacy.books.preparation import RECORDS_ID, check_same_preparation, records_id_of
from .datafile import SPLITS


def write_pseudo_labels(path, labels: dict[str, np.ndarray], class_names: list[str], *, fit_split: str,
                        features: str, ledger_entries: list[dict], data_attrs) -> None:
    """``labels``: {split: int64 [n_split]} for every split in SPLITS; ``ledger_entries``: the k-means stage's own
    (attribute ``ledger``, JSON), which the stages reading the labels check against their upstream ledgers;
    ``data_attrs``: those of the data.h5 the labels were computed from (its preparation is kept)."""
    with atomic_path(path) as tmp:
        with create_hdf5(tmp) as handle:
            for name in SPLITS:
                handle.create_group(name).create_dataset("labels", data=labels[name])
            handle.attrs["class_names"] = json.dumps(class_names)
            handle.attrs["fit_split"] = fit_split
            handle.attrs["features"] = features
            handle.attrs["ledger"] = json.dumps(ledger_entries)
            if records := records_id_of(data_attrs):
                handle.attrs[RECORDS_ID] = records


def read_pseudo_labels(path, data_attrs) -> tuple[dict[str, np.ndarray], list[str]]:
    """({split: labels}, class names) of a ``labels.h5``, refused unless computed from the preparation of the data.h5
    whose attributes are ``data_attrs`` (labels paired with the records they describe)."""
    with open_hdf5(path, "pseudo-label file") as handle:
        check_same_preparation(handle.attrs, data_attrs, path)
        return {name: handle[name]["labels"][()] for name in SPLITS}, json.loads(handle.attrs["class_names"])
