"""Per-example Conv2d weight gradients on the CPU, layer by layer of a config's UNet: each kernel of
``dpsad.privacy.mechanism.per_example`` (the CPU engine, and im2col everywhere) against the batch's own weight gradient
(what a non-private step pays).

The inputs and output gradients are those of one batched forward and backward of the diffusion loss on random
images, as the DP step sees them.  Each layer's kernels run in turn, ``--repeats`` times, and the medians are
printed (ms), with the total of the layers per kernel.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_conv_gradients.py --batch 256
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from stage_throughput import load

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.config.resources import configured_shape
from dpsad.models.unet import UNet, UNetConfig
from dpsad.privacy.mechanism import per_example
from dpsad.training.diffusion_training import diffusion_example_loss


def batch_weight_gradient(conv, a, g, n):
    """The summed weight gradient of the batch: a non-private step's cost for this layer."""
    return torch.nn.grad.conv2d_weight(a, conv.weight.shape, g, stride=conv.stride, padding=conv.padding,
                                       dilation=conv.dilation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a config merged over config/config.yaml (default: the demo's)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load(args.config, False)
    shape = configured_shape(config["data"][config["datasets"][0]])
    unet = UNet(UNetConfig(image_size=shape.image_size, in_channels=shape.channels, num_classes=10, **config["model"]))
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=config["diffusion"]["timesteps"]))
    loss = diffusion_example_loss(diffusion)
    b, size = args.batch, shape.image_size
    inputs = (torch.randn(b, shape.channels, size, size), torch.randint(0, diffusion.num_timesteps, (b, 1)),
              torch.randint(0, 11, (b,)), torch.randn(b, 1, shape.channels, size, size))
    kernels = {"cpu engine": ("grouped", per_example._conv_weight_gradients),  # im2col below 8x8 and at 1x1
               "im2col": ("im2col", per_example._conv_weight_gradients),
               "batch (non-DP)": (None, batch_weight_gradient)}
    print(f"{args.config or 'config/config.yaml'}: per-example Conv2d weight gradients, batch {b}, "
          f"{args.threads} threads, median of {args.repeats} (ms)")
    print("| layer | input | kernel | " + " | ".join(kernels) + " |")
    print("|---|---|---|" + "---|" * len(kernels))
    totals = dict.fromkeys(kernels, 0.0)
    original = per_example.conv_engine
    try:
        for name, module, pairs in per_example.layer_calls(unet, loss.batched, inputs):
            if not isinstance(module, torch.nn.Conv2d):
                continue
            a, g = pairs[0]
            times = {label: [] for label in kernels}
            for _ in range(args.repeats):
                for label, (engine, kernel) in kernels.items():
                    per_example.conv_engine = lambda device, rows, engine=engine: engine  # noqa: E731
                    start = time.perf_counter()
                    kernel(module, a, g, b)
                    times[label].append(time.perf_counter() - start)
            medians = {label: statistics.median(v) * 1000 for label, v in times.items()}
            for label, value in medians.items():
                totals[label] += value
            print(f"| {name} | {tuple(a.shape[1:])} | {module.kernel_size[0]}x{module.kernel_size[1]}"
                  f"/{module.stride[0]} | " + " | ".join(f"{v:.2f}" for v in medians.values()) + " |")
    finally:
        per_example.conv_engine = original
    print("| total | | | " + " | ".join(f"{v:.1f}" for v in totals.values()) + " |")


if __name__ == "__main__":
    main()
