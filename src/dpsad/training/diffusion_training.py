"""Every teacher-style diffusion training, with its data, model loading and per-example loss.

``train_diffusion_model`` builds a teacher-style training (a public teacher, the non-private reference, a DP
teacher, DPDM) and runs its step in the one training loop (:class:`dpsad.training.training_loop.TrainingLoop`, which owns
resume, EMA, checkpoints, loss rows and the ledger).  What differs is the update rule, passed in:
:class:`dpsad.training.teacher.PlainUpdate` (uniform batches, Adam on the batch loss, no privacy) or
:class:`dpsad.training.dpdm.DPSGDUpdate` (Poisson batches, per-example clipping, calibrated noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from ..config.settings import TeacherSettings
from ..data.datafile import PreparedData, split_group
from ..data.pseudo_labels import read_pseudo_labels
from ..diffusion import DiffusionConfig, GaussianDiffusion
from ..runtime.distributed import SINGLE, DistributedContext
from ..errors import DpsadError
from ..models.unet import UNet, UNetConfig, count_parameters
from ..privacy.books.preparation import stamped
from ..privacy.books.public_preparation import stamped_public
from ..privacy.mechanism.per_example import per_example_from_batched
from ..data.image_tensors import images_to_tensor
from ..runtime.devices import make_generator
from ..runtime.eager_optimizers import eager
from .adapters import choose_trainable
from .training_loop import TrainingLoop
from .schedules import EMA, draw_timesteps, warmup_cosine
from .checkpoints import load_checkpoint, settings_digest


@dataclass
class TrainingData:
    """Images [N,C,H,W] in [-1,1] and labels [N] (the null class when unconditional)."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    class_names: list[str]

    @property
    def n(self) -> int:
        return int(self.x.shape[0])


def training_data(data: PreparedData, split: str, labels_mode, device, pseudo_labels: str | None = None) -> TrainingData:
    """Select a split and decide conditioning from the ``labels`` switch (true | kmeans | none).

    With ``kmeans`` the labels come from ``pseudo_labels`` (labels.h5 of the
    k-means stage) instead of the dataset.
    """
    group = split_group(split)
    part = data.splits[group]
    if len(part) == 0:
        raise DpsadError(f"the {split} split is empty, expected images to train on (raise {split}_fraction)")
    x = images_to_tensor(part.images).to(device)
    if labels_mode == "kmeans":
        if pseudo_labels is None:
            raise DpsadError("labels: kmeans needs the k-means labels file, expected labels.h5 from the kmeans_labels stage")
        labels, names = read_pseudo_labels(pseudo_labels, data.attrs)
        return TrainingData(x=x, y=torch.from_numpy(labels[group]).to(device), num_classes=len(names), class_names=names)
    conditional = labels_mode is True or labels_mode == "true"
    if conditional and (part.labels is None or not data.labelled):
        raise DpsadError("labels: true but the dataset has no labels, expected labels: kmeans or none for unlabelled data")
    num_classes = data.num_classes if conditional else 0
    y = torch.from_numpy(part.labels).to(device) if conditional else torch.zeros(len(part), dtype=torch.long, device=device)
    return TrainingData(x=x, y=y, num_classes=num_classes, class_names=data.class_names if conditional else [])


def build_unet(model_settings: dict, data: TrainingData) -> UNet:
    config = UNetConfig.from_dict({
        **model_settings, "image_size": int(data.x.shape[-1]), "in_channels": int(data.x.shape[1]),
        "num_classes": data.num_classes,
    })
    return UNet(config)


def warm_start_model(path: str, diffusion_cfg: DiffusionConfig, data: TrainingData, device) -> UNet:
    """A trainable copy of a checkpoint's EMA model; its diffusion and image size must match the run's.

    When the run is conditioned on other labels than the checkpoint (k-means clusters on a teacher
    of true classes, say), the label embedding is rebuilt for the run's classes: the null
    (unconditional) row is the checkpoint's, every new label row is freshly drawn like a new model's
    (seeded by the caller's torch seed), and all other weights are copied.  New rows must not start
    at the null row: there the labels are indistinguishable and a short fine-tune cannot move them
    apart (measured: 600 steps left them 0.1 from it, and the model unconditional).
    """
    source, source_diffusion, state = load_diffusion_model(path, device, use_ema=True)
    if source_diffusion.config.to_dict() != diffusion_cfg.to_dict():
        raise DpsadError(f"warm start from {path}: its diffusion settings {source_diffusion.config.to_dict()} differ, "
                         f"expected {diffusion_cfg.to_dict()}")
    if source.config.image_size != data.x.shape[-1] or source.config.in_channels != data.x.shape[1]:
        raise DpsadError(f"warm start from {path}: {source.config.in_channels} channels at {source.config.image_size} px, "
                         f"expected {data.x.shape[1]} channels at {data.x.shape[-1]} px like the run's data")
    if list(state.get("class_names", [])) == list(data.class_names) and source.config.num_classes == data.num_classes:
        model = UNet(source.config).to(device)
        model.load_state_dict(source.state_dict())
        return model
    model = UNet(UNetConfig.from_dict({**source.config.to_dict(), "num_classes": data.num_classes})).to(device)
    weights = {k: v for k, v in source.state_dict().items() if not k.startswith("class_embed.")}
    model.load_state_dict(weights, strict=False)
    with torch.no_grad():
        model.class_embed.weight[-1].copy_(source.class_embed.weight[-1])
    return model


def diffusion_example_loss(diffusion: GaussianDiffusion, weighting: str = "simple"):
    """Per-example denoising loss for DP-SGD: the mean over the K noise draws of one record.

    Batched form: x0 [N,C,H,W], t [N,K], y [N], noise [N,K,C,H,W] -> [N], one model call whose rows are
    grouped by record; the one-record form (for vmap) is derived from it.  Averaging the K draws inside
    the loss (before clipping) is DPDM's noise multiplicity: it lowers the gradient variance at no
    privacy cost.
    """

    def batched(model, x0, t, y, noise):
        b, k = t.shape
        shape = x0.shape[1:]
        x0k = x0[:, None].expand(b, k, *shape).reshape(b * k, *shape)
        tk, noisek = t.reshape(-1), noise.reshape(b * k, *shape)
        xt = diffusion.q_sample(x0k, tk, noisek)
        mse = diffusion.output_mse(model(xt, tk, y[:, None].expand(b, k).reshape(-1)),
                                   diffusion.target(x0k, xt, tk, noisek), tk)
        return (diffusion.loss_weight(tk, weighting) * mse).reshape(b, k).mean(dim=1)

    return per_example_from_batched(batched, lambda model: (None, diffusion.num_timesteps, label_high(model), None))


def label_high(model) -> int:
    """One past the largest label ``model`` embeds (its classes and the null class): the check's integer range."""
    return int(getattr(getattr(model, "config", None), "num_classes", 0) or 0) + 1


def lr_factor(kind: str, total_steps: int, steps_per_epoch: float, *, warmup_steps: int = 0, rate: float = 1.0):
    """LambdaLR factor for the schedule ``kind`` (a section's ``lr_schedule``).

    cosine: ``warmup_steps`` of warm-up then cosine annealing; constant; and DPDM's decays per epoch e (>= 1):
    linear from 1 to ``rate`` (``lr_decay_rate``), exponential ``rate ** (e - 1)``, logarithmic 1 / (1 + log e).
    """
    if kind == "cosine":
        return warmup_cosine(total_steps, warmup_steps, 0.05)
    epoch = lambda step: 1.0 + step / max(steps_per_epoch, 1e-9)  # noqa: E731
    if kind == "constant":
        return lambda step: 1.0
    if kind == "linear":
        return lambda step: 1.0 - (1.0 - rate) * min(1.0, step / max(1, total_steps))
    if kind == "exponential":
        return lambda step: rate ** (epoch(step) - 1.0)
    if kind == "logarithmic":
        return lambda step: 1.0 / (1.0 + math.log(epoch(step)))
    raise DpsadError(f"lr_schedule '{kind}', expected cosine, constant, linear, exponential or logarithmic")


DIFFUSION_KINDS = ("diffusion_model", "dpsad_student")


def load_diffusion_model(path, device, use_ema: bool = True):
    """Rebuild (model, diffusion, checkpoint) from a self-describing checkpoint (teacher or student)."""
    state = load_checkpoint(path, map_location=device, kinds=DIFFUSION_KINDS)
    model = UNet(UNetConfig.from_dict(state["model_config"])).to(device)
    weights = state["ema"]["model"] if use_ema and "ema" in state else state["model"]
    model.load_state_dict(weights)
    model.eval()
    diffusion = GaussianDiffusion(DiffusionConfig(**state["diffusion_config"]))
    return model, diffusion, state


@dataclass
class Plan:
    """What an update rule decides before the loop: its length and the generators of batches and noise."""

    total_steps: int
    steps_per_epoch: float
    data_gen: torch.Generator
    noise_gen: torch.Generator


@dataclass
class LoopContext:
    """What the loop has built when the update rule starts (after a resume, if any)."""

    model: UNet
    train: "TrainingData"
    diffusion: GaussianDiffusion
    example_loss: object  # diffusion_example_loss(...): batched and one-record per-example losses
    plan: Plan
    public_gen: torch.Generator
    distributed: DistributedContext
    resumed: dict | None  # the resumable checkpoint's state, or None


class UpdateRule(Protocol):
    """One optimisation step's rule.  The loop calls, in order: ``plan`` once; ``start`` after a resume;
    per step ``batch``, then (after the shared label dropout, timesteps and noise) ``gradients`` and
    ``after_step``; ``entry`` at the end.  ``state`` goes into every checkpoint."""

    def plan(self, train: "TrainingData", distributed: DistributedContext, log) -> Plan: ...

    def start(self, context: LoopContext) -> None: ...

    def batch(self, step: int, data_gen: torch.Generator) -> torch.Tensor:
        """Indices [b] of the records of this step's batch."""

    def gradients(self, step: int, batch: tuple, logged: bool, checkpoint: str) -> dict:
        """Fill the parameters' .grad from ``batch`` (x0, t, y, noise); the loss row (with ``loss``)."""

    def after_step(self, step: int, checkpoint: str) -> None: ...

    def state(self) -> dict: ...

    def entry(self, stage_name: str, total_steps: int) -> dict: ...


def train_diffusion_model(*, update: UpdateRule, data: PreparedData, settings: TeacherSettings, diffusion_settings: dict, labels_mode,
                          device: torch.device, out_path: str, loss_csv: str, ledger_path: str, stage_name: str, log,
                          pseudo_labels: str | None = None, distributed: DistributedContext = SINGLE,
                          init_path: str | None = None, upstream_ledgers: list[str] = ()) -> dict:
    """Train a UNet on ``settings.split`` with ``update`` in the one loop; write the checkpoint, the loss rows and the
    ledger (``upstream_ledgers``: those of the init weights and the label source, plus this stage's entry, returned).
    ``init_path`` (``init: <teacher>``): start from that checkpoint's EMA weights and architecture."""
    diffusion_cfg = DiffusionConfig(**diffusion_settings)
    diffusion = GaussianDiffusion(diffusion_cfg)
    train = training_data(data, settings.split, labels_mode, device, pseudo_labels)
    model = _initial_model(settings, train, diffusion_cfg, init_path, device, stage_name, log)
    plan = update.plan(train, distributed, log)
    dp_plan = getattr(update, "dp_plan", None)  # DP fine-tuning may train low-rank adapters only (trainable)
    if dp_plan is not None and dp_plan.noise_multipliers:
        choose_trainable(model, settings.trainable, settings.lora_rank, sigma=next(iter(dp_plan.noise_multipliers.values())),
                         batch_size=dp_plan.sample_rate * dp_plan.n, log=log)
    optimizer = eager(torch.optim.Adam)([p for p in model.parameters() if p.requires_grad], lr=settings.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(settings.lr_schedule, plan.total_steps, plan.steps_per_epoch,
                                                                    warmup_steps=settings.warmup_steps, rate=settings.lr_decay_rate))
    ema = EMA(model, settings.ema_decay, settings.ema_warmup)
    public_gen = make_generator(settings.seed + 2_000_003)
    digest = settings_digest({"settings": settings.resume_view(), "diffusion": diffusion_settings, "labels": str(labels_mode),
                              "n": train.n, "data": data.attrs.get("seed")})
    describe = lambda final: {"model_config": model.config.to_dict(), "diffusion_config": diffusion_cfg.to_dict(),  # noqa: E731
                              "settings": settings.as_dict(), "class_names": train.class_names,
                              "conditional": train.num_classes > 0, **update.state()}
    loop = TrainingLoop(kind="diffusion_model", out_path=out_path, digest=digest, describe=describe, log=log,
                        distributed=distributed, ema=(ema, model), dp_plan=dp_plan,
                        stateful={"model": model, "ema": ema, "optimizer": optimizer, "scheduler": scheduler,
                                  "data_gen": plan.data_gen, "noise_gen": plan.noise_gen, "public_gen": public_gen})
    state = loop.resume()
    update.start(LoopContext(model=model, train=train, diffusion=diffusion,
                             example_loss=diffusion_example_loss(diffusion, settings.loss_weighting), plan=plan,
                             public_gen=public_gen, distributed=distributed, resumed=state))
    model.train()
    loop.run(_diffusion_step(model, train, diffusion, update, optimizer, scheduler, settings, plan.data_gen,
                             str(loop.resume_path)),
             total_steps=plan.total_steps, desc=stage_name, checkpoint_every=settings.checkpoint_every, postfix={"loss": "loss"})
    entry = stamped_public(stamped([update.entry(stage_name, plan.total_steps)], data.attrs), data.attrs)[0]
    loop.finish([entry], total_steps=plan.total_steps, loss_csv=loss_csv, ledger_path=ledger_path,
                upstream_ledgers=upstream_ledgers)
    last = loop.losses.rows[-1]["loss"] if loop.losses.rows else float("nan")
    log.info("%s: done, %d steps, last logged loss %.4f", stage_name, plan.total_steps, last)
    return entry


def _initial_model(settings: TeacherSettings, train: TrainingData, diffusion_cfg: DiffusionConfig, init_path: str | None,
                   device, stage_name: str, log) -> UNet:
    """A seeded new UNet for ``train``, or the EMA weights of ``init_path``'s checkpoint."""
    torch.manual_seed(settings.seed)  # initial weights are seeded like everything else
    if init_path:
        model = warm_start_model(init_path, diffusion_cfg, train, device)
        log.info("%s: warm start from %s", stage_name, init_path)
    else:
        model = build_unet(settings.model, train).to(device)
    log.info("%s: UNet with %d parameters, %d training images (%s split), %d classes",
             stage_name, count_parameters(model), train.n, settings.split, train.num_classes)
    return model


def _diffusion_step(model: UNet, train: TrainingData, diffusion: GaussianDiffusion, update: UpdateRule, optimizer, scheduler,
                    settings: TeacherSettings, data_gen: torch.Generator, checkpoint: str):
    """One step: a batch from ``update``, label dropout, ``timesteps_per_example`` draws each, the update's gradients."""
    k, device = settings.timesteps_per_example, train.x.device

    def step_function(step: int, logged: bool) -> dict | None:
        idx = update.batch(step, data_gen)
        b = int(idx.numel())
        x0, y = train.x[idx.to(device)], train.y[idx.to(device)].clone()
        drop = torch.rand(b, generator=data_gen) < (settings.label_dropout if train.num_classes else 1.0)
        y[drop.to(device)] = model.null_class
        t = draw_timesteps(diffusion, (b, k), data_gen, settings).to(device)
        noise = torch.randn((b, k) + tuple(train.x.shape[1:]), generator=data_gen).to(device)
        optimizer.zero_grad(set_to_none=True)
        row = update.gradients(step, (x0, t, y, noise), logged, checkpoint)
        optimizer.step()
        scheduler.step()
        update.after_step(step, checkpoint)
        return {**row, "lr": scheduler.get_last_lr()[0]}

    return step_function
