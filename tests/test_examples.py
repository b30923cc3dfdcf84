"""config/examples/: a user's own labelled images (an image folder, and .npz arrays), each with a separate
public source, class names, a budget and runs.  A tiny copy of both runs here, to their release folders."""

from __future__ import annotations

import pytest

import json

import h5py
import numpy as np
import yaml
from PIL import Image
from test_workflow import ROOT, snakemake, workdir

from dpsad.config import validate_config
from dpsad.synthetic import load_synthetic

CLASSES = ["cat", "dog", "horse"]


def class_images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [3 * count, 20, 20, 3], labels): one colour per class, with noise."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), count)
    colours = np.array([[200, 60, 60], [60, 200, 60], [60, 60, 200]])
    images = colours[labels][:, None, None, :] + rng.integers(-50, 50, (len(labels), 20, 20, 3))
    return np.clip(images, 0, 255).astype(np.uint8), labels


def write_folder(root, count, seed):
    images, labels = class_images(count, seed)
    for index, (image, label) in enumerate(zip(images, labels)):
        folder = root / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{index}.png")


def test_both_examples_are_complete_configs_for_a_gpu_cluster():
    for name in ("imagefolder", "npz"):
        config = validate_config(yaml.safe_load((ROOT / "config" / "examples" / f"{name}.yaml").read_text()))
        (dataset,) = config["datasets"]
        section = config["data"][dataset]
        assert section["public"]["source"] == section["source"] and section["class_names"] == CLASSES
        assert section["privacy_budget"]["epsilon"] == 10.0 and section["release"] == ["public", "dpsad_eps10"]
        assert config["gpus_per_job"] == 1 and {run["method"] for run in config["runs"]} >= {"dpsad", "dpdm", "dpgan"}


@pytest.mark.e2e
def test_a_tiny_copy_of_each_example_runs_to_its_release(tmp_path):
    data = tmp_path / "data"
    write_folder(data / "my_images", 30, 0)
    write_folder(data / "my_public_images", 15, 1)
    data.mkdir(exist_ok=True)
    np.savez(data / "my_images.npz", **dict(zip(("images", "labels"), class_images(30, 2))))
    np.savez(data / "my_public_images.npz", **dict(zip(("images", "labels"), class_images(15, 3))))
    overlay = tmp_path / "tiny_examples.yaml"
    overlay.write_text(yaml.safe_dump({
        "datasets": ["my_images", "my_arrays"],
        "gpus_per_job": 0,
        "data": {
            "my_images": {"root": str(data / "my_images"), "image_size": 16, "public": {"root": str(data / "my_public_images")}},
            "my_arrays": {"path": str(data / "my_images.npz"), "image_size": 16,
                          "public": {"path": str(data / "my_public_images.npz")}},
        },
        "model": {"num_res_blocks": 1, "attention_resolutions": [], "channel_mult": [1, 2], "base_channels": 8, "groups": 4},
    }))
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    snakemake(cwd, "--cores", "2", "--configfile", "config/config.yaml", "config/examples/imagefolder.yaml",
              "config/examples/npz.yaml", "tests/data/tiny.yaml", str(overlay), "--", "release")
    totals = {}
    for dataset, source in (("my_images", "imagefolder"), ("my_arrays", "npz")):
        release = cwd / "release" / dataset
        synthetic = load_synthetic(release / "dpsad_eps10" / "synthetic.h5")
        assert synthetic.class_names == CLASSES and synthetic.attrs["dp_guarantee"] is True
        assert f"from a separate source ({source})" in synthetic.attrs["guarantee_notes"]
        budget = json.loads((release / "BUDGET.json").read_text())
        assert synthetic.attrs["epsilon"] <= 10.0
        totals[dataset] = budget["epsilon"]
        assert (release / "public" / "synthetic.h5").is_file()
        # the checksum of the private files identifies them exactly: it stays in data.h5, out of every release
        with h5py.File(cwd / "results" / dataset / "data.h5") as handle:
            checksum = handle.attrs["source_checksum"]
        assert len(checksum) == 64
        assert not [p for p in release.rglob("*") if p.is_file() and checksum.encode() in p.read_bytes()]
    # each BUDGET.json states every release in the curator's record, whichever records they share: the dataset
    # released second counts the first one's release too
    assert max(totals.values()) > min(totals.values()) >= 9.0
