"""Sampling: ``solvers`` holds the reverse-process solvers (ancestral DDPM, DDIM, DPM-Solver++ 2M, guidance);
``draw`` loads any generator checkpoint, plans the labels and streams a synthetic dataset from it."""

from .draw import load_any_generator

__all__ = ["load_any_generator"]
