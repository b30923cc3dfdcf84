"""A Private Evolution run's population as a training set: what a teacher with ``split: population`` trains on.

Privacy: the population (``pe.pt``, kind ``pe_population``) is computed from the votes' noisy counts and the run's
generator (public, or a training whose ledger is the run's upstream: a non-DP one makes every verdict downstream
false), so training on it is post-processing of that run's output; its ledger (``pe.ledger.json``) is upstream of
the teacher's and of everything built from the teacher. No private record is read here: the dataset's file gives
only its metadata (class names, image size).
"""

from __future__ import annotations

import numpy as np

from ..data.datafile import PreparedData, Split
from ..errors import DpsadError
from ..files.artifacts import load_torch

POPULATION_SPLIT = "population"


def population_data(checkpoint, data: PreparedData, labels_mode) -> PreparedData:
    """``data``'s metadata with one split, ``population``: the run's images (uint8 [N,H,W,C]) and labels ([N], in
    the run's label space, or None for an unconditional run).  ``labels_mode``: the teacher's label source."""
    state = load_torch(checkpoint, kinds=("pe_population",))
    images, labels = np.asarray(state["images"], dtype=np.uint8), state["labels"]
    wanted = (data.image_size, data.image_size, data.channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != wanted:
        raise DpsadError(f"{checkpoint}: population images of shape {tuple(images.shape)}, expected [N, "
                         f"{', '.join(map(str, wanted))}] as the dataset's")
    conditional = labels_mode is True or labels_mode == "true"
    if conditional and (labels is None or list(state["class_names"]) != list(data.class_names)):
        raise DpsadError(f"{checkpoint}: a population labelled {state['class_names'] if labels is not None else 'not at all'}"
                         f", expected the dataset's classes {data.class_names} for a teacher on labels: true")
    split = Split(images, None if labels is None else np.asarray(labels, dtype=np.int64))
    return PreparedData(splits={POPULATION_SPLIT: split}, class_names=list(data.class_names), labelled=data.labelled,
                        image_size=data.image_size, channels=data.channels, attrs=dict(data.attrs))
