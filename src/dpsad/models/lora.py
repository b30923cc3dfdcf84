"""Low-rank adapters (LoRA) on a network's convolutions and linear layers, the rest frozen.

DP fine-tuning of an adapter of rank r puts the same noise per coordinate on far fewer coordinates than
fine-tuning every weight.  Each adapted layer computes base(x) + up(down(x)), with ``down`` a layer of the
base's kind and shape into r channels and ``up`` a 1x1 (or linear) map back, started at zero, so the adapted
network starts as the base.  ``down`` and ``up`` are plain ``nn.Conv2d`` / ``nn.Linear`` modules: the
per-example engines treat them as any other trained layer, and the frozen base gets no gradient and no noise.
:func:`merged_state_dict` folds the adapters back into the base weights, so a finished checkpoint loads into
the plain network.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ADAPTED = (nn.Conv2d, nn.Linear)


class Adapted(nn.Module):
    """``base`` (frozen) plus a rank-``rank`` adapter.  Same input and output shapes as ``base``."""

    def __init__(self, base: nn.Module, rank: int):
        super().__init__()
        if isinstance(base, nn.Conv2d) and (base.groups != 1 or base.padding_mode != "zeros"):
            raise ValueError(f"a convolution with groups {base.groups} and padding_mode {base.padding_mode!r}, "
                             "expected groups 1 and zero padding (the adapter's merged weight assumes them)")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        if isinstance(base, nn.Conv2d):
            self.down = nn.Conv2d(base.in_channels, rank, base.kernel_size, base.stride, base.padding, base.dilation,
                                  bias=False)
            self.up = nn.Conv2d(rank, base.out_channels, 1, bias=False)
        else:
            self.down = nn.Linear(base.in_features, rank, bias=False)
            self.up = nn.Linear(rank, base.out_features, bias=False)
        self.down.to(base.weight.device)
        self.up.to(base.weight.device)
        nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))

    def merged_weight(self) -> torch.Tensor:
        """The base weight plus the adapter's product, in the base weight's shape."""
        up = self.up.weight.flatten(1)  # [out, r]
        down = self.down.weight  # [r, in(, k, k)]
        return self.base.weight + torch.tensordot(up, down, dims=([1], [0]))


def adapter_parameters(model: nn.Module, rank: int) -> int:
    """How many coordinates adapters of ``rank`` on every convolution and linear layer of ``model`` have."""
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            total += rank * (module.in_channels * math.prod(module.kernel_size) + module.out_channels)
        elif isinstance(module, nn.Linear):
            total += rank * (module.in_features + module.out_features)
    return total


def add_adapters(model: nn.Module, rank: int) -> int:
    """Freeze ``model`` and put a rank-``rank`` adapter on each convolution and linear layer, in place.
    Returns the number of trainable coordinates (the adapters')."""
    if rank < 1:
        raise ValueError(f"rank = {rank}, expected at least 1")
    for p in model.parameters():
        p.requires_grad_(False)
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, ADAPTED)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Adapted(module, rank))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict:
    """The state dict of the plain network: every adapted layer's weight merged, under the base's own names."""
    state = {}
    adapted = {name: module for name, module in model.named_modules() if isinstance(module, Adapted)}
    for key, value in model.state_dict().items():
        owner = next((name for name in adapted if key.startswith(name + ".")), None)
        if owner is None:
            state[key] = value
            continue
        rest = key[len(owner) + 1:]
        if rest == "base.weight":
            state[f"{owner}.weight"] = adapted[owner].merged_weight().detach().clone()
        elif rest.startswith("base."):
            state[f"{owner}.{rest[len('base.'):]}"] = value
    return state
