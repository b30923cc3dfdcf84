"""Throughput of every training stage of a config, its DP/non-DP ratio and peak memory, plus sampling.

Builds each stage's models as the config does (teacher UNet, DP-SAD student
and discriminator, DPDM with its noise multiplicity, dp-GAN critic with grouped
clipping, MoCo) and runs ``--steps`` steps on random images of the dataset's
size: the DP step (per-example gradients, clipping, noise, as in training,
with the per-example engine each stage's ``dp.per_example`` sets) and the same
loss without DP, in turn (each stage's figures are the medians of its steps).
Then it draws ``--samples`` images with the config's sampler.
No data is read; the figures are speed and memory only.

    .venv/bin/python benchmarks/stage_throughput.py --config config/paper/mnist.yaml --steps 300 --samples 10000
    .venv/bin/python benchmarks/stage_throughput.py ... --per-example ghost   # every DP stage with one engine
    .venv/bin/python benchmarks/stage_throughput.py ... --largest-batch       # on a GPU: the largest batch that fits
    .venv/bin/python benchmarks/stage_throughput.py --tiny       # seconds, on a CPU (what CI runs)

``benchmarks/gpu_smoke.sh`` picks the first form on a CUDA machine and the second elsewhere.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml
from _common import peak_rss_mb

from dpsad.config import deep_merge, dpdm_settings, dpgan_settings, student_settings, validate_config
from dpsad.data.sources import CELEBA_HAIR_ATTRS
from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.gan.losses import critic_example_loss
from dpsad.gan.models import Critic, GANConfig
from dpsad.gan.train import group_parameters
from dpsad.config.resources import configured_shape, work_bound
from dpsad.moco.augment import two_views
from dpsad.moco.model import MoCo
from dpsad.models.discriminator import Discriminator, DiscriminatorConfig
from dpsad.models.unet import UNet, UNetConfig
from dpsad.privacy.mechanism.dpsgd import DPSGD
from dpsad.sampling.solvers import SAMPLERS
from dpsad.training.student import (
    discriminator_example_loss,
    frozen_params,
    select_trainable,
    student_example_loss,
)
from dpsad.training.diffusion_training import diffusion_example_loss

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


    def alternate(self, first, second, steps: int) -> tuple[float, float, float]:
        """Median seconds a step of ``first`` and of ``second``, run in turn (a machine whose speed drifts, as a
        shared one does by 10-20% within a minute, then moves both alike), and the peak memory of both."""
        first(), second()  # warm-up (and the engines' one-time check)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = ([], [])
        for _ in range(steps):
            for step, kept in zip((first, second), times):
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                step()
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                kept.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() / 2**20 if self.device.type == "cuda" else peak_rss_mb()
        return statistics.median(times[0]), statistics.median(times[1]), peak


def largest_fitting(fits, start: int, limit: int = 1 << 16) -> int:
    """The largest batch b <= ``limit`` with ``fits(b)`` true, by doubling from ``start`` then halving the gap
    (``fits`` is monotone: what fits at b fits below it).  0 when not even ``start`` fits."""
    if not fits(start):
        return 0
    low, high = start, None
    while high is None and low < limit:
        if fits(min(2 * low, limit)):
            low = min(2 * low, limit)
        else:
            high = min(2 * low, limit)
    if high is None:
        return low
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def fits_on_the_card(step_at, device) -> "callable":
    """``fits(b)``: whether ``step_at(b)`` (one DP step with a physical batch of b) runs without running out of
    the GPU's memory or past a kernel's 32-bit index range (on an H200 vmap's convolutions hit that first)."""
    def fits(b: int) -> bool:
        try:
            step_at(b)
            torch.cuda.synchronize(device)
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        except RuntimeError as error:
            if "32BitIndexMath" in str(error):
                return False
            raise
        finally:
            torch.cuda.empty_cache()
    return fits


def configured_classes(section: dict) -> int:
    """The classes a dataset's config section names (CelebA's hair colours: 3; its gender: 2), else 10: the
    release draws ``n_per_class`` images of each, so the sampling hours depend on it."""
    if section.get("class_names"):
        return len(section["class_names"])
    if section.get("num_classes"):
        return int(section["num_classes"])
    if section["source"] == "celeba":  # the loader's classes: one per hair colour, or female and male
        return len(CELEBA_HAIR_ATTRS) if section.get("label", "hair") == "hair" else 2
    return 10


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
    parser.add_argument("--image-size", type=int, help="default: the config's dataset's (28 for the demo's models)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-example", choices=["auto", "ghost", "hooks", "vmap"],
                        help="the engine of the DP stages whose loss has a batched form (the dp-GAN critic's has none); "
                             "default: each stage's dp.per_example in the config")
    parser.add_argument("--largest-batch", action="store_true",
                        help="on a GPU, also the largest physical batch (microbatch) of each DP stage that fits")
    parser.add_argument("--hours", action="store_true",
                        help="also each stage's hours at the config's schedule: its examples (epochs x n, steps x "
                             "batch, images to draw) over the measured images/s")
    args = parser.parse_args()
    if args.tiny:
        args.steps, args.samples = 2, 20
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = load(args.config, args.tiny)
    run = {"name": "bench", "method": "dpsad", "target_epsilon": 10.0, "delta": 1e-5}
    shape = configured_shape(config["data"][config["datasets"][0]])
    default_size = 28 if args.config is None else shape.image_size
    size, channels = args.image_size or default_size, shape.channels
    classes = configured_classes(config["data"][config["datasets"][0]])
    schedule = {}  # stage -> the examples its training (or sampling) processes at the config's schedule
    unet_config = UNetConfig(image_size=size, in_channels=channels, num_classes=classes, **config["model"])
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=config["diffusion"]["timesteps"],
                                                  beta_start=config["diffusion"]["beta_start"],
                                                  beta_end=config["diffusion"]["beta_end"],
                                                  parameterization=config["diffusion"]["parameterization"]))
    meter = Meter(device)
    name = args.config or "config/config.yaml"
    print(f"{name}{' (tiny)' if args.tiny else ''} on {device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if device.type == 'cuda' else ''}, {args.steps} steps per stage")
    hours = (" | hours at the schedule", "|---") if args.hours else ("", "")
    print(f"| stage | batch | per-example | images/s | peak memory MiB | DP / non-DP step | largest physical batch"
          f"{hours[0]} |")
    print(f"|---|---|---|---|---|---|---{hours[1]}|", flush=True)

    def emit(stage, batch, method, rate, peak, ratio, largest):
        """One stage's row, printed as soon as it is measured (a run stopped at a time limit keeps its rows)."""
        line = (f"| {stage} | {batch} | {method} | {rate:.1f} | {peak:.0f} | {f'{ratio:.2f}x' if ratio else '-'} | "
                f"{largest if largest is not None else '-'}")
        if args.hours:
            line += f" | {schedule[stage] / rate / 3600:.2f}" if stage in schedule else " | -"
        print(line + " |", flush=True)

    def images(b, k=None):
        shape = (b, channels, size, size) if k is None else (b, k, channels, size, size)
        return torch.randn(shape, device=device).clamp(-1, 1)

    def timesteps(b, k):
        return torch.randint(0, diffusion.num_timesteps, (b, k), device=device)

    def labels(b):
        return torch.randint(0, classes + 1, (b,), device=device)

    def measure(stage, batch, model, example_loss, inputs, engine_kwargs=None, plain_loss=None, make_inputs=None):
        """Time the DP step and (when the loss has a plain batched form) the same step without DP; with
        ``--largest-batch`` on a GPU, the largest physical batch of the DP step (``make_inputs(b)``: a batch of b).
        ``--per-example`` replaces the config's engine where the loss has a batched form."""
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        kwargs = {**(engine_kwargs or {})}
        if args.per_example and getattr(example_loss, "batched", None) is not None:
            kwargs["per_example"] = args.per_example
        engine = DPSGD(model, example_loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=batch,
                       noise_generator=torch.Generator(device=device).manual_seed(0), **kwargs)

        def dp_step():
            opt.zero_grad()
            engine.step_gradients(inputs)
            opt.step()

        plain_s = None
        batched = plain_loss or getattr(example_loss, "batched", None)
        if batched is not None:
            def plain_step():
                opt.zero_grad()
                batched(model, *inputs).mean().backward()
                opt.step()
            dp_s, plain_s, dp_peak = meter.alternate(dp_step, plain_step, args.steps)
        else:
            dp_s, dp_peak = meter.run(dp_step, args.steps)
        largest = None
        if args.largest_batch and device.type == "cuda" and make_inputs is not None:
            def step_at(b):
                trial = DPSGD(model, example_loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=b,
                              noise_generator=torch.Generator(device=device).manual_seed(0),
                              **{**kwargs, "microbatch_size": b})
                trial._engine_checked = True  # the engine's check ran above; here only memory counts
                opt.zero_grad()
                trial.step_gradients(make_inputs(b))
            largest = largest_fitting(fits_on_the_card(step_at, device), 8)
        emit(stage, batch, engine.per_example, batch / dp_s, dp_peak, plain_s and dp_s / plain_s, largest)

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
    public_teacher = config["teachers"]["public"]
    schedule["teacher"] = float(public_teacher["steps"]) * float(public_teacher["batch_size"])
    emit("teacher", teacher_batch, "-", teacher_batch / s, peak, None, None)

    # DPDM: DP-SGD on the teacher's loss with K noise draws per example ------------------------------
    dpdm = dpdm_settings(config, {**run, "method": "dpdm"})
    b, k = (8 if args.tiny else dp_batch(dpdm, "dpdm")), dpdm.timesteps_per_example
    schedule["dpdm"] = work_bound(dpdm, "dpdm", shape.private)[0]
    dpdm_inputs = lambda b: (images(b), timesteps(b, k), labels(b), images(b, k))  # noqa: E731
    measure("dpdm", b, UNet(unet_config).to(device), diffusion_example_loss(diffusion), dpdm_inputs(b),
            {"microbatch_size": dpdm.dp.microbatch_size, "per_example": dpdm.dp.per_example}, make_inputs=dpdm_inputs)

    # DP-SAD student and its discriminator ----------------------------------------------------------
    st = student_settings(config, run)
    b, k = (8 if args.tiny else dp_batch(st, "student")), st.timesteps_per_example
    student = UNet(unet_config).to(device)
    select_trainable(student, st.trainable)
    disc = Discriminator(DiscriminatorConfig(image_size=size, in_channels=channels, num_classes=classes,
                                             base_channels=st.discriminator.base_channels)).to(device)
    weights = {"teacher_weight": st.teacher_weight, "data_weight": st.data_weight, "adv_weight": st.adv_weight}
    schedule[f"dpsad student ({st.trainable})"] = schedule["dpsad discriminator"] = work_bound(
        st, "student", shape.private)[0]
    student_inputs = lambda b: (images(b), timesteps(b, k), labels(b), images(b, k), images(b, k))  # noqa: E731
    measure(f"dpsad student ({st.trainable})", b, student,
            student_example_loss(diffusion, disc, {"p": frozen_params(disc)}, weights), student_inputs(b),
            {"microbatch_size": st.dp.microbatch_size, "per_example": st.dp.per_example}, make_inputs=student_inputs)
    disc_inputs = lambda b: (images(b, k), images(b, k), timesteps(b, k), labels(b))  # noqa: E731
    measure("dpsad discriminator", b, disc, discriminator_example_loss(diffusion.num_timesteps), disc_inputs(b),
            {"microbatch_size": st.dp.microbatch_size, "per_example": st.dp.per_example}, make_inputs=disc_inputs)

    # dp-GAN critic: gradient penalty inside the per-example loss, grouped clipping -----------------
    gan = dpgan_settings(config, run)
    b = 8 if args.tiny else dp_batch(gan, "dpgan")
    critic = Critic(GANConfig(image_size=size, in_channels=channels, num_classes=classes, latent_dim=gan.latent_dim,
                              width=gan.width)).to(device)
    group_of = group_parameters(critic, "weight_bias" if gan.grouping == "cluster" else gan.grouping, None, gan.groups)
    groups = max(group_of.values()) + 1

    def critic_plain(model, real, fake, rho, y):
        """The critic's per-example losses (gradient penalty included) in one batched pass."""
        r = rho[:, None, None, None]
        x_hat = (r * real + (1 - r) * fake).requires_grad_(True)
        (g,) = torch.autograd.grad(model(x_hat, y).sum(), x_hat, create_graph=True)
        penalty = (g.flatten(1).norm(dim=1) - 1.0) ** 2
        return model(fake, y).reshape(-1) - model(real, y).reshape(-1) + gan.gp_weight * penalty

    schedule[f"dpgan critic ({groups} clipping groups)"] = work_bound(gan, "dpgan", shape.private)[0]
    critic_inputs = lambda b: (images(b), images(b), torch.rand(b, device=device), labels(b) % classes)  # noqa: E731
    measure(f"dpgan critic ({groups} clipping groups)", b, critic, critic_example_loss(gan.gp_weight),
            critic_inputs(b), {"microbatch_size": gan.dp.microbatch_size, "group_of": group_of,
                               "group_bounds": [1.0] * groups, "per_example": "auto"},  # no batched form: vmap
            plain_loss=critic_plain, make_inputs=critic_inputs)

    # MoCo (public split, no DP) ---------------------------------------------------------------------
    moco = config["moco"]
    b = 8 if args.tiny else moco["batch_size"]
    model = MoCo(channels, moco["feature_dim"], moco["queue_size"], moco["momentum"], moco["temperature"]).to(device)
    m_opt = torch.optim.SGD(model.query.parameters(), lr=moco["lr"], momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    batch_images = torch.rand(b, channels, size, size)

    def moco_step():
        view_q, view_k = two_views(batch_images, gen)
        loss = model(view_q.to(device), view_k.to(device)).mean()
        m_opt.zero_grad()
        loss.backward()
        m_opt.step()

    s, peak = meter.run(moco_step, args.steps)
    emit("moco", b, "-", b / s, peak, None, None)

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
            draw(teacher, diffusion, (n, channels, size, size), torch.arange(n, device=device) % classes, **kwargs)

    start = time.perf_counter()
    sample_all()
    if device.type == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else peak_rss_mb()
    sample_stage = f"sample {sample['sampler']} {sample['steps']} steps, {args.samples} images"
    schedule[sample_stage] = float(sample["n_per_class"]) * classes  # one run's release
    emit(sample_stage, batch, "-", args.samples / s, peak, None, None)

    if args.hours:
        print(f"schedule at n = {shape.private:,} private records (the config's source, as configured_shape estimates "
              "it); MoCo's is left out (epochs of the public split)")


if __name__ == "__main__":
    main()
