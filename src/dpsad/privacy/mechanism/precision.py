"""Full fp32 for the arithmetic the DP bound rests on: TF32 switched off where norms and clipped sums are formed."""

from __future__ import annotations

import contextlib

import torch


def tf32_switches() -> list[tuple[object, str, object]]:
    """(object, attribute, full-precision value) of the TF32 switches of cuBLAS matmuls and cuDNN convolutions:
    the per-backend ``fp32_precision`` of recent torch, else the older ``allow_tf32`` flags.  Only these are
    read and written: torch refuses its global getters once the two APIs have been mixed."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(conv, "fp32_precision"):
        return [(torch.backends.cuda.matmul, "fp32_precision", "ieee"), (conv, "fp32_precision", "ieee")]
    return [(torch.backends.cuda.matmul, "allow_tf32", False), (torch.backends.cudnn, "allow_tf32", False)]


@contextlib.contextmanager
def full_precision():
    """Run the enclosed torch code in full fp32: TF32 off for cuBLAS matmuls and cuDNN convolutions.

    PyTorch lets cuDNN convolutions use TF32 by default on Ampere and newer GPUs (10-bit mantissa), and code
    may enable it for matmuls; training keeps whatever is set.  The clipping and summing, and both sides of the
    hooks' self-check, run here: a norm and a sum computed at different precision, or two engines rounding
    differently, would break the bound or the comparison.  On a CPU the switches change nothing."""
    switches = tf32_switches()
    saved = [getattr(owner, name) for owner, name, _ in switches]
    for owner, name, value in switches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name, _), value in zip(switches, saved):
            setattr(owner, name, value)
