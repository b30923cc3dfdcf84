"""Figures a person would rather look at than read: loss curves, epsilon over steps, sample grids."""

from __future__ import annotations

import csv

import numpy as np
from PIL import Image

from .files.atomic import atomic_path


def _axes(figsize: tuple[float, float]):
    """(figure, axes) outside pyplot: no global figure state and nothing to close.  matplotlib is imported
    here, by the stages that draw a chart (0.4 to 0.8 s a job), not by those that only write sample grids."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def _save(fig, png_path) -> None:
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def loss_curve(csv_path, png_path, title: str) -> None:
    """Plot every numeric column of a loss CSV against ``step``."""
    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    fig, ax = _axes((6, 3.5))
    if rows:
        steps = [float(r["step"]) for r in rows]
        for key in rows[0]:
            if key == "step":
                continue
            try:
                values = [float(r[key]) for r in rows]
            except (TypeError, ValueError):
                continue
            ax.plot(steps, values, label=key)
        ax.legend(fontsize=7)
    ax.set_xlabel("step")
    ax.set_yscale("log") if rows and all(float(r.get("loss", 1) or 1) > 0 for r in rows) else None
    ax.set_title(title)
    _save(fig, png_path)


def epsilon_curve(points: list[tuple[float, float]], total_steps: int, target: float | None, png_path, title: str) -> None:
    fig, ax = _axes((5, 3.2))
    if points:
        ax.plot([f * total_steps for f, _ in points], [e for _, e in points], marker=".")
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", label=f"target {target:g}")
        ax.legend()
    ax.set_xlabel("training step")
    ax.set_ylabel("epsilon")
    ax.set_title(title)
    _save(fig, png_path)


class GridCollector:
    """Keeps what :func:`sample_grid` shows (the first ``per_row`` samples of each class, or the first
    ``per_row``**2 when unlabelled) from a stream of batches, so the grid needs no copy of the dataset."""

    def __init__(self, per_row: int = 10):
        self.per_row = per_row
        self.kept: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.counts: dict = {}
        self.unlabelled = 0

    def passing(self, batches):
        """Yield every batch unchanged, keeping the grid's samples on the way."""
        for images, labels in batches:
            if labels is None:
                room = self.per_row * self.per_row - self.unlabelled
                if room > 0:
                    self.kept.append((images[:room].copy(), None))
                    self.unlabelled += len(images[:room])
            else:
                keep = np.zeros(len(labels), dtype=bool)
                for i, c in enumerate(np.asarray(labels).tolist()):
                    if self.counts.get(c, 0) < self.per_row:
                        self.counts[c] = self.counts.get(c, 0) + 1
                        keep[i] = True
                if keep.any():
                    self.kept.append((images[keep].copy(), np.asarray(labels)[keep]))
            yield images, labels

    def save(self, png_path) -> None:
        images = np.concatenate([i for i, _ in self.kept])
        labels = None if self.kept[0][1] is None else np.concatenate([lab for _, lab in self.kept])
        sample_grid(images, labels, png_path, per_row=self.per_row)


def sample_grid(images: np.ndarray, labels: np.ndarray | None, png_path, per_row: int = 10, scale: int = 2) -> None:
    """A grid with one row per class (first ``per_row`` samples of each), or plain rows when unlabelled.

    images: uint8 [N,H,W,C].
    """
    if labels is not None:
        rows = []
        for c in np.unique(labels):
            chosen = images[labels == c][:per_row]
            if len(chosen) < per_row:
                pad = np.zeros((per_row - len(chosen),) + images.shape[1:], dtype=np.uint8)
                chosen = np.concatenate([chosen, pad])
            rows.append(chosen)
        grid_images = np.stack(rows)
    else:
        count = (min(len(images), per_row * per_row) // per_row) * per_row
        grid_images = images[:count].reshape(-1, per_row, *images.shape[1:])
    r, c, h, w, ch = grid_images.shape
    canvas = np.full((r * (h + 2) + 2, c * (w + 2) + 2, ch), 255, dtype=np.uint8)
    for i in range(r):
        for j in range(c):
            canvas[2 + i * (h + 2): 2 + i * (h + 2) + h, 2 + j * (w + 2): 2 + j * (w + 2) + w] = grid_images[i, j]
    image = Image.fromarray(canvas[..., 0] if ch == 1 else canvas)
    image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    with atomic_path(png_path) as tmp:
        image.save(tmp, format="PNG")


def audit_histogram(scores: np.ndarray, included: np.ndarray, png_path, title: str) -> None:
    """Histograms of canary scores [m] for canaries in the training data and left out (included [m] bool)."""
    fig, ax = _axes((5, 3.2))
    bins = np.histogram_bin_edges(scores, bins=40)
    ax.hist(scores[~included], bins=bins, alpha=0.6, label=f"left out ({int((~included).sum())})")
    ax.hist(scores[included], bins=bins, alpha=0.6, label=f"in training data ({int(included.sum())})")
    ax.set_xlabel("canary score (higher: guessed in)")
    ax.set_ylabel("canaries")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    _save(fig, png_path)


def utility_against_epsilon(table: dict, png_path, title: str) -> None:
    """One line per method (mean CNN accuracy against epsilon spent, bars: one standard deviation over CNN
    trainings), the public row (epsilon 0) and the nonprivate row (no noise) as dashed lines."""
    fig, ax = _axes((5, 3.5))
    methods = sorted({point[0] for point in table["points"]})
    for method in methods:
        points = [point[1:] for point in table["points"] if point[0] == method]
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o", capsize=3,
                    label=method)
    if table["public"] is not None:
        ax.axhline(table["public"], color="grey", linestyle="--", label="public (epsilon 0)")
    if table.get("nonprivate") is not None:
        ax.axhline(table["nonprivate"], color="black", linestyle=":", label="nonprivate (no DP)")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("CNN accuracy on real test data")
    ax.set_title(title)
    ax.legend(fontsize=7)
    _save(fig, png_path)
