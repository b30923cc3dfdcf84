"""Throughput of every training stage of a config, its DP/non-DP ratio and peak memory, plus sampling.

Builds each stage's models as the config does (teacher UNet, DP-SAD student
and discriminator, DPDM with its noise multiplicity, dp-GAN critic with grouped
clipping, MoCo) and runs ``--steps`` steps on random images of the dataset's
size: the DP step (per-example gradients, clipping, noise, as in training)
and the same loss without DP.  Then it draws ``--samples`` images with the
config's sampler.  No data is read; the figures are speed and memory only.

    .venv/bin/python benchmarks/stage_throughput.py --config config/paper/mnist.yaml --steps 300 --samples 10000
    .venv/bin/python benchmarks/stage_throughput.py --tiny       # seconds, on a CPU (what CI runs)

``benchmarks/gpu_smoke.sh`` picks the first form on a CUDA machine and the second elsewhere.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import yaml
from _common import peak_rss_mb

from dpsad.config import deep_merge, dpdm_settings, dpgan_settings, student_settings, validate_config
from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.gan.losses import critic_example_loss
from dpsad.gan.models import Critic, GANConfig
from dpsad.gan.train import group_parameters
from dpsad.jobs.resources import configured_shape, work_bound
from dpsad.moco.augment import two_views
from dpsad.moco.model import MoCo
from dpsad.models.discriminator import Discriminator, DiscriminatorConfig
from dpsad.models.unet import UNet, UNetConfig
from dpsad.privacy.mechanism import DPSGD
from dpsad.sampling.solvers import SAMPLERS
from dpsad.training.student import (
    discriminator_example_loss,
    frozen_params,
    select_trainable,
    student_example_loss,
)
from dpsad.training.diffusion_loop import diffusion_example_loss

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model": {"base_channels": 8, "channel_mult": [1, 2], "num_res_blocks": 1, "attention_resolutions": [],
                  "groups": 4, "time_embed_dim": 32},
        "sample": {"steps": 10}}


class Meter:
    """Wall time per step and peak memory (GPU allocator on CUDA, process RSS on CPU) of one loop."""

    def __init__(self, device):
        self.device = device

    def run(self, step, steps: int) -> tuple[float, float]:
        step()  # warm-up (and the hooks' one-time check)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
        else:
            peak = peak_rss_mb()
        return (time.perf_counter() - start) / steps, peak


def load(config_path: str | None, tiny: bool) -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if config_path:
        config = deep_merge(config, yaml.safe_load(Path(config_path).read_text()))
    if tiny:
        config = deep_merge(config, TINY)
    return validate_config(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a config merged over config/config.yaml (default: the demo's)")
    parser.add_argument("--tiny", action="store_true", help="a tiny UNet, batch 8, 2 steps, 20 samples in 10 steps")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.tiny:
        args.steps, args.samples = 2, 20
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = load(args.config, args.tiny)
    run = {"name": "bench", "method": "dpsad", "target_epsilon": 10.0, "delta": 1e-5}
    size, classes = args.image_size, 10
    unet_config = UNetConfig(image_size=size, in_channels=1, num_classes=classes, **config["model"])
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=config["diffusion"]["timesteps"],
                                                  beta_start=config["diffusion"]["beta_start"],
                                                  beta_end=config["diffusion"]["beta_end"],
                                                  parameterization=config["diffusion"]["parameterization"]))
    meter = Meter(device)
    rows = []

    def images(b, k=None):
        shape = (b, 1, size, size) if k is None else (b, k, 1, size, size)
        return torch.randn(shape, device=device).clamp(-1, 1)

    def timesteps(b, k):
        return torch.randint(0, diffusion.num_timesteps, (b, k), device=device)

    def labels(b):
        return torch.randint(0, classes + 1, (b,), device=device)

    def measure(stage, batch, model, example_loss, inputs, engine_kwargs=None, plain_loss=None):
        """Time the DP step and (when the loss has a plain batched form) the same step without DP."""
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        engine = DPSGD(model, example_loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=batch,
                       noise_generator=torch.Generator(device=device).manual_seed(0), **(engine_kwargs or {}))

        def dp_step():
            opt.zero_grad()
            engine.step_gradients(inputs)
            opt.step()

        dp_s, dp_peak = meter.run(dp_step, args.steps)
        plain_s = None
        batched = plain_loss or getattr(example_loss, "batched", None)
        if batched is not None:
            def plain_step():
                opt.zero_grad()
                batched(model, *inputs).mean().backward()
                opt.step()
            plain_s, _ = meter.run(plain_step, args.steps)
        rows.append((stage, batch, engine.per_example, batch / dp_s, dp_peak, plain_s and dp_s / plain_s))

    def dp_batch(settings: dict, method: str) -> int:
        """A DP stage's expected batch: its own, else the largest the dp_sizing rule may give at the config's n."""
        return work_bound(settings, method, configured_shape(config["data"][config["datasets"][0]]).private)[1]

    # teacher (no DP) -------------------------------------------------------------------------------
    teacher_batch = 8 if args.tiny else config["teachers"]["public"]["batch_size"]
    teacher = UNet(unet_config).to(device)
    t_loss = diffusion_example_loss(diffusion)
    t_inputs = (images(teacher_batch), timesteps(teacher_batch, 1), labels(teacher_batch), images(teacher_batch, 1))
    t_opt = torch.optim.Adam(teacher.parameters(), lr=1e-4)

    def teacher_step():
        t_opt.zero_grad()
        t_loss.batched(teacher, *t_inputs).mean().backward()
        t_opt.step()

    s, peak = meter.run(teacher_step, args.steps)
    rows.append(("teacher", teacher_batch, "-", teacher_batch / s, peak, None))

    # DPDM: DP-SGD on the teacher's loss with K noise draws per example ------------------------------
    dpdm = dpdm_settings(config, {**run, "method": "dpdm"})
    b, k = (8 if args.tiny else dp_batch(dpdm, "dpdm")), dpdm["timesteps_per_example"]
    measure("dpdm", b, UNet(unet_config).to(device), diffusion_example_loss(diffusion),
            (images(b), timesteps(b, k), labels(b), images(b, k)),
            {"microbatch_size": dpdm["dp"]["microbatch_size"]})

    # DP-SAD student and its discriminator ----------------------------------------------------------
    st = student_settings(config, run)
    b, k = (8 if args.tiny else dp_batch(st, "student")), st["timesteps_per_example"]
    student = UNet(unet_config).to(device)
    select_trainable(student, st["trainable"])
    disc = Discriminator(DiscriminatorConfig(image_size=size, in_channels=1, num_classes=classes,
                                             base_channels=st["discriminator"]["base_channels"])).to(device)
    weights = {"teacher_weight": st["teacher_weight"], "data_weight": st["data_weight"], "adv_weight": st["adv_weight"]}
    measure(f"dpsad student ({st['trainable']})", b, student,
            student_example_loss(diffusion, disc, {"p": frozen_params(disc)}, weights),
            (images(b), timesteps(b, k), labels(b), images(b, k), images(b, k)),
            {"microbatch_size": st["dp"]["microbatch_size"]})
    measure("dpsad discriminator", b, disc, discriminator_example_loss(),
            (images(b, k), images(b, k), timesteps(b, k), labels(b)), {"microbatch_size": st["dp"]["microbatch_size"]})

    # dp-GAN critic: gradient penalty inside the per-example loss, grouped clipping -----------------
    gan = dpgan_settings(config, run)
    b = 8 if args.tiny else dp_batch(gan, "dpgan")
    critic = Critic(GANConfig(image_size=size, in_channels=1, num_classes=classes, latent_dim=gan["latent_dim"],
                              width=gan["width"])).to(device)
    group_of = group_parameters(critic, "weight_bias" if gan["grouping"] == "cluster" else gan["grouping"], None, gan["groups"])
    groups = max(group_of.values()) + 1

    def critic_plain(model, real, fake, rho, y):
        """The critic's per-example losses (gradient penalty included) in one batched pass."""
        r = rho[:, None, None, None]
        x_hat = (r * real + (1 - r) * fake).requires_grad_(True)
        (g,) = torch.autograd.grad(model(x_hat, y).sum(), x_hat, create_graph=True)
        penalty = (g.flatten(1).norm(dim=1) - 1.0) ** 2
        return model(fake, y).reshape(-1) - model(real, y).reshape(-1) + gan["gp_weight"] * penalty

    measure(f"dpgan critic ({groups} clipping groups)", b, critic, critic_example_loss(gan["gp_weight"]),
            (images(b), images(b), torch.rand(b, device=device), labels(b) % classes),
            {"microbatch_size": gan["dp"]["microbatch_size"], "group_of": group_of, "group_bounds": [1.0] * groups},
            plain_loss=critic_plain)

    # MoCo (public split, no DP) ---------------------------------------------------------------------
    moco = config["moco"]
    b = 8 if args.tiny else moco["batch_size"]
    model = MoCo(1, moco["feature_dim"], moco["queue_size"], moco["momentum"], moco["temperature"]).to(device)
    m_opt = torch.optim.SGD(model.query.parameters(), lr=moco["lr"], momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    batch_images = torch.rand(b, 1, size, size)

    def moco_step():
        view_q, view_k = two_views(batch_images, gen)
        loss = model(view_q.to(device), view_k.to(device)).mean()
        m_opt.zero_grad()
        loss.backward()
        m_opt.step()

    s, peak = meter.run(moco_step, args.steps)
    rows.append(("moco", b, "-", b / s, peak, None))

    # sampling ---------------------------------------------------------------------------------------
    sample = config["sample"]
    teacher.eval()
    batch = min(sample["batch_size"], args.samples)
    kwargs = {"guidance": sample["guidance"], "steps": sample["steps"]}
    if sample["sampler"] == "ddim":
        kwargs["eta"] = sample["eta"]
    if sample["sampler"] == "ddpm":
        kwargs.pop("steps")
    draw = SAMPLERS[sample["sampler"]]

    def sample_all():
        for start in range(0, args.samples, batch):
            n = min(batch, args.samples - start)
            draw(teacher, diffusion, (n, 1, size, size), torch.arange(n, device=device) % classes, **kwargs)

    start = time.perf_counter()
    sample_all()
    if device.type == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else peak_rss_mb()
    rows.append((f"sample {sample['sampler']} {sample['steps']} steps, {args.samples} images", batch, "-",
                 args.samples / s, peak, None))

    name = args.config or "config/config.yaml"
    print(f"{name}{' (tiny)' if args.tiny else ''} on {device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if device.type == 'cuda' else ''}, {args.steps} steps per stage")
    print("| stage | batch | per-example | images/s | peak memory MiB | DP / non-DP step |")
    print("|---|---|---|---|---|---|")
    for stage, batch, method, rate, peak, ratio in rows:
        print(f"| {stage} | {batch} | {method} | {rate:.1f} | {peak:.0f} | {f'{ratio:.2f}x' if ratio else '-'} |")


if __name__ == "__main__":
    main()
