"""The DP step of dpsad's own engine against Opacus's, on the same model and batch.

dpsad forms clipped sums itself (src/dpsad/privacy/mechanism/dpsgd.py: torch.func vmap, its own hooks, or the ghost
engine of src/dpsad/privacy/mechanism/clipped_sum.py, which takes a layer's norms from Gram matrices where that is cheaper
than its per-example gradients); Opacus's GradSampleModule (hooks) is the field's standard engine.  For one diffusion UNet and one
batch (one noise draw per record, so a row of the batch is a record), each engine computes the clipped sum of
per-example gradients plus N(0, sigma^2 C^2) noise; the script checks that both clipped sums agree (noise
off), then prints the median time of each step beside a plain non-private step.

    .venv/bin/python benchmarks/bench_opacus.py                      # the demo's UNet, 16x16, batch 128
    .venv/bin/python benchmarks/bench_opacus.py --paper --batch 256  # a 28x28 UNet of 1.08M parameters

Ghost clipping (Opacus's GradSampleModuleFastGradientClipping) is not measured: it needs the loss to be
formed by Opacus's own criterion wrapper, which the per-example diffusion loss here is not.
"""

from __future__ import annotations

import argparse
import copy

import torch
from _common import timed

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.models.unet import UNet, UNetConfig
from dpsad.privacy.mechanism.dpsgd import CLIP_MARGIN, DPSGD, full_precision
from dpsad.training.diffusion_training import diffusion_example_loss

DEMO = {"image_size": 16, "base_channels": 16, "channel_mult": (1, 2, 2), "groups": 8, "time_embed_dim": 128}
PAPER = {"image_size": 28, "base_channels": 32, "channel_mult": (1, 2, 2), "groups": 8, "time_embed_dim": 128}


def generator_on(device: torch.device, seed: int) -> torch.Generator:
    """A seeded generator of ``device``: torch draws on a GPU only from a generator of that GPU."""
    return torch.Generator(device=device).manual_seed(seed)


def opacus_step(gsm, diffusion, batch, *, clip: float, sigma: float, generator: torch.Generator) -> dict:
    """Opacus's per-example gradients (hooks), clipped to ``clip`` per record, summed, plus noise drawn from
    ``generator`` (of the batch's device)."""
    x0, t, y, noise = batch
    gsm.zero_grad(set_to_none=True)
    xt = diffusion.q_sample(x0, t[:, 0], noise[:, 0])
    per_example = diffusion.output_mse(gsm(xt, t[:, 0], y), diffusion.target(x0, xt, t[:, 0], noise[:, 0]), t[:, 0])
    per_example.sum().backward()
    params = [p for p in gsm.parameters() if p.requires_grad]
    norms = torch.stack([p.grad_sample.flatten(1).norm(dim=1) for p in params]).norm(dim=0)
    factor = (clip * (1.0 - CLIP_MARGIN) / (norms + 1e-12)).clamp(max=1.0)  # dpsad's clip target, for equal sums
    out = {}
    for (name, p) in ((n, p) for n, p in gsm.named_parameters() if p.requires_grad):
        summed = torch.einsum("b,b...->...", factor, p.grad_sample)
        out[name.removeprefix("_module.")] = summed + sigma * clip * torch.randn(summed.shape, generator=generator,
                                                                                 device=summed.device)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paper", action="store_true", help="a 28x28 UNet of 1.08M parameters (base 32)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from opacus import GradSampleModule

    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = PAPER if args.paper else DEMO
    torch.manual_seed(0)
    model = UNet(UNetConfig(in_channels=1, num_classes=10, **shape)).to(device)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=500))
    size, b = shape["image_size"], args.batch
    gen = torch.Generator(device="cpu").manual_seed(1)
    batch = tuple(v.to(device) for v in (torch.rand(b, 1, size, size, generator=gen) * 2 - 1,
                                         torch.randint(0, 500, (b, 1), generator=gen), torch.randint(0, 10, (b,), generator=gen),
                                         torch.randn(b, 1, 1, size, size, generator=gen)))
    loss = diffusion_example_loss(diffusion)
    gsm = GradSampleModule(copy.deepcopy(model))
    clip = 0.1

    engines = {}

    def dpsad_step(mode: str, sigma: float) -> dict:
        # one engine per mode, as a training makes: its hooks' self-check runs on its first step only
        key = (mode, sigma)
        if key not in engines:
            engines[key] = DPSGD(model, loss, noise_multiplier=sigma, clip_norm=clip, expected_batch_size=1.0,
                                 noise_generator=generator_on(device, 2), microbatch_size=b, per_example=mode)
        model.zero_grad(set_to_none=True)
        engines[key].step_gradients(batch)
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    # both engines must give the same clipped sum before their times mean anything; compared in full fp32, since
    # under PyTorch's defaults a GPU's cuDNN convolutions round to TF32 (10-bit mantissa), differently in each
    # engine's kernels (relative 1e-3 on an H100); the timings below keep the defaults
    with full_precision():
        theirs = opacus_step(gsm, diffusion, batch, clip=clip, sigma=0.0, generator=generator_on(device, 3))
        worst = max((ours[n] - theirs[n]).abs().max().item() / (ours[n].abs().max().item() + 1e-12)
                    for ours in (dpsad_step("vmap", 0.0), dpsad_step("hooks", 0.0), dpsad_step("ghost", 0.0))
                    for n in ours)
    print(f"{device.type}, {'paper' if args.paper else 'demo'} UNet ({sum(p.numel() for p in model.parameters()):,} "
          f"parameters, {size}x{size}), batch {b}, {args.threads} threads: clipped sums agree to {worst:.1e} (relative)")

    def plain():
        model.zero_grad(set_to_none=True)
        loss.batched(model, *batch).mean().backward()

    rows = [("non-private step", timed(plain, args.repeats))]
    for mode in ("vmap", "hooks", "ghost"):
        rows.append((f"dpsad DPSGD, per_example {mode}", timed(lambda: dpsad_step(mode, 1.0), args.repeats)))
    rows.append(("Opacus GradSampleModule (hooks) + clip + noise",
                 timed(lambda: opacus_step(gsm, diffusion, batch, clip=clip, sigma=1.0,
                                           generator=generator_on(device, 4)), args.repeats)))
    print("| step | median s | / non-private |\n|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.4f} | {seconds / rows[0][1]:.2f} |")
    if worst > 2e-3:  # the ghost engine clips to C(1 - 1e-3), the others to C(1 - 1e-5)
        raise SystemExit(f"the engines disagree (relative {worst:.1e}): timings not comparable")


if __name__ == "__main__":
    main()
