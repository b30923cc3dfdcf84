"""The public font renderer as Private Evolution's generator (Sim-PE, Lin et al. 2025).

A candidate is the renderer's parameters, not an image: its glyph (the class's character, or with ``cases="both"``
the letter in either case), font, stroke weight, glyph box, rotation, shear, zoom and the raw fields of its elastic
distortion.  A fresh candidate is drawn as the public source draws its images
(:data:`dpsad.data.font_glyphs.DISTORTIONS`), its glyph uniform over the class's glyphs; a variation moves a
candidate's parameters by an amount that grows with ``strength`` and stays within those ranges.  Nothing here
reads a private record: which candidates are varied is post-processing of the noisy vote counts
(:mod:`dpsad.pe.simulator_evolution`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..data.font_glyphs import CANVAS, DISTORTIONS, fit_and_centre, font_files, glyph_ink, warp
from ..data.raw import resize_square
from ..errors import DpsadError
from ..data.image_tensors import images_to_tensor

UNIFORM_STD = 1.0 / math.sqrt(3.0)  # the public renderer's elastic fields are uniform on [-1, 1]
UNIT_STEP = 0.5  # a variation at strength 1 moves rotation, shear and zoom by half their range (one std)


@dataclass(frozen=True)
class GlyphParams:
    """N candidates' renderer parameters.

    labels, font, weight, box, form: int64 [N] (the class, and indices into the fonts, ``weights``, ``box_sizes``
    and the class's glyphs: 0, the public source's character; 1, the same letter in the other case);
    unit: float64 [N, 3], rotation, shear and zoom as positions in their ranges (0 to 1);
    fields: float64 [N, 2, CANVAS, CANVAS], the elastic step's raw displacement fields, standard normal."""

    labels: np.ndarray
    font: np.ndarray
    weight: np.ndarray
    box: np.ndarray
    unit: np.ndarray
    fields: np.ndarray
    form: np.ndarray

    def take(self, index: np.ndarray) -> GlyphParams:
        """The candidates at ``index`` [M] (repeats allowed), in that order."""
        return GlyphParams(*(getattr(self, name)[index] for name in self.__dataclass_fields__))


def reflect_unit(x: np.ndarray) -> np.ndarray:
    """``x`` folded into [0, 1] by reflection at both ends (a step past an end comes back, as far)."""
    folded = np.mod(x, 2.0)
    return np.where(folded > 1.0, 2.0 - folded, folded)


CASES = ("public", "both")


class FontSimulator:
    """Draws, varies and renders glyphs of ``chars`` (class i is ``chars[i]``; with ``cases="both"`` also its other
    case, where it has one) at ``image_size`` pixels with the public randomness of ``seed``."""

    def __init__(self, chars: str, image_size: int, seed: int, cases: str = "public"):
        if not chars:
            raise DpsadError("font simulator: no characters, expected one a class")
        if cases not in CASES:
            raise DpsadError(f"font simulator: cases = {cases!r}, expected one of {', '.join(CASES)}")
        self.image_size = int(image_size)
        self.glyphs = [(char,) if cases == "public" or char.swapcase() == char else (char, char.swapcase())
                       for char in chars]
        # the draws of a one-glyph renderer stay those of the public source's (no form is drawn)
        self.forms = np.array([len(glyphs) for glyphs in self.glyphs]) if max(map(len, self.glyphs)) > 1 else None
        self.fonts = font_files()
        self.rng = np.random.default_rng(int(seed))
        self.weights, self.boxes = DISTORTIONS["weights"], DISTORTIONS["box_sizes"]
        # Each glyph is drawn once, (font, label, weight, form), and centred once in each box, + (box,): the same
        # for every candidate that draws these, so only the distortions are computed per candidate
        self._ink: dict[tuple[int, int, int, int], np.ndarray] = {}
        self._centred: dict[tuple[int, int, int, int, int], np.ndarray] = {}

    def fresh(self, labels: np.ndarray) -> GlyphParams:
        """New candidates for ``labels`` [N], drawn as the public source draws its images (with two cases, each
        glyph uniform over the two)."""
        n, labels = len(labels), np.asarray(labels, dtype=np.int64)
        return GlyphParams(labels=labels,
                           font=self.rng.integers(len(self.fonts), size=n), weight=self.rng.integers(len(self.weights), size=n),
                           box=self.rng.integers(len(self.boxes), size=n), unit=self.rng.random((n, 3)),
                           fields=self.rng.standard_normal((n, 2, CANVAS, CANVAS)), form=self._forms(labels))

    def _forms(self, labels: np.ndarray) -> np.ndarray:
        """A glyph index [N] for each label, uniform over its class's glyphs."""
        if self.forms is None:
            return np.zeros(len(labels), dtype=np.int64)
        return self.rng.integers(self.forms[labels])

    def vary(self, params: GlyphParams, strength: float) -> GlyphParams:
        """A variation of each candidate at ``strength`` in (0, 1]: font, weight and box each drawn again with
        probability strength / 2; rotation, shear and zoom moved by strength x UNIT_STEP of their range (normal,
        reflected at the ends); the elastic fields mixed with fresh ones, sqrt(1 - s^2) old + s new (still
        standard normal); with two cases, the glyph drawn again like the font.  The class stays."""
        if not 0.0 < strength <= 1.0:
            raise DpsadError(f"font simulator: strength = {strength}, expected a number in (0, 1]")
        n = len(params.labels)

        def redrawn(values, choices):
            again = self.rng.random(n) < strength / 2
            return np.where(again, self.rng.integers(choices, size=n), values)

        return GlyphParams(
            labels=params.labels.copy(), font=redrawn(params.font, len(self.fonts)),
            weight=redrawn(params.weight, len(self.weights)), box=redrawn(params.box, len(self.boxes)),
            unit=reflect_unit(params.unit + strength * UNIT_STEP * self.rng.standard_normal(params.unit.shape)),
            fields=math.sqrt(1.0 - strength ** 2) * params.fields
            + strength * self.rng.standard_normal(params.fields.shape),
            form=params.form if self.forms is None else np.where(self.rng.random(n) < strength / 2,
                                                                 self._forms(params.labels), params.form))

    def _centred_glyph(self, font: int, label: int, weight: int, form: int, box: int) -> np.ndarray:
        """The glyph's ink fitted to its box and centred on the canvas, float [CANVAS, CANVAS] in [0, 1]."""
        glyph = (font, label, weight, form)
        if glyph not in self._ink:
            self._ink[glyph] = glyph_ink(self.fonts[font], self.glyphs[label][form], self.weights[weight])
        if (*glyph, box) not in self._centred:
            self._centred[(*glyph, box)] = fit_and_centre(self._ink[glyph], self.boxes[box])
        return self._centred[(*glyph, box)]

    def render(self, params: GlyphParams) -> torch.Tensor:
        """The candidates' images, float32 [N, 1, image_size, image_size] in [-1, 1], as the public source renders
        them (28x28, then resized like the prepared data)."""
        rotation, shear, scale = DISTORTIONS["rotation"], DISTORTIONS["shear"], DISTORTIONS["scale"]
        images = []
        for i in range(len(params.labels)):
            centred = self._centred_glyph(int(params.font[i]), int(params.labels[i]), int(params.weight[i]),
                                          int(params.form[i]), int(params.box[i]))
            u = 2.0 * params.unit[i] - 1.0  # each in [-1, 1]
            image = warp(centred, angle=np.deg2rad(u[0] * rotation), shear=u[1] * shear, zoom=1.0 + u[2] * scale,
                         fields=params.fields[i] * UNIFORM_STD, elastic_alpha=DISTORTIONS["elastic_alpha"],
                         elastic_sigma=DISTORTIONS["elastic_sigma"])
            images.append(np.round(image * 255).astype(np.uint8))
        stacked = np.stack(images)[..., None] if images else np.zeros((0, CANVAS, CANVAS, 1), np.uint8)
        return images_to_tensor(resize_square(stacked, self.image_size))
