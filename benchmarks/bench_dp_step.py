"""One DP-SAD student step (per-example gradients, clipping, noise) against the same step without DP."""

from __future__ import annotations

import argparse

import torch

from _common import peak_rss_mb, timed
from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.models.discriminator import Discriminator, DiscriminatorConfig
from dpsad.models.unet import UNet, UNetConfig, count_parameters
from dpsad.privacy.mechanism import DPSGD
from dpsad.training.losses import student_loss
from dpsad.training.student import frozen_params, student_example_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatch", type=int, default=64)
    parser.add_argument("--timesteps-per-example", type=int, default=1)
    parser.add_argument("--base-channels", type=int, default=16)
    parser.add_argument("--channel-mult", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    b, k = args.batch, args.timesteps_per_example

    student = UNet(UNetConfig(image_size=28, in_channels=1, num_classes=10, base_channels=args.base_channels,
                              channel_mult=tuple(args.channel_mult))).to(device)
    disc = Discriminator(DiscriminatorConfig()).to(device)
    diffusion = GaussianDiffusion(DiffusionConfig())
    weights = {"teacher_weight": 1.0, "data_weight": 1.0, "adv_weight": 1.0}
    loss = student_example_loss(diffusion, disc, {"p": frozen_params(disc)}, weights)
    inputs = (torch.rand(b, 1, 28, 28, device=device) * 2 - 1, torch.randint(0, 500, (b, k), device=device),
              torch.randint(0, 11, (b,), device=device), torch.randn(b, k, 1, 28, 28, device=device),
              torch.randn(b, k, 1, 28, 28, device=device))
    opt = torch.optim.Adam(student.parameters(), lr=1e-4)
    engine = DPSGD(student, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=b,
                   noise_generator=torch.Generator(device=device).manual_seed(0), microbatch_size=args.microbatch)

    def dp_step():
        opt.zero_grad()
        engine.step_gradients(inputs)
        opt.step()

    def plain_step():
        opt.zero_grad()
        batched_student_loss(student, disc, diffusion, weights, inputs).backward()
        opt.step()

    dp = timed(dp_step, repeats=5, warmup=1)
    plain = timed(plain_step, repeats=5, warmup=1)
    print(f"device {device}, threads {args.threads}, student {count_parameters(student):,} parameters, batch {b}, K {k}")
    print(f"non-private step: {plain:.3f} s")
    print(f"DP step (vmap per-example gradients, clip, noise): {dp:.3f} s  -> {dp / plain:.2f}x")
    print(f"peak resident memory: {peak_rss_mb():.0f} MiB")


def batched_student_loss(student, disc, diffusion, weights, inputs):
    """The same loss as the DP step, for the whole batch in one forward and one backward pass."""
    x0, t, y, noise, teacher_out = inputs
    b, k = t.shape
    shape = x0.shape[1:]
    x0k = x0[:, None].expand(b, k, *shape).reshape(b * k, *shape)
    tk, yk = t.reshape(-1), y[:, None].expand(b, k).reshape(-1)
    noisek = noise.reshape(b * k, *shape)
    xt = diffusion.q_sample(x0k, tk, noisek)
    s_out = student(xt, tk, yk)
    logits = torch.func.functional_call(disc, frozen_params(disc), (diffusion.eps_from_output(s_out, xt, tk), tk, yk))
    return student_loss(s_out, teacher_out.reshape(b * k, *shape), diffusion.target(x0k, xt, tk, noisek), logits, tk,
                        diffusion, **weights).mean()


if __name__ == "__main__":
    main()
