"""Printed digits and letters rendered offline from the fonts that ship inside matplotlib.

Digits (source ``font_digits``) stand in for a curator's *public* collection
beside handwritten private digits: a related domain (printed, not
handwritten), drawn from no private record.  Letters (source ``font_letters``,
a to j in one case) give a second kind of image for checking settings away
from digits: lower-case letters as private data beside upper-case public ones.

Each image is one glyph at a random size and stroke weight, centred
by its centre of mass in a 20x20 box on a 28x28 canvas (as MNIST was made),
then given a random affine map and an elastic distortion (Simard et al. 2003).

Deterministic for a given seed: the same config renders the same images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DpsadError
from .raw import RawDataset

DIGIT_CLASSES = [str(d) for d in range(10)]
LETTER_CLASSES = list("abcdefghij")  # one class per letter, whatever its case, so a and A share a label

# Families whose glyphs for 0-9 are ordinary lining digits (cmmi10's old-style digits and symbol fonts are left out).
MATPLOTLIB_FONTS = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf", "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
    "cmr10.ttf", "cmb10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmti10.ttf",
)
CANVAS = 28
BOX = 20  # MNIST: each digit fitted into 20x20, then centred by centre of mass in 28x28
RENDER = 96  # glyphs are drawn large, then reduced, for anti-aliased strokes
# The public sources' distortions (rotation in degrees, shear, zoom +- scale, elastic alpha and sigma in pixels,
# stroke weights, glyph boxes): the renderers' defaults, and the ranges Sim-PE draws and varies within.
DISTORTIONS = {"rotation": 20.0, "shear": 0.5, "scale": 0.1, "elastic_alpha": 34.0, "elastic_sigma": 4.0,
               "weights": (0, 1, 2), "box_sizes": (16, 18, 20)}


def font_files() -> list[Path]:
    """The TrueType files used, in a fixed order; an error if matplotlib's fonts are missing."""
    import matplotlib

    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    files = [folder / name for name in MATPLOTLIB_FONTS if (folder / name).is_file()]
    if not files:
        raise DpsadError(f"font_digits: no fonts found in {folder}, expected matplotlib's bundled TrueType fonts")
    return files


def glyph_ink(font_path: Path, char: str, weight: int):
    """One character drawn white on black at RENDER pixels, cropped to its ink: float array in [0, 1]."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    font = ImageFont.truetype(str(font_path), int(RENDER * 0.7))
    img = Image.new("L", (RENDER * 2, RENDER * 2), 0)
    ImageDraw.Draw(img).text((RENDER // 2, RENDER // 4), char, fill=255, font=font)
    if weight > 0:
        img = img.filter(ImageFilter.MaxFilter(2 * weight + 1))
    elif weight < 0:
        img = img.filter(ImageFilter.MinFilter(-2 * weight + 1))
    ink = np.asarray(img, dtype=np.float64) / 255.0
    rows, cols = np.flatnonzero(ink.max(1) > 0.1), np.flatnonzero(ink.max(0) > 0.1)
    if len(rows) == 0:
        raise DpsadError(f"font glyphs: font {font_path.name} drew nothing for {char!r}")
    return ink[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


def fit_and_centre(glyph: np.ndarray, box: int) -> np.ndarray:
    """Scale so the longer side is ``box`` pixels, then place by centre of mass in CANVAS x CANVAS."""
    from PIL import Image
    from scipy import ndimage

    h, w = glyph.shape
    scale = box / max(h, w)
    size = (max(1, int(round(w * scale))), max(1, int(round(h * scale))))
    small = np.asarray(Image.fromarray((glyph * 255).astype(np.uint8)).resize(size, Image.LANCZOS), dtype=np.float64) / 255.0
    canvas = np.zeros((CANVAS, CANVAS))
    top, left = (CANVAS - small.shape[0]) // 2, (CANVAS - small.shape[1]) // 2
    canvas[top:top + small.shape[0], left:left + small.shape[1]] = small
    cy, cx = ndimage.center_of_mass(canvas)
    return ndimage.shift(canvas, ((CANVAS - 1) / 2 - cy, (CANVAS - 1) / 2 - cx), order=1)


def _distort(image: np.ndarray, rng: np.random.Generator, *, rotation: float, shear: float, scale: float,
             elastic_alpha: float, elastic_sigma: float) -> np.ndarray:
    """Random affine map (about the centre), then an elastic field of strength alpha and smoothness sigma (pixels)."""
    angle = np.deg2rad(rng.uniform(-rotation, rotation))
    sh = rng.uniform(-shear, shear)
    zoom = rng.uniform(1.0 - scale, 1.0 + scale)
    fields = (rng.uniform(-1, 1, image.shape), rng.uniform(-1, 1, image.shape)) if elastic_alpha > 0 else None
    return warp(image, angle=angle, shear=sh, zoom=zoom, fields=fields, elastic_alpha=elastic_alpha,
                elastic_sigma=elastic_sigma)


def warp(image: np.ndarray, *, angle: float, shear: float, zoom: float, fields, elastic_alpha: float,
         elastic_sigma: float) -> np.ndarray:
    """``image`` [CANVAS, CANVAS] in [0, 1] under the affine map of ``angle`` (radians), ``shear`` and ``zoom`` about
    the centre, then displaced by the two raw ``fields`` (each [CANVAS, CANVAS], or None for no elastic step),
    smoothed by ``elastic_sigma`` and scaled by ``elastic_alpha``."""
    from scipy import ndimage

    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    matrix = np.linalg.inv(rot @ np.array([[1.0, shear], [0.0, 1.0]]) * zoom)
    centre = np.array([(CANVAS - 1) / 2, (CANVAS - 1) / 2])
    out = ndimage.affine_transform(image, matrix, offset=centre - matrix @ centre, order=1)
    if fields is not None and elastic_alpha > 0:
        dy = ndimage.gaussian_filter(fields[0], elastic_sigma) * elastic_alpha
        dx = ndimage.gaussian_filter(fields[1], elastic_sigma) * elastic_alpha
        yy, xx = np.meshgrid(np.arange(CANVAS), np.arange(CANVAS), indexing="ij")
        out = ndimage.map_coordinates(out, [yy + dy, xx + dx], order=1)
    return np.clip(out, 0.0, 1.0)


def render_font_digits(n_per_class: int, seed: int, **distortions) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [10 * n_per_class, 28, 28], labels int64) of distorted printed digits, classes in order.

    ``distortions``: the keywords of ``render_font_digits_with_fonts``.
    """
    images, labels, _ = render_font_digits_with_fonts(n_per_class, seed, **distortions)
    return images, labels


def render_font_digits_with_fonts(n_per_class: int, seed: int, *, rotation: float = DISTORTIONS["rotation"],
                                  shear: float = DISTORTIONS["shear"], scale: float = DISTORTIONS["scale"],
                                  elastic_alpha: float = DISTORTIONS["elastic_alpha"],
                                  elastic_sigma: float = DISTORTIONS["elastic_sigma"],
                                  weights: tuple[int, ...] = DISTORTIONS["weights"],
                                  box_sizes: tuple[int, ...] = DISTORTIONS["box_sizes"]
                                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``render_font_digits``'s images and labels, and each image's font (int64 [N], an index into ``font_files()``).

    The default distortions (rotation in degrees, shear, elastic alpha and sigma as in Simard et al.) were chosen by
    the test-split accuracy of a CNN trained on these digits alone (docs/defaults.md; the script is in the
    repository's history: ``git log -- benchmarks/public_scenario.py``).
    """
    return render_font_glyphs("0123456789", n_per_class, seed, rotation=rotation, shear=shear, scale=scale,
                              elastic_alpha=elastic_alpha, elastic_sigma=elastic_sigma, weights=weights,
                              box_sizes=box_sizes)


def render_font_glyphs(chars: str, n_per_class: int, seed: int, *, rotation: float = DISTORTIONS["rotation"],
                       shear: float = DISTORTIONS["shear"], scale: float = DISTORTIONS["scale"],
                       elastic_alpha: float = DISTORTIONS["elastic_alpha"],
                       elastic_sigma: float = DISTORTIONS["elastic_sigma"], weights: tuple[int, ...] = DISTORTIONS["weights"],
                       box_sizes: tuple[int, ...] = DISTORTIONS["box_sizes"]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images uint8 [len(chars) * n_per_class, 28, 28], labels int64, font index int64) of distorted characters.

    Class i is ``chars[i]``; classes in order, ``n_per_class`` each."""
    if n_per_class < 1:
        raise DpsadError(f"font glyphs: n_per_class = {n_per_class}, expected at least 1")
    rng = np.random.default_rng(seed)
    fonts = font_files()
    glyphs: dict = {}
    images, labels, font_of = [], [], []
    for label, char in enumerate(chars):
        for _ in range(n_per_class):
            key = (int(rng.integers(len(fonts))), char, int(rng.choice(weights)))
            if key not in glyphs:
                glyphs[key] = glyph_ink(fonts[key[0]], char, key[2])
            centred = fit_and_centre(glyphs[key], int(rng.choice(box_sizes)))
            image = _distort(centred, rng, rotation=rotation, shear=shear, scale=scale,
                             elastic_alpha=elastic_alpha, elastic_sigma=elastic_sigma)
            images.append(np.round(image * 255).astype(np.uint8))
            labels.append(label)
            font_of.append(key[0])
    return np.stack(images), np.array(labels, dtype=np.int64), np.array(font_of, dtype=np.int64)


def source_characters(cfg: dict) -> str:
    """The characters of a font source's classes, in class order: 0-9 for ``font_digits``, a-j (or A-J with
    ``case: upper``) for ``font_letters``; an error for any other source."""
    if cfg.get("source") == "font_digits":
        return "".join(DIGIT_CLASSES)
    if cfg.get("source") == "font_letters":
        chars = "".join(LETTER_CLASSES)
        return chars.upper() if cfg.get("case") == "upper" else chars
    raise DpsadError(f"font glyphs: source {cfg.get('source')!r}, expected font_digits or font_letters")


def load_font_digits(cfg: dict) -> RawDataset:
    """The ``font_digits`` source: ``n_per_class`` images per digit (default 100), seeded by ``render_seed``."""
    images, labels = render_font_digits(int(cfg.get("n_per_class") or 100), int(cfg.get("render_seed") or 0))
    return RawDataset(images=images, labels=labels, class_names=DIGIT_CLASSES,
                      notes={"font_digits_fonts": len(font_files())})


def load_font_letters(cfg: dict) -> RawDataset:
    """The ``font_letters`` source: letters a to j in ``case`` (lower or upper), ``n_per_class`` images each."""
    images, labels, _ = render_font_glyphs(source_characters(cfg), int(cfg.get("n_per_class") or 100), int(cfg.get("render_seed") or 0))
    return RawDataset(images=images, labels=labels, class_names=LETTER_CLASSES,
                      notes={"font_letters_fonts": len(font_files()), "font_letters_case": cfg.get("case") or "lower"})
