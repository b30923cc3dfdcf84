"""dp-GAN training: warm start on the public split, then a DP-SGD critic on the private split.

The warm start is an ordinary WGAN-GP on public data: ``warm_steps`` critic
steps and one generator step per ``n_critic`` of them, so that both networks
start from a GAN of the public data (dp-GAN's public-data variant).

The generator only ever sees the critic (and data-independent noise), so it
is post-processing of the DP critic.  The critic's per-record loss includes
the gradient penalty, which reads the private image; it is clipped (per
parameter group) and noised by :class:`~dpsad.privacy.mechanism.dpsgd.DPSGD`, and
the ledger counts every critic step.
"""

from __future__ import annotations


import torch
from torch import nn
from tqdm.auto import tqdm

from ..config.settings import DpganSettings, as_plain, sized
from ..data.datafile import PreparedData
from ..errors import DpsadError
from ..privacy.books.ledger import read_ledgers
from ..privacy.books.preparation import stamped
from ..privacy.mechanism.dpsgd import (
    DPSGD,
    PoissonSampler,
    dp_generators,
    per_example_gradients,
)
from ..privacy.mechanism.plan import plan_dp_training
from ..training.training_loop import TrainingLoop
from ..training.checkpoints import check_finite, load_checkpoint, settings_digest
from ..training.diffusion_training import training_data
from ..runtime.devices import make_generator
from ..runtime.eager_optimizers import eager
from .losses import critic_example_loss, generator_loss
from .models import Critic, GANConfig, Generator


def group_parameters(critic: nn.Module, strategy: str, tensor_bounds: dict[str, float] | None = None, k: int = 2) -> dict[str, int]:
    """Map each critic parameter to a clipping group.

    none: one group; weight_bias: weights (group 0) and biases (group 1);
    cluster: dp-GAN's Algorithm 2 -- start with one group per tensor and merge
    the two groups with the closest bounds until k remain (bounds from public data).
    """
    names = [n for n, p in critic.named_parameters() if p.requires_grad]
    if strategy == "none":
        return {n: 0 for n in names}
    if strategy == "weight_bias":
        return {n: int(n.endswith("bias")) for n in names}
    if strategy == "cluster":
        if tensor_bounds is None:
            raise DpsadError("grouping 'cluster' needs clipping bounds from public data, expected a non-empty public split")
        groups = [([n], tensor_bounds[n]) for n in names]
        while len(groups) > k:
            groups.sort(key=lambda g: g[1])
            gaps = [groups[i + 1][1] - groups[i][1] for i in range(len(groups) - 1)]
            i = min(range(len(gaps)), key=gaps.__getitem__)
            merged = (groups[i][0] + groups[i + 1][0], (groups[i][1] ** 2 + groups[i + 1][1] ** 2) ** 0.5)
            groups[i:i + 2] = [merged]
        return {n: j for j, (members, _) in enumerate(groups) for n in members}
    raise DpsadError(f"grouping '{strategy}', expected none, weight_bias or cluster")


def public_norms(critic, loss, batch: tuple) -> dict[str, torch.Tensor]:
    """Per-example gradient norm of each critic tensor on a public batch.  name -> [N]."""
    grads = per_example_gradients(critic, loss, batch)
    return {n: g.flatten(1).norm(dim=1) for n, g in grads.items()}


def group_bounds_from_public(norms: dict[str, torch.Tensor], group_of: dict[str, int]) -> list[float]:
    """c_j = mean over public examples of the gradient norm restricted to group j (dp-GAN's adaptive clipping)."""
    k = max(group_of.values()) + 1
    n = next(iter(norms.values())).shape[0]
    sq = torch.zeros(n, k)
    for name, value in norms.items():
        sq[:, group_of[name]] += value.cpu() ** 2
    return [max(float(v), 1e-6) for v in sq.sqrt().mean(dim=0)]


def _wgan_gp_step(generator, critic, real, y, settings, gen, d_opt, device):
    """One non-private WGAN-GP critic step (warm start on public data)."""
    b = real.shape[0]
    z = torch.randn(b, generator.config.latent_dim, generator=gen).to(device)
    with torch.no_grad():
        fake = generator(z, y)
    rho = torch.rand(b, 1, 1, 1, generator=gen).to(device)
    x_hat = (rho * real + (1 - rho) * fake).requires_grad_(True)
    (g,) = torch.autograd.grad(critic(x_hat, y).sum(), x_hat, create_graph=True)
    penalty = (g.flatten(1).norm(dim=1) - 1) ** 2
    loss = (critic(fake, y) - critic(real, y) + settings.gp_weight * penalty).mean()
    d_opt.zero_grad()
    loss.backward()
    d_opt.step()
    return float(loss.detach())


def _generator_step(generator, critic, settings, num_classes, gen, g_opt, device):
    b = settings.batch_size
    z = torch.randn(b, generator.config.latent_dim, generator=gen).to(device)
    y = (torch.randint(num_classes, (b,), generator=gen) if num_classes else torch.zeros(b, dtype=torch.long)).to(device)
    for p in critic.parameters():
        p.requires_grad_(False)
    loss = generator_loss(critic, generator(z, y), y).mean()
    g_opt.zero_grad()
    loss.backward()
    g_opt.step()
    for p in critic.parameters():
        p.requires_grad_(True)
    return float(loss.detach())


def train_dpgan(*, data: PreparedData, settings: DpganSettings, labels_mode, device, out_path, loss_csv, ledger_path,
                upstream_ledgers: list[str], log, pseudo_labels: str | None = None,
                planned_n: int | None = None) -> list[dict]:
    """Train dp-GAN per ``settings`` (the ``dpgan`` section with the run's ``target_epsilon`` and ``delta``); write
    the checkpoint and the critic's ledger entry.  ``planned_n``: as for :func:`dpsad.training.student.train_student`."""
    train = training_data(data, "private", labels_mode, device, pseudo_labels)
    # One noisy update per Poisson batch (the generator step is post-processing of the critic).
    plan = plan_dp_training(settings, "dpgan", n=planned_n or train.n, upstream=read_ledgers(upstream_ledgers),
                            shares={"critic": 1.0}, stage="train_dpgan", log=log)
    settings, sigma = sized(settings, plan.settings), plan.noise_multipliers["critic"]
    needs_public = settings.warm_steps > 0 or settings.adaptive_clipping or settings.grouping == "cluster"
    public = training_data(data, "public", labels_mode, device, pseudo_labels) if needs_public else None
    config = GANConfig(image_size=train.x.shape[-1], in_channels=train.x.shape[1], num_classes=train.num_classes,
                       latent_dim=settings.latent_dim, width=settings.width)
    torch.manual_seed(settings.seed)
    generator, critic = Generator(config).to(device), Critic(config).to(device)
    g_opt = eager(torch.optim.Adam)(generator.parameters(), lr=settings.lr, betas=(0.5, 0.9))
    d_opt = eager(torch.optim.Adam)(critic.parameters(), lr=settings.lr, betas=(0.5, 0.9))
    randomness = dp_generators(settings.dp.noise_seed)  # secret batches and noise
    public_gen = make_generator(settings.seed + 104_729)
    loss = critic_example_loss(settings.gp_weight)
    digest = settings_digest({"settings": settings.resume_view(), "target": plan.target_epsilon, "delta": plan.delta,
                              "n": train.n, "labels": str(labels_mode)})
    describe = lambda final: {  # noqa: E731  (checkpoints are written from the first step on: ``engine`` is set)
        "gan_config": config.to_dict(), "settings": as_plain(plan.settings), "class_names": train.class_names,
        "conditional": train.num_classes > 0, "group_of": engine.group_of, "bounds": engine.group_bounds, "sigma": sigma}
    loop = TrainingLoop(kind="dpgan", out_path=out_path, digest=digest, describe=describe, log=log, dp_plan=plan,
                        stateful={"generator": generator, "critic": critic, "g_opt": g_opt, "d_opt": d_opt,
                                  "data_gen": randomness.sampling, "noise_gen": randomness.noise, "public_gen": public_gen})
    public_batch = _public_batches(public, generator, public_gen)
    group_of, bounds = _clipping_groups(loop.resume(), generator, critic, loss, public_batch, settings, train.num_classes,
                                        (g_opt, d_opt), public_gen)
    engine = DPSGD(critic, loss, noise_multiplier=sigma, clip_norm=settings.dp.clip_norm,
                   expected_batch_size=plan.sample_rate * train.n, noise_generator=randomness.noise,
                   microbatch_size=settings.dp.microbatch_size, group_of=group_of, group_bounds=bounds,
                   per_example=settings.dp.per_example, precision=settings.dp.precision)
    log.info("dp-GAN: %d private records, q=%.5f, %d critic steps (n_critic %d), sigma=%.4f, %d clipping groups",
             train.n, plan.sample_rate, plan.steps, settings.n_critic, sigma, len(bounds))
    loop.run(_critic_step(generator, critic, engine, loss, train, settings, public_batch, (g_opt, d_opt),
                          PoissonSampler(train.n, plan.sample_rate, randomness.sampling), randomness.sampling,
                          str(loop.resume_path)),
             total_steps=plan.steps, desc="dpgan critic (DP)", checkpoint_every=settings.checkpoint_every,
             log_first=False, postfix={"generator_loss": "g"})
    entry = plan.entries({"critic": "train_dpgan_critic"}, randomness.seed_kind,
                         clip_norms={"critic": engine.total_sensitivity},
                         notes={"critic": (f"{len(bounds)} clipping group(s); group j noised with sigma*sqrt(k)*c_j"
                                           + ("; bounds from public batches" if settings.adaptive_clipping else "")
                                           + (f"; warm start {settings.warm_steps} steps on the public split"
                                              if settings.warm_steps else ""))})[0]
    stamped([entry], data.attrs)
    loop.finish([entry], total_steps=plan.steps, loss_csv=loss_csv, ledger_path=ledger_path,
                upstream_ledgers=upstream_ledgers)
    return [entry]


def _public_batches(public, generator: Generator, public_gen: torch.Generator):
    """``size`` -> a critic batch of public images (real, fake, interpolation weights, labels), drawn by ``public_gen``."""

    def public_batch(size: int) -> tuple:
        device = public.x.device
        idx = torch.randint(public.n, (size,), generator=public_gen).to(device)
        z = torch.randn(size, generator.config.latent_dim, generator=public_gen).to(device)
        with torch.no_grad():
            fake = generator(z, public.y[idx])
        return public.x[idx], fake, torch.rand(size, generator=public_gen).to(device), public.y[idx]

    return public_batch


def _clipping_groups(resumed: dict | None, generator, critic, loss, public_batch, settings: DpganSettings,
                     num_classes: int, optimizers: tuple, public_gen: torch.Generator) -> tuple[dict[str, int], list[float]]:
    """The critic's clipping groups and their bounds: a resumed run's own; else after the public warm start, the
    groups by ``grouping`` (``cluster``: from public gradient norms), each bounded by clip_norm/sqrt(k)."""
    if resumed is not None:
        return resumed["group_of"], resumed["bounds"]
    g_opt, d_opt = optimizers
    device = next(critic.parameters()).device
    for step in tqdm(range(settings.warm_steps), desc="dpgan warm start (public)", disable=not settings.warm_steps):
        real, _, _, y = public_batch(settings.batch_size)
        _wgan_gp_step(generator, critic, real, y, settings, public_gen, d_opt, device)
        if (step + 1) % settings.n_critic == 0:
            _generator_step(generator, critic, settings, num_classes, public_gen, g_opt, device)
    tensor_bounds = None
    if settings.grouping == "cluster":
        norms = public_norms(critic, loss, public_batch(settings.public_batch_size))
        tensor_bounds = {name: float(v.mean()) for name, v in norms.items()}
    group_of = group_parameters(critic, settings.grouping, tensor_bounds, settings.groups)
    k = max(group_of.values()) + 1
    return group_of, [settings.dp.clip_norm / k ** 0.5] * k  # total sensitivity = clip_norm


def _critic_step(generator, critic, engine: DPSGD, loss, train, settings: DpganSettings, public_batch, optimizers: tuple,
                 sampler: PoissonSampler, data_gen: torch.Generator, checkpoint: str):
    """One DP critic step on a Poisson batch (bounds re-read from public batches when adaptive), and every
    ``n_critic`` steps a generator step (post-processing of the critic)."""
    g_opt, d_opt = optimizers
    device, g_loss = train.x.device, [float("nan")]

    def step_function(step: int, logged: bool) -> dict | None:
        if settings.adaptive_clipping and step % settings.dp.clip_update_every == 0:
            engine.group_bounds = group_bounds_from_public(public_norms(critic, loss, public_batch(settings.public_batch_size)),
                                                           engine.group_of)
        idx = sampler.sample().to(device)
        b = int(idx.numel())
        z = torch.randn(b, generator.config.latent_dim, generator=data_gen).to(device)
        with torch.no_grad():
            fake = generator(z, train.y[idx])
        rho = torch.rand(b, generator=data_gen).to(device)
        d_opt.zero_grad(set_to_none=True)
        stats = engine.step_gradients((train.x[idx], fake, rho, train.y[idx]))
        d_opt.step()
        if (step + 1) % settings.n_critic == 0:
            g_loss[0] = _generator_step(generator, critic, settings, train.num_classes, data_gen, g_opt, device)
            check_finite(g_loss[0], step + 1, checkpoint)
        return {"step": step + 1, "generator_loss": g_loss[0], "batch": b, "grad_norm": stats.mean_norm,
                "sensitivity": engine.total_sensitivity}

    return step_function


def load_gan_generator(path, device) -> tuple[Generator, dict]:
    state = load_checkpoint(path, map_location=device)
    generator = Generator(GANConfig(**state["gan_config"])).to(device)
    generator.load_state_dict(state["generator"])
    return generator.eval(), state
