"""Conditional UNet for 28, 32 and 64 pixel images, with a null class for classifier-free guidance."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from .layers import ResBlock, SelfAttention, group_norm, timestep_embedding


@dataclass(frozen=True)
class UNetConfig:
    """Architecture of :class:`UNet`; stored in checkpoints so a model rebuilds itself."""

    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10  # 0 for unconditional; label ``num_classes`` is the null class
    base_channels: int = 32
    channel_mult: tuple[int, ...] = (1, 2, 2)
    num_res_blocks: int = 1
    attention_resolutions: tuple[int, ...] = field(default_factory=tuple)
    groups: int = 8
    time_embed_dim: int = 128

    @classmethod
    def from_dict(cls, values: dict) -> "UNetConfig":
        values = dict(values)
        values["channel_mult"] = tuple(values.get("channel_mult", (1, 2, 2)))
        values["attention_resolutions"] = tuple(values.get("attention_resolutions", ()))
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


class UNet(nn.Module):
    """x: [N,C,H,W] in [-1, 1], t: [N] int64 in [0, T), y: [N] int64 in [0, num_classes] -> [N,C,H,W].

    The output is the diffusion parameterisation's target (noise or x_{t-1});
    the network does not know which.  Resolutions that do not halve evenly
    (28 -> 14 -> 7) are handled by padding-free stride-2 convolutions and
    size-matched upsampling.
    """

    def __init__(self, config: UNetConfig):
        super().__init__()
        self.config = config
        ch, emb_dim, groups = config.base_channels, config.time_embed_dim, config.groups
        self.time_mlp = nn.Sequential(nn.Linear(emb_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.class_embed = nn.Embedding(config.num_classes + 1, emb_dim)
        self.stem = nn.Conv2d(config.in_channels, ch, 3, padding=1)

        self.down = nn.ModuleList()
        skip_channels = [ch]
        current, resolution = ch, config.image_size
        for level, mult in enumerate(config.channel_mult):
            for _ in range(config.num_res_blocks):
                block = nn.ModuleList([ResBlock(current, ch * mult, emb_dim, groups)])
                current = ch * mult
                if resolution in config.attention_resolutions:
                    block.append(SelfAttention(current, groups))
                self.down.append(block)
                skip_channels.append(current)
            if level < len(config.channel_mult) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(current, current, 3, stride=2, padding=1)]))
                skip_channels.append(current)
                resolution = (resolution + 1) // 2

        self.mid1 = ResBlock(current, current, emb_dim, groups)
        self.mid_attn = SelfAttention(current, groups)
        self.mid2 = ResBlock(current, current, emb_dim, groups)

        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(config.channel_mult))):
            for _ in range(config.num_res_blocks + 1):
                block = nn.ModuleList([ResBlock(current + skip_channels.pop(), ch * mult, emb_dim, groups)])
                current = ch * mult
                if resolution in config.attention_resolutions:
                    block.append(SelfAttention(current, groups))
                self.up.append(block)
            if level > 0:
                self.up.append(nn.ModuleList([nn.Conv2d(current, current, 3, padding=1)]))
                resolution = resolution * 2
        self.out_norm = group_norm(current, groups)
        self.out_conv = nn.Conv2d(current, config.in_channels, 3, padding=1)

    @property
    def null_class(self) -> int:
        return self.config.num_classes

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        emb = self.time_mlp(timestep_embedding(t, self.config.time_embed_dim)) + self.class_embed(y)
        h = self.stem(x)
        skips = [h]
        for block in self.down:
            if isinstance(block[0], ResBlock):
                h = block[0](h, emb)
                for extra in block[1:]:
                    h = extra(h)
            else:
                h = block[0](h)
            skips.append(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb)), emb)
        for block in self.up:
            if isinstance(block[0], ResBlock):
                h = block[0](torch.cat([h, skips.pop()], dim=1), emb)
                for extra in block[1:]:
                    h = extra(h)
            else:
                h = block[0](F.interpolate(h, size=skips[-1].shape[-2:], mode="nearest"))
        return self.out_conv(F.silu(self.out_norm(h)))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def xavier_init(model: nn.Module) -> nn.Module:
    """Xavier-uniform weights and zero biases for every conv and linear layer (the paper's student init)."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return model
