"""The prepared dataset file ``results/{dataset}/data.h5``.

Layout: groups ``train`` (the private split), ``public`` and ``test``, each with
``images`` (uint8, N x H x W x C) and, for labelled data, ``labels`` (int64, N).
``train`` and ``public`` also hold ``record_digests``, ``canonical_digests``, ``source_digests``
(uint8 N x 16 each, :mod:`dpsad.privacy.books.image_digests`) and ``near_copy_digests`` (:mod:`dpsad.data.near_copies`).
Root attributes: source, source_checksum, dataset, class_names, image_size, channels,
n_train / n_public / n_test, seed, the split fractions, the fingerprints of the
private and public record sets (``private_records_sha256``, ``public_records_sha256``)
and ``duplicates_removed`` (:mod:`dpsad.data.duplicates`; curator-only).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np

from ..files.artifacts import check_room_for, create_hdf5, open_hdf5
from ..files.atomic import atomic_path
from ..errors import DpsadError
from .bundled_uses import bundled_among
from .raw import RawDataset, apply_image_size, validate
from ..privacy.accounting import delta_problem
from ..privacy.books.image_digests import (CANONICAL_DIGESTS, DIGESTS, SOURCE_DIGESTS, canonical_digests, identity_digests,
                               record_digests, set_fingerprint)
from ..privacy.books.preparation import RECORDS_ID, new_records_id
from .duplicates import RemovedDuplicates, first_copies, rows_not_in
from .near_copies import hash_digests, near

NEAR_COPY_DIGESTS = "near_copy_digests"
WITHOUT_BUNDLED_KEY = "without_bundled_digits"  # data.<name>: leave the bundled MNIST-5k digits out of the private split
from .sources import load_source
from .splits import SplitFractions, stratified_partition

SPLITS = ("train", "public", "test")
RECORD_SETS = {"train": "private_records_sha256", "public": "public_records_sha256"}  # group -> fingerprint attribute
SPLIT_ALIASES = {"private": "train"}  # configs say "private"; the file's group is "train"


def split_group(name: str) -> str:
    """The data.h5 group holding a split named in a config (``private`` -> ``train``)."""
    return SPLIT_ALIASES.get(name, name)


@dataclass
class Split:
    """One split in memory: images uint8 N x H x W x C, labels int64 N or None; ``source_digests`` uint8 N x 16
    (each image as read from its source, :mod:`dpsad.privacy.books.image_digests`) or None where not kept."""

    images: np.ndarray
    labels: np.ndarray | None
    source_digests: np.ndarray | None = None
    stored_digests: np.ndarray | None = None  # canonical digests of the images as stored, once computed
    hashes: np.ndarray | None = None  # perceptual hashes as read, uint64 N x 5 (dpsad.data.near_copies)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def canonical_digests(self) -> np.ndarray:
        """The canonical digest of each image as stored (uint8 N x 16), computed once."""
        if self.stored_digests is None:
            self.stored_digests = canonical_digests(self.images)
        return self.stored_digests


def split_raw(raw: RawDataset, fractions: SplitFractions, seed: int) -> dict[str, Split]:
    """Split a validated RawDataset into private ``train``, ``public`` and ``test``."""
    has_test = raw.test_images is not None
    fractions.check(has_test)
    images, labels = raw.images, raw.labels
    if has_test:
        test = Split(raw.test_images, raw.test_labels, raw.test_digests, hashes=raw.test_hashes)
        pool = np.arange(len(images))
    else:
        test_idx, pool = stratified_partition(labels, len(images), [fractions.test, 1.0 - fractions.test], seed)
        test = Split(images[test_idx], None if labels is None else labels[test_idx],
                     hashes=None if raw.hashes is None else raw.hashes[test_idx])
    pool_labels = None if labels is None else labels[pool]
    public_rel, private_rel = stratified_partition(pool_labels, len(pool), [fractions.public, fractions.private], seed + 1)
    public_idx, private_idx = pool[public_rel], pool[private_rel]
    if len(private_idx) == 0:
        raise DpsadError("the private split is empty: raise private_fraction or provide more images")
    if len(test) == 0:
        raise DpsadError("the test split is empty: raise test_fraction or provide more images")
    digests, stored, hashes = raw.source_digests, raw.stored_digests, raw.hashes
    take = lambda idx: Split(images[idx], None if labels is None else labels[idx],  # noqa: E731
                             None if digests is None else digests[idx], None if stored is None else stored[idx],
                             None if hashes is None else hashes[idx])
    return {"train": take(private_idx), "public": take(public_idx), "test": test}


PUBLIC_FORMS = ("separate_source", "fraction_of_source")


def source_label(cfg: dict) -> str:
    """How messages name a source: its kind, and its file or folder when it has one."""
    where = cfg.get("path") or cfg.get("root")
    return f"{cfg.get('source', '?')} '{where}'" if where else str(cfg.get("source", "?"))


def public_form(cfg: dict) -> str:
    """``separate_source`` when the dataset names its own ``public`` source, else ``fraction_of_source``."""
    return PUBLIC_FORMS[0] if cfg.get("public") else PUBLIC_FORMS[1]


def load_public(cfg: dict, raw: RawDataset) -> Split:
    """The whole of the dataset's separate public source, checked against the private data.

    Same image shape, and the same label set when both are labelled; a label set the public source fixes
    (its configured class names) makes the private data's label set public too.  Labels of a
    public source are dropped when the private data is unlabelled; an unlabelled
    public source beside labelled private data is an error (the labelled teacher
    would have nothing to learn from).  A public source's own test split is unused.
    """
    public_cfg = cfg["public"]
    what = f"public source '{public_cfg.get('source')}'"
    # The public source takes the private data's image_size unless it sets its own.
    public = apply_image_size(validate(load_source(public_cfg), what), public_cfg.get("image_size") or cfg.get("image_size"))
    if public.images.shape[1:] != raw.images.shape[1:]:
        raise DpsadError(f"{what}: images of shape {public.images.shape[1:]}, expected {raw.images.shape[1:]} like the "
                         "private data (set image_size or channels on the public source)")
    if raw.labels is None:
        return Split(public.images, None, public.source_digests, hashes=public.hashes)
    if public.labels is None:
        raise DpsadError(f"{what}: no labels, expected labelled public images like the labelled private data "
                         "(or set unlabelled: true on the dataset)")
    if list(public.class_names) != list(raw.class_names):
        raise DpsadError(f"{what}: class names {public.class_names}, expected the private data's {raw.class_names}")
    if not public.label_set_from_data:
        # The public source fixes the label set, and the private labels were checked to fit it: it is public.
        raw.label_set_from_data = False
    return Split(public.images, public.labels, public.source_digests, hashes=public.hashes)


def prepare(cfg: dict, dataset: str, out_path: str, deltas: dict[str, float] | None = None,
            source_checksum: str | None = None) -> dict[str, Split]:
    """Read the configured source(s), split and write ``data.h5`` atomically.

    With a separate ``public`` source, the dataset's own source gives only the
    test and private splits (``public_fraction`` is not used) and the public
    split is the whole public source.  ``deltas`` maps run names to their delta;
    each must be below 1/n for the n private records, checked here so a bad
    delta stops the workflow before any model trains.
    """
    raw = apply_image_size(validate(load_source(cfg), source_label(cfg)), cfg.get("image_size"))
    repeated, near_repeated = keep_first_copies(raw)
    separate = public_form(cfg) == "separate_source"
    fractions = SplitFractions(
        test=float(cfg.get("test_fraction", 0.2)),
        public=0.0 if separate else float(cfg.get("public_fraction", 0.1)),
        private=float(cfg.get("private_fraction", 0.9)),
    )
    seed = int(cfg.get("seed", 0))
    splits = split_raw(raw, fractions, seed)
    in_public = near_public = 0
    if separate:
        splits["public"] = load_public(cfg, raw)
        splits["train"], (in_public, near_public) = without_images_of(splits["train"], splits["public"])
        if len(splits["train"]) == 0:
            raise DpsadError(f"data.{dataset}: every private image is also in the public source "
                             f"{source_label(cfg['public'])}, expected private images the public source does not hold")
    bundled = 0
    if cfg.get(WITHOUT_BUNDLED_KEY):
        splits["train"], bundled = without_bundled_digits(splits["train"])
        if len(splits["train"]) == 0:
            raise DpsadError(f"data.{dataset}: every private image is a bundled MNIST-5k digit ({WITHOUT_BUNDLED_KEY}: "
                             "true), expected private images of other records")
    test_like_private = near_test = 0
    if raw.test_images is not None:  # an official test split: the source's pool did not hold it
        splits["test"], (test_like_private, near_test) = without_images_of(splits["test"], splits["train"])
        if len(splits["test"]) == 0:
            raise DpsadError(f"data.{dataset}: every test image is identical to a private record, expected a test "
                             "split of other images")
    removed = RemovedDuplicates(repeated, in_public, test_like_private, near_repeated, near_public, near_test, bundled)
    if any(removed.counts()):
        logging.getLogger("dpsad").warning("data.%s: %s: one record is one distinct image", dataset, removed.summary())
    n_private = len(splits[split_group("private")])
    for run, delta in (deltas or {}).items():
        if problem := delta_problem(delta, n_private):
            raise DpsadError(f"run {run}: {problem} of {dataset}, expected a smaller delta")
    write_datafile(out_path, splits, raw, cfg, dataset, fractions, seed, source_checksum, removed)
    return splits


def keep_first_copies(raw: RawDataset) -> tuple[int, int]:
    """Keep the first copy of each image of ``raw``'s pool: an image is a copy of an earlier one when its canonical
    digest as read or as stored is one of that image's (:mod:`dpsad.privacy.books.image_digests`), or a near-copy when its
    perceptual hash is near an earlier image's (:mod:`dpsad.data.near_copies`) or has the same hash digest (what the
    release check and the curator's record recognise as the same record: equal hashes within 8 grey levels of
    mean brightness, a pair the 4-level tolerance of "near" lets through).  Returns how many copies and
    near-copies were removed.  Call after :func:`apply_image_size`, which sets every image's digest and hash as
    read."""
    raw.stored_digests = canonical_digests(raw.images)
    exact = np.zeros(len(raw.images), dtype=bool)
    exact[first_copies([raw.source_digests, raw.stored_digests])] = True
    kept = np.flatnonzero(exact)
    same_hash_digest = np.ones(len(kept), dtype=bool)
    same_hash_digest[first_copies([hash_digests(raw.hashes[kept])])] = False
    near_earlier = near(raw.hashes[kept], raw.hashes[kept], earlier_only=True) | same_hash_digest
    keep = kept[~near_earlier]
    if len(keep) < len(raw.images):
        raw.images, raw.source_digests, raw.stored_digests, raw.hashes = (
            raw.images[keep], raw.source_digests[keep], raw.stored_digests[keep], raw.hashes[keep])
        if raw.labels is not None:
            raw.labels = raw.labels[keep]
    return int((~exact).sum()), int(near_earlier.sum())


def without_bundled_digits(split: Split) -> tuple[Split, int]:
    """``split`` less its records that are bundled MNIST-5k digits (:func:`dpsad.data.bundled_uses.bundled_among`, by
    the digests data.h5 stores), and how many went.  Privacy assumption: each record is kept or dropped by itself
    alone against a fixed public set, so two private splits that differ in one record give kept splits that differ
    in at most that record, and a guarantee for the records kept holds for the private split."""
    keep = ~bundled_among(stored_digest_kinds(split))
    if keep.all():
        return split, 0
    pick = lambda values: None if values is None else values[keep]  # noqa: E731
    return (Split(split.images[keep], pick(split.labels), pick(split.source_digests), split.canonical_digests()[keep],
                  pick(split.hashes)), int((~keep).sum()))


def stored_digest_kinds(split: Split) -> list[np.ndarray]:
    """The digest kinds a data.h5 stores for a record set, row by row, in :func:`split_digest_kinds`' order: as stored
    (byte for byte and canonical), as read, and of the perceptual hash where kept (uint8 N x 16 each)."""
    canonical = split.canonical_digests()
    source = canonical if split.source_digests is None else np.asarray(split.source_digests, dtype=np.uint8)
    return [record_digests(split.images), canonical, source] + (
        [hash_digests(split.hashes)] if split.hashes is not None else [])


def split_identities(split: Split) -> list[np.ndarray]:
    """The canonical digests of a split's images as stored and, where kept, as read (uint8 N x 16 each)."""
    return [split.canonical_digests()] + ([split.source_digests] if split.source_digests is not None else [])


def without_images_of(split: Split, other: Split) -> tuple[Split, tuple[int, int]]:
    """``split`` less the images that ``other`` holds too (canonical digests as stored or as read) and their
    near-copies (perceptual hashes near, or the same hash digest); and how many of each."""
    exact = rows_not_in(split_identities(split), split_identities(other))
    close = near(split.hashes, other.hashes) | ~rows_not_in([hash_digests(split.hashes)], [hash_digests(other.hashes)]) \
        if split.hashes is not None and other.hashes is not None else np.zeros(len(split), dtype=bool)
    keep = exact & ~close
    if keep.all():
        return split, (0, 0)
    pick = lambda values: None if values is None else values[keep]  # noqa: E731
    return (Split(split.images[keep], pick(split.labels), pick(split.source_digests), split.canonical_digests()[keep],
                  pick(split.hashes)), (int((~exact).sum()), int((exact & close).sum())))


def write_datafile(path, splits, raw: RawDataset, cfg: dict, dataset: str, fractions: SplitFractions, seed: int,
                   source_checksum: str | None = None, removed: RemovedDuplicates = RemovedDuplicates()) -> None:
    check_room_for(path, sum(split.images.nbytes + 8 * len(split) + 32 * len(split) for split in splits.values()))
    with atomic_path(path) as tmp:
        with create_hdf5(tmp) as handle:
            for name in SPLITS:
                group = handle.create_group(name)
                split = splits[name]
                group.create_dataset("images", data=split.images, dtype="uint8", compression="gzip", compression_opts=4)
                if split.labels is not None:
                    group.create_dataset("labels", data=split.labels.astype(np.int64))
                if name in RECORD_SETS:
                    digests, *kinds = stored_digest_kinds(split)
                    for key, kind in zip((DIGESTS, CANONICAL_DIGESTS, SOURCE_DIGESTS, NEAR_COPY_DIGESTS), [digests, *kinds]):
                        group.create_dataset(key, data=kind)
                    handle.attrs[RECORD_SETS[name]] = set_fingerprint(digests)
            h, w, c = raw.images.shape[1:]
            attrs = handle.attrs
            attrs["format"] = "dpsad-data"
            attrs["format_version"] = 1
            attrs["dataset"] = dataset
            attrs["source"] = cfg.get("source", "")
            # sha256 of the source files' content (dpsad.data.fingerprint); "" for sources bundled in packages
            attrs["source_checksum"] = source_checksum or ""
            attrs["class_names"] = json.dumps(raw.class_names)
            attrs["labelled"] = raw.labels is not None
            # True when the class names were derived from the labels (a function of the private records).
            attrs["label_set_from_data"] = bool(raw.labels is not None and raw.label_set_from_data)
            attrs["image_size"] = int(h)
            attrs["image_width"] = int(w)
            attrs["channels"] = int(c)
            for name in SPLITS:
                attrs[f"n_{name}"] = len(splits[name])
            attrs["seed"] = seed
            attrs["test_fraction"] = fractions.test if raw.test_images is None else float("nan")
            attrs["public_fraction"] = fractions.public
            attrs["public_form"] = public_form(cfg)
            attrs["public_source"] = (cfg["public"].get("source", "") if cfg.get("public") else cfg.get("source", ""))
            attrs["private_fraction"] = fractions.private
            attrs["notes"] = json.dumps(raw.notes)
            attrs["duplicates_removed"] = removed.to_json()
            # which preparation this is (random): every use of the private split names it (privacy.books.preparation)
            attrs[RECORDS_ID] = new_records_id()


def split_digest_kinds(path, split: str) -> list[np.ndarray]:
    """Each kind of digest of a split of ``data.h5``, row by row: as stored (byte for byte and canonical), as
    read from the source and of the perceptual hash (:func:`dpsad.data.near_copies.hash_digests`), a list of uint8
    N x 16.  A file written before a kind was stored gets it computed from
    its images, or goes without it (as read)."""
    with open_hdf5(path, "dpsad data file") as handle:
        group = handle[split_group(split)]
        source = group[SOURCE_DIGESTS][()] if SOURCE_DIGESTS in group else None
        canonical = group[CANONICAL_DIGESTS][()] if CANONICAL_DIGESTS in group else canonical_digests(group["images"][()])
        near_copy = group[NEAR_COPY_DIGESTS][()] if NEAR_COPY_DIGESTS in group else None
    return [split_record_digests(path, split), canonical] + [kind for kind in (source, near_copy) if kind is not None]


def split_identity_digests(path, split: str) -> np.ndarray:
    """The digests by which the records of a split of ``data.h5`` are recognised in other releases: every kind of
    :func:`split_digest_kinds`, each once (:func:`dpsad.privacy.books.image_digests.identity_digests`), uint8 M x 16."""
    return identity_digests(*split_digest_kinds(path, split))


def split_record_digests(path, split: str) -> np.ndarray:
    """The record digests of a split of ``data.h5`` (uint8 N x 16); computed from its images for a file
    written before prepare_data stored them."""
    with open_hdf5(path, "dpsad data file") as handle:
        group = handle[split_group(split)]
        if DIGESTS in group:
            return group[DIGESTS][()]
        return record_digests(group["images"][()])


@dataclass
class PreparedData:
    """``data.h5`` read back: splits plus metadata."""

    splits: dict[str, Split]
    class_names: list[str]
    labelled: bool
    image_size: int
    channels: int
    attrs: dict

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def read_datafile(path, splits: tuple[str, ...] = SPLITS) -> PreparedData:
    """Load the named splits of a ``data.h5`` (see module docstring)."""
    with open_hdf5(path, "dpsad data file") as handle:
        if handle.attrs.get("format") != "dpsad-data":
            raise DpsadError(f"{path}: not a dpsad data file (attribute 'format' is {handle.attrs.get('format')!r})")
        out = {}
        for name in map(split_group, splits):
            group = handle[name]
            labels = group["labels"][()] if "labels" in group else None
            out[name] = Split(group["images"][()], labels)
        attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in handle.attrs.items()}
    try:
        class_names = json.loads(attrs["class_names"])
        if not isinstance(class_names, list):
            raise ValueError("not a list")
    except (KeyError, ValueError) as err:
        raise DpsadError(f"{path}: attribute class_names = {attrs.get('class_names')!r} is not a JSON list ({err}), "
                         "expected the output of prepare_data (delete the file and rerun)") from err
    return PreparedData(
        splits=out,
        class_names=class_names,
        labelled=bool(attrs["labelled"]),
        image_size=int(attrs["image_size"]),
        channels=int(attrs["channels"]),
        attrs=attrs,
    )


def public_data_sentence(attrs: dict) -> str:
    """One sentence for ``guarantee_notes``: which form the public data took (from ``data.h5``'s attributes)."""
    source = attrs.get("public_source", "")
    if attrs.get("public_form") == "separate_source":
        return (f"The public data came from a separate source ({source}), not from the private records' source; "
                "it was used without privacy protection.")
    return (f"The public data was a split of the same source ({source}) as the private records, disjoint from them, "
            "and was used without privacy protection.")


def read_attrs(path) -> dict:
    """The root attributes of a ``data.h5`` (no images loaded)."""
    with open_hdf5(path, "dpsad data file") as handle:
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in handle.attrs.items()}


def write_split_file(path, name: str, images: np.ndarray, labels: np.ndarray | None, like: dict, *,
                     ledger_entries: list[dict]) -> None:
    """A ``data.h5``-format file holding one split ``name`` (e.g. the central images), with the metadata of
    ``like`` (the attributes of the dataset's data.h5: class names, sizes), so :func:`read_datafile` reads it, and
    the entries of its ledger (attribute ``ledger``, JSON), which the stages reading it check against theirs."""
    with atomic_path(path) as tmp:
        with create_hdf5(tmp) as handle:
            group = handle.create_group(name)
            group.create_dataset("images", data=images, dtype="uint8", compression="gzip", compression_opts=4)
            if labels is not None:
                group.create_dataset("labels", data=np.asarray(labels, np.int64))
            for key in ("format", "format_version", "dataset", "class_names", "labelled", "label_set_from_data",
                        "image_size", "image_width", "channels", RECORDS_ID):
                if key in like:
                    handle.attrs[key] = like[key]
            handle.attrs[f"n_{name}"] = len(images)
            handle.attrs["ledger"] = json.dumps(ledger_entries)
