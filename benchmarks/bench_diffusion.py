"""Teacher training step time and peak memory; DDPM and DDIM sampling throughput (images per second)."""

from __future__ import annotations

import argparse

import torch

from _common import peak_rss_mb, timed
from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.models.unet import UNet, UNetConfig, count_parameters
from dpsad.sampling.solvers import ddim_sample, ddpm_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--base-channels", type=int, default=16)
    parser.add_argument("--channel-mult", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sample-batch", type=int, default=100)
    parser.add_argument("--ddim-steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=28)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    model = UNet(UNetConfig(image_size=args.image_size, in_channels=1, num_classes=10, base_channels=args.base_channels,
                            channel_mult=tuple(args.channel_mult))).to(device)
    diffusion = GaussianDiffusion(DiffusionConfig())
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x0 = torch.rand(args.batch, 1, args.image_size, args.image_size, device=device) * 2 - 1
    y = torch.randint(0, 11, (args.batch,), device=device)

    def train_step():
        t = torch.randint(0, 500, (args.batch,), device=device)
        loss = diffusion.training_losses(model, x0, t, y, torch.randn_like(x0)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    step = timed(train_step, repeats=10, warmup=2)
    print(f"device {device}, threads {args.threads}, UNet {args.image_size}x{args.image_size} with {count_parameters(model):,} parameters")
    print(f"teacher training step, batch {args.batch}: {step:.3f} s  ({args.batch / step:.0f} images/s)")
    print(f"peak resident memory after training steps: {peak_rss_mb():.0f} MiB")

    model.eval()
    labels = torch.arange(args.sample_batch, device=device) % 10
    shape = (args.sample_batch, 1, args.image_size, args.image_size)
    ddim = timed(lambda: ddim_sample(model, diffusion, shape, labels, steps=args.ddim_steps), repeats=1, warmup=0)
    print(f"DDIM {args.ddim_steps} steps: {args.sample_batch / ddim:.1f} images/s ({ddim:.1f} s for {args.sample_batch})")
    ddim_g = timed(lambda: ddim_sample(model, diffusion, shape, labels, steps=args.ddim_steps, guidance=1.8), repeats=1, warmup=0)
    print(f"DDIM {args.ddim_steps} steps, guidance 1.8: {args.sample_batch / ddim_g:.1f} images/s")
    small = (max(1, args.sample_batch // 4), 1, args.image_size, args.image_size)
    ddpm = timed(lambda: ddpm_sample(model, diffusion, small, labels[: small[0]]), repeats=1, warmup=0)
    print(f"DDPM {diffusion.num_timesteps} steps: {small[0] / ddpm:.2f} images/s ({ddpm:.1f} s for {small[0]})")
    print(f"peak resident memory: {peak_rss_mb():.0f} MiB")


if __name__ == "__main__":
    main()
