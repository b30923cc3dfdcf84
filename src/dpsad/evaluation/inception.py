"""FID, Inception Score and KID in Inception-v3's space, as the papers report them, by torch-fidelity.

torch-fidelity (not clean-fid) because it computes all three from one pass of the network, takes images from
memory as uint8 tensors, and reads the network's weights from a local file (``feature_extractor_weights_path``)
where clean-fid always downloads its own.  It is the papers' computation: the TensorFlow Inception-v3 of
Heusel et al.'s FID (``inception-v3-compat``), its own bilinear resize of uint8 images to 299 x 299, grey
images repeated to three channels.

``evaluate.inception_weights``: a local weight file (torch-fidelity's format, e.g. its
``weights-inception-2015-12-05`` file), ``download`` (the library's own download, where the network is
there: a cluster), or null: "not computed", and nothing is downloaded.

Privacy: the real images are the test split, read without noise: the figures are the curator's, like every
evaluation figure (not in the release or its card).

The ``inception_figures`` stage computes them for every row of a dataset apart from ``evaluate``, so that giving
weights to a finished workspace trains no classifier again; without weights it is not in the workflow at all.
"""

from __future__ import annotations

import tempfile

import numpy as np
import torch

from ..errors import DpsadError
from .table import NO_INCEPTION_WEIGHTS

DOWNLOAD = "download"
KEYS = ("fid_inception", "is_inception", "is_inception_std", "kid_inception", "kid_inception_std")


class _Images(torch.utils.data.Dataset):
    """uint8 N x H x W x C images as torch-fidelity reads them: uint8 3 x H x W tensors (grey repeated)."""

    def __init__(self, images: np.ndarray):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        image = torch.from_numpy(np.ascontiguousarray(self.images[i])).permute(2, 0, 1)
        return image.expand(3, -1, -1).contiguous() if image.shape[0] == 1 else image


def inception_metrics(real: np.ndarray, fake: np.ndarray, weights: str | None, *, kid_subset: int = 1000,
                      batch_size: int = 64, real_features: str | None = None, cuda: bool | None = None) -> dict:
    """FID of ``fake`` against ``real``, the Inception Score of ``fake`` and KID (uint8 N x H x W x C each, C 1
    or 3) -> the :data:`KEYS` (a "not computed: ..." text each where they cannot be computed).

    ``real_features``: a folder where the features of ``real`` are kept after the first call, for calls that all
    pass the same ``real`` images and weights (the library's own cache, keyed by name, not by content).  ``cuda``:
    on the GPU (None: where there is one)."""
    import torch_fidelity

    if not weights:
        return dict.fromkeys(KEYS, NO_INCEPTION_WEIGHTS)
    path = None if weights == DOWNLOAD else str(weights)
    if path is not None:
        try:
            with open(path, "rb"):
                pass
        except OSError as err:
            raise DpsadError(f"evaluate.inception_weights '{weights}' cannot be read ({err.strerror}), expected a "
                             "torch-fidelity Inception-v3 weight file, 'download' or null") from err
    subset = max(2, min(kid_subset, len(real), len(fake)))
    try:
        found = torch_fidelity.calculate_metrics(
            input1=_Images(fake), input2=_Images(real), batch_size=batch_size,
            cuda=torch.cuda.is_available() if cuda is None else cuda,
            isc=True, fid=True, kid=True, kid_subset_size=subset, feature_extractor_weights_path=path,
            cache=real_features is not None, cache_root=real_features, input2_cache_name="real" if real_features else None,
            save_cpu_ram=True, verbose=False)  # no loader processes: the images are in memory already, and on two
        # cores the library's four workers warned in every log and took 0.3 s more a call for the same features
    except Exception as err:  # noqa: BLE001 - the library's own errors: a refused download, a file of another net
        if path is not None:
            raise DpsadError(f"evaluate.inception_weights '{weights}': torch-fidelity could not compute with it "
                             f"({type(err).__name__}: {err}), expected its Inception-v3 weight file") from err
        return dict.fromkeys(KEYS, f"not computed: the Inception-v3 weights could not be downloaded ({type(err).__name__})")
    return {"fid_inception": float(found["frechet_inception_distance"]),
            "is_inception": float(found["inception_score_mean"]), "is_inception_std": float(found["inception_score_std"]),
            "kid_inception": float(found["kernel_inception_distance_mean"]),
            "kid_inception_std": float(found["kernel_inception_distance_std"])}


def row_figures(test: np.ndarray, train: np.ndarray, synthetic: dict[str, np.ndarray], settings: dict,
                cuda: bool | None = None) -> dict:
    """{row: the :data:`KEYS`} for the ``real`` row (a draw of the private split, as many as the test split) and
    each run of ``synthetic`` ({run: uint8 N x H x W x C}), each against at most ``inception_samples`` images of
    ``test``; the draws use ``settings["seed"]`` as the evaluate stage's real row and subsets did."""
    seed, most = settings["seed"], settings["inception_samples"]
    real_row = train[np.random.default_rng(seed).choice(len(train), min(len(train), len(test)), replace=False)]
    figures = {}
    with tempfile.TemporaryDirectory(prefix="inception-") as test_features:  # the test split's, computed once
        for row, fake in {"real": real_row, **synthetic}.items():
            rng = np.random.default_rng(seed)  # each row: the same subset of the test split, as one stage did
            subset = lambda images: images[np.sort(rng.choice(len(images), most, replace=False))] if len(images) > most else images  # noqa: E731
            figures[row] = inception_metrics(subset(test), subset(fake), settings["inception_weights"],
                                             real_features=test_features, cuda=cuda)
    return figures
