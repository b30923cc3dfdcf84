"""The sum of each example's clipped gradient, without forming per-example gradients where norms cost less.

One batched forward and backward (:func:`.per_example.layer_calls`) keeps each trained layer's input a and
output gradient g.  Then, per parameter:

1. Each example's squared norm, whichever way costs less (Bu et al., 2022, mixed ghost clipping):

   - *ghost*, for the weight of a linear or convolution layer: example i's gradient is G_i = sum_t g_it a_it^T
     over its T rows (its M rows, one per noise draw, times the layer's positions; for a convolution a is the
     im2col of the input, d = C_in k_h k_w), so ||G_i||^2 = sum_{t,s} (a_it . a_is)(g_it . g_is), two T x T Gram
     matrices (Li et al., 2022) in full fp32, their products summed in float64;
   - *per-example*, everywhere else: G_i formed (:func:`.per_example.layer_gradients`, the hooks engine).

   Ghost where T (d + p) < d p (p: output width): the Gram matrices cost less than the d x p gradient of each
   example.  Biases, GroupNorm and Embedding layers are per-example (their gradients are small).
2. Factors c_i = min(1, C (1 - margin) / ||G_i||), by parameter group (dp-GAN's grouped clipping) or for the
   whole gradient.
3. Sums: a per-example parameter's from its gradients (c @ G); a ghost parameter's by book-keeping (Bu et al.,
   2023): sum_i c_i G_i = (c (.) g)^T a over all rows, with each row's output gradient scaled by its example's
   factor (for a convolution, torch's own weight gradient of the scaled g), so no per-example gradient of it
   exists at any moment.  That product rounds apart from the Gram matrices that gave the norm: the caller's
   ``margin`` covers it (:data:`.mechanism.GHOST_CLIP_MARGIN`).  Norms and sums run with TF32 off.

With noise multiplicity K the K rows of an example are all in its T: the norm is that of the gradient of its
K-average loss, as with per-example gradients, and the accounting does not change.

Assumptions: those of :mod:`.per_example` (one loss per example, rows grouped by example, rows that do not
interact); :class:`.mechanism.DPSGD` checks the first sum against vmap's in full fp32.  An example whose norm
is not finite (a NaN or an overflow) adds zero, as in :func:`.dpsgd.drop_non_finite`.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .per_example import BatchedLoss, layer_calls, layer_gradients, parameter_name
from .precision import full_precision

GHOST_LAYERS = (nn.Linear, nn.Conv2d)


def example_rows(module: nn.Module, a: torch.Tensor, g: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One call's rows of the weight's product, grouped by example: a [N, T, d] and g [N, T, p]."""
    if isinstance(module, nn.Conv2d):
        cols = F.unfold(a, module.kernel_size, dilation=module.dilation, padding=module.padding, stride=module.stride)
        a = cols.transpose(1, 2)  # [R, L, d]
        g = g.flatten(2).transpose(1, 2)  # [R, L, p]
    return a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])


def ghost_pays(module: nn.Module, pairs, n: int) -> bool:
    """Whether the Gram matrices of the weight cost less than its per-example gradients: T (d + p) < d p."""
    if not isinstance(module, GHOST_LAYERS) or not module.weight.requires_grad:
        return False
    rows = 0
    for a, g in pairs:
        positions = g[0, 0].numel() if isinstance(module, nn.Conv2d) else (g.numel() // g.shape[-1]) // g.shape[0]
        rows += (a.shape[0] // n) * positions
    d = module.weight[0].numel()
    p = module.weight.shape[0]
    return rows * (d + p) < d * p


def ghost_squared_norms(module: nn.Module, pairs, n: int) -> torch.Tensor:
    """[N] squared norms of the weight's per-example gradients from Gram matrices (all calls' rows together)."""
    rows = [example_rows(module, a, g, n) for a, g in pairs]
    a = torch.cat([r[0] for r in rows], dim=1)
    g = torch.cat([r[1] for r in rows], dim=1)
    return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).double().sum(dim=(1, 2))


def bookkept_weight_sum(module: nn.Module, pairs, n: int, factors: torch.Tensor) -> torch.Tensor:
    """sum_i c_i G_i of the weight, from every call's rows with each output gradient scaled by its example's c."""
    total = torch.zeros_like(module.weight, dtype=torch.float32)
    for a, g in pairs:
        scale = factors.repeat_interleave(g.shape[0] // n).reshape(-1, *([1] * (g.dim() - 1)))
        scaled = g * scale
        if isinstance(module, nn.Conv2d):
            total += torch.nn.grad.conv2d_weight(a, module.weight.shape, scaled, stride=module.stride,
                                                 padding=module.padding, dilation=module.dilation)
        else:
            total += scaled.reshape(-1, scaled.shape[-1]).T @ a.reshape(-1, a.shape[-1])
    return total


def zero_examples(rows: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """``rows`` [N * T, ...] (grouped by example, as the batched loss promises) with every row of each example
    whose ``finite`` [N] is False set to zero (not scaled: 0 * NaN is NaN)."""
    n = finite.shape[0]
    grouped = rows.reshape(n, -1)
    return torch.where(finite[:, None], grouped, torch.zeros((), dtype=rows.dtype, device=rows.device)).reshape(rows.shape)


def clipped_sum(model: nn.Module, batched_loss: BatchedLoss, inputs: tuple[torch.Tensor, ...], *, bounds: list[float],
                group_of: dict[str, int] | None = None, margin: float, autocast_bf16: bool = False
                ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The batch's sum of clipped per-example gradients, and each example's norm per group.

    ``bounds``: the clip norm of each parameter group (one group: the whole gradient); ``group_of``: parameter
    name -> group (None: every parameter in group 0).  Each example's gradient restricted to group j is scaled
    to norm at most ``bounds[j] * (1 - margin)``.  Returns ({name: sum, shaped as the parameter}, norms [N, k]).
    """
    n = int(inputs[0].shape[0])
    calls = layer_calls(model, batched_loss, inputs, autocast_bf16)
    group = (lambda name: group_of[name]) if group_of is not None else (lambda name: 0)  # noqa: E731
    ghost: dict[str, tuple[nn.Module, list]] = {}  # weights whose norms come from Gram matrices, summed by book-keeping
    kept: dict[str, torch.Tensor] = {}  # per-example gradients [N, P] of the other parameters (training precision)
    for prefix, module, pairs in calls:
        use_ghost = ghost_pays(module, pairs, n)
        if use_ghost:
            ghost[parameter_name(prefix, "weight")] = (module, pairs)
        for pname, grads in layer_gradients(module, pairs, n, skip=("weight",) if use_ghost else ()).items():
            kept[parameter_name(prefix, pname)] = grads.reshape(n, -1)
    device = inputs[0].device
    with full_precision():  # each norm and the sum it scales from the same tensors, TF32 off
        squared = torch.zeros(n, len(bounds), dtype=torch.float64, device=device)
        for name, (module, pairs) in ghost.items():
            squared[:, group(name)] += ghost_squared_norms(module, pairs, n)
        for name, flat in kept.items():
            squared[:, group(name)] += torch.linalg.vector_norm(flat, dim=1).double().square()
        norms = squared.sqrt()
        finite = torch.isfinite(norms).all(dim=1)
        if not bool(finite.all()):  # see dpsgd.drop_non_finite: such an example adds nothing
            norms = torch.where(finite[:, None], norms, torch.full_like(norms, math.inf))
            kept = {name: zero_examples(flat, finite) for name, flat in kept.items()}
            ghost = {name: (module, [(zero_examples(a, finite), zero_examples(g, finite)) for a, g in pairs])
                     for name, (module, pairs) in ghost.items()}
        limits = torch.tensor(bounds, dtype=torch.float64, device=device)[None] * (1.0 - margin)
        factors = (limits / (norms + 1e-12)).clamp(max=1.0).float()
        summed = {}
        for prefix, module, _ in calls:
            for pname, param in module.named_parameters(recurse=False):
                name = parameter_name(prefix, pname)
                if not param.requires_grad:
                    continue
                column = factors[:, group(name)]
                summed[name] = (bookkept_weight_sum(*ghost[name], n, column) if name in ghost
                                else (column @ kept[name]).reshape(param.shape))
    return summed, norms.float()
