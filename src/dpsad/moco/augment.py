"""Batched, seeded image augmentations for contrastive learning on small images.

Every transform draws its parameters per example from the given generator and
acts on that example alone.  Input and output: float [N,C,H,W] in [-1, 1].
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def _uniform(n: int, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen)


def random_affine(x: torch.Tensor, gen: torch.Generator, *, max_rotate: float = 15.0, scale=(0.8, 1.15),
                  max_translate: float = 0.12, flip: bool = False) -> torch.Tensor:
    """Random rotation, isotropic scale (a resized crop when > 1), translation and optional horizontal flip."""
    n = x.shape[0]
    angle = _uniform(n, -max_rotate, max_rotate, gen) * math.pi / 180
    s = _uniform(n, scale[0], scale[1], gen)
    tx, ty = _uniform(n, -max_translate, max_translate, gen) * 2, _uniform(n, -max_translate, max_translate, gen) * 2
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0) if flip else torch.ones(n)
    cos, sin = torch.cos(angle) / s, torch.sin(angle) / s
    theta = torch.stack([torch.stack([cos * sign, -sin, tx], 1), torch.stack([sin * sign, cos, ty], 1)], 1)
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    return F.grid_sample(x + 1, grid, padding_mode="zeros", align_corners=False) - 1  # pad with black (-1)


def colour_jitter(x: torch.Tensor, gen: torch.Generator, strength: float = 0.4) -> torch.Tensor:
    """Random brightness and contrast per example (and saturation for colour images)."""
    n = x.shape[0]
    brightness = _uniform(n, -strength, strength, gen).to(x.device)[:, None, None, None]
    contrast = _uniform(n, 1 - strength, 1 + strength, gen).to(x.device)[:, None, None, None]
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    out = (x - mean) * contrast + mean + brightness
    if x.shape[1] == 3:
        grey = out.mean(dim=1, keepdim=True)
        saturation = _uniform(n, 1 - strength, 1 + strength, gen).to(x.device)[:, None, None, None]
        to_grey = (torch.rand(n, generator=gen) < 0.2).to(x.device)[:, None, None, None]
        out = torch.where(to_grey, grey.expand_as(out), grey + (out - grey) * saturation)
    return out.clamp(-1, 1)


def random_erase(x: torch.Tensor, gen: torch.Generator, probability: float = 0.5, max_fraction: float = 0.25) -> torch.Tensor:
    """Blank a random rectangle in some examples (cutout)."""
    n, _, h, w = x.shape
    out = x.clone()
    apply = torch.rand(n, generator=gen) < probability
    sizes = (torch.rand(n, 2, generator=gen) * max_fraction ** 0.5 * torch.tensor([h, w])).long().clamp(min=1)
    corners = (torch.rand(n, 2, generator=gen) * torch.tensor([h, w])).long()
    for i in torch.nonzero(apply).flatten().tolist():
        r, c = corners[i].tolist()
        dh, dw = sizes[i].tolist()
        out[i, :, r:r + dh, c:c + dw] = -1.0
    return out


def gaussian_noise(x: torch.Tensor, gen: torch.Generator, std: float = 0.1) -> torch.Tensor:
    return (x + std * torch.randn(x.shape, generator=gen).to(x.device)).clamp(-1, 1)


def random_resized_crop(x: torch.Tensor, gen: torch.Generator, *, area=(0.5, 1.0), max_rotate: float = 10.0) -> torch.Tensor:
    """A random square crop of ``area`` of the image (inside the frame), resized back, with a small rotation."""
    n = x.shape[0]
    zoom = 1 / _uniform(n, area[0], area[1], gen).sqrt()  # side of the crop: 1/zoom of the image
    room = 1 - 1 / zoom  # the crop's centre may move this far (normalised coordinates) and stay inside
    tx, ty = (2 * torch.rand(n, generator=gen) - 1) * room, (2 * torch.rand(n, generator=gen) - 1) * room
    angle = _uniform(n, -max_rotate, max_rotate, gen) * math.pi / 180
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    return F.grid_sample(x + 1, grid, padding_mode="zeros", align_corners=False) - 1


def stroke_width(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Thicker, thinner or unchanged strokes, a third each: half a 3x3 dilation or erosion of the bright strokes."""
    dilated = F.max_pool2d(x, 3, stride=1, padding=1)
    eroded = -F.max_pool2d(-x, 3, stride=1, padding=1)
    choice = torch.randint(3, (x.shape[0],), generator=gen).to(x.device)[:, None, None, None]
    return torch.where(choice == 0, (x + dilated) / 2, torch.where(choice == 1, (x + eroded) / 2, x))


def elastic(x: torch.Tensor, gen: torch.Generator, *, strength: float = 0.05, cells: int = 4) -> torch.Tensor:
    """A smooth random warp: displacements (in normalised coordinates, sd ``strength``) drawn on a
    ``cells`` x ``cells`` grid and interpolated over the image, as a hand bends a stroke.  Batched torch on the
    training device; ``dpsad.data.font_glyphs`` has the per-image numpy warp used once, when rendering."""
    n, _, h, w = x.shape
    coarse = strength * torch.randn(n, 2, cells, cells, generator=gen).to(x.device)
    shift = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=True).permute(0, 2, 3, 1)
    identity = torch.eye(2, 3, device=x.device).expand(n, 2, 3)
    grid = F.affine_grid(identity, list(x.shape), align_corners=False) + shift
    return F.grid_sample(x + 1, grid, padding_mode="zeros", align_corners=False) - 1


# Named recipes (moco.augment).  Grey digits: crops and small geometric moves; colour jitter
# (MoCo v2's recipe for natural images) only changes the stroke intensity of a digit.
# "handwriting": v2 with a random stroke width and an elastic warp, so that printed digits of different fonts
# (the public data) look alike to the encoder, as handwritten ones of one class do.
RECIPES = ("crop", "crop_erase", "affine", "v2", "handwriting")


def view(x: torch.Tensor, gen: torch.Generator, recipe: str = "crop") -> torch.Tensor:
    """One augmented view of each image [N,C,H,W] by a named recipe."""
    if recipe == "crop":
        return gaussian_noise(random_resized_crop(x, gen), gen, 0.05)
    if recipe == "crop_erase":
        return gaussian_noise(random_erase(random_resized_crop(x, gen), gen, max_fraction=0.15), gen, 0.05)
    if recipe == "affine":
        return gaussian_noise(random_affine(x, gen, flip=x.shape[1] == 3), gen, 0.05)
    if recipe == "v2":
        out = colour_jitter(random_affine(x, gen, flip=x.shape[1] == 3), gen)
        return gaussian_noise(random_erase(out, gen), gen, 0.05)
    if recipe == "handwriting":
        return view(elastic(stroke_width(x, gen), gen), gen, "v2")
    raise ValueError(f"augment = '{recipe}', expected one of {', '.join(RECIPES)}")


def two_views(x: torch.Tensor, gen: torch.Generator, recipe: str = "v2") -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent augmentations of each image (the query and key views)."""
    return view(x, gen, recipe), view(x, gen, recipe)
