"""DP-SAD student distillation with a discriminator (paper Sections 4.3-4.5, Algorithm 1).

Mode ``sound`` (default): every step draws a Poisson batch of private records;
for each record K timesteps are drawn and its whole loss (distillation to
the teacher, MSE to the data's x_{t-1}, lambda times the adversarial term)
is averaged over them inside :func:`student_example_loss`; the gradient of
that loss w.r.t. all student parameters is clipped once and noised by
:class:`~dpsad.privacy.mechanism.dpsgd.DPSGD`.  The discriminator is trained by
DP-SGD on the same Poisson batch (its own clipping and noise), or only on the
public split.  Both updates read the same batch, so each step is ONE sampled
Gaussian mechanism with sigma_eff = (sigma_s^-2 + sigma_d^-2)^-1/2: sigma_eff
is calibrated to the run's target epsilon and split by the budget shares
(sigma_i = sigma_eff / sqrt(w_i)) by the DP plan (:func:`~dpsad.privacy.mechanism.plan.plan_dp_training`);
both ledger entries carry the same ``batch`` key so that ``account`` composes
them jointly.  Batches and noise come from secret seeds
(:func:`~dpsad.privacy.mechanism.dpsgd.dp_generators`).

Mode ``paper`` runs Eq. 17 as printed (:mod:`.paper_mechanism`: output-space
clipping, noise divided by B*T, a noise-free discriminator).  It is refused
unless ``allow_unsound`` is set, and its ledger makes the verdict false.
"""

from __future__ import annotations

from dataclasses import dataclass, field


import torch
from torch.func import functional_call

from ..config.settings import StudentSettings, as_plain, sized
from ..data.datafile import PreparedData
from ..diffusion import GaussianDiffusion
from ..runtime.distributed import SINGLE, DistributedContext
from ..errors import DpsadError
from ..models.discriminator import Discriminator, DiscriminatorConfig
from ..models.unet import UNet, count_parameters, xavier_init
from ..privacy.books.ledger import make_entry, read_ledgers
from ..privacy.books.preparation import stamped
from ..privacy.mechanism.dpsgd import DPSGD, PoissonSampler, dp_generators
from ..privacy.mechanism.per_example import per_example_from_batched
from ..privacy.mechanism.plan import DpPlan, plan_dp_training
from ..runtime.devices import make_generator
from ..runtime.eager_optimizers import eager
from .training_loop import TrainingLoop
from .schedules import EMA, draw_timesteps, warmup_cosine
from .checkpoints import check_parameters_finite, settings_digest
from .adapters import choose_trainable
from .losses import discriminator_loss, student_loss
from .diffusion_training import label_high, load_diffusion_model, lr_factor, training_data
from .paper_mechanism import PaperUpdate, check_paper_mode, paper_ledger_entries, paper_plan
from .public_subspace import PublicSubspace, subspace_plan

CONDITIONING_PARTS = ("class_embed", "time_mlp", ".emb.", "norm")


def student_lr_factor(kind: str, total_steps: int, steps_per_epoch: float):
    """LambdaLR factor of the student's optimiser: ``cosine`` annealing to 0 (no warm-up), ``constant``, or
    DPDM's ``logarithmic`` 1 / (1 + log epoch)."""
    if kind == "cosine":
        return warmup_cosine(total_steps, 0, 0.0)
    return lr_factor(kind, total_steps, steps_per_epoch)


def select_trainable(student: torch.nn.Module, which: str) -> int:
    """Freeze all but the parameters ``which`` names; returns how many stay trainable.

    ``all``: every parameter.  ``conditioning``: the class embedding, the time
    MLP, each block's embedding projection and the normalisation layers (about
    a quarter of the demo's UNet): DP noise then lands on far fewer coordinates.  The
    frozen ones keep the (public) teacher's values, so they carry no private
    information and need no noise; DP-SGD clips and noises only the trainable set.
    """
    if which not in ("all", "conditioning"):
        raise DpsadError(f"student trainable = '{which}', expected all or conditioning")
    count = 0
    for name, param in student.named_parameters():
        keep = which == "all" or any(part in name for part in CONDITIONING_PARTS)
        param.requires_grad_(keep)
        count += param.numel() if keep else 0
    return count


def frozen_params(module: torch.nn.Module) -> dict:
    return {n: p.detach() for n, p in module.named_parameters()}


def student_example_loss(diffusion, discriminator, d_params_ref: dict, weights: dict):
    """Per-record student loss for DP-SGD, averaged over the record's K timesteps.

    Batched form: x0 [N,C,H,W], t [N,K], y [N], noise [N,K,C,H,W], teacher_out [N,K,C,H,W] -> [N], one
    model call whose rows are grouped by record; the one-record form (for vmap) is derived from it.
    The teacher output depends on this record alone (the teacher is fixed; computed over the batch, so its fp32
    rounding may differ beside other records, before clipping: docs/PRIVACY.md);
    the discriminator parameters are fixed for the step (``d_params_ref['p']``).
    """

    def batched(model, x0, t, y, noise, teacher_out):
        b, k = t.shape
        shape = x0.shape[1:]
        x0k = x0[:, None].expand(b, k, *shape).reshape(b * k, *shape)
        tk, yk, noisek = t.reshape(-1), y[:, None].expand(b, k).reshape(-1), noise.reshape(b * k, *shape)
        xt = diffusion.q_sample(x0k, tk, noisek)
        s_out = model(xt, tk, yk)
        target = diffusion.target(x0k, xt, tk, noisek)
        logits = functional_call(discriminator, d_params_ref["p"], (diffusion.eps_from_output(s_out, xt, tk), tk, yk))
        per_row = student_loss(s_out, teacher_out.reshape(b * k, *shape), target, logits, tk, diffusion, **weights)
        return per_row.reshape(b, k).mean(dim=1)

    return per_example_from_batched(batched, lambda model: (None, diffusion.num_timesteps, label_high(model), None, None))


def discriminator_example_loss(timesteps: int):
    """Per-record discriminator loss.  Batched form: teacher_eps [N,K,C,H,W], student_eps [N,K,C,H,W], t [N,K]
    (below ``timesteps``), y [N] -> [N] (two model calls, rows grouped by record); the one-record form is derived
    from it."""

    def batched(model, teacher_eps, student_eps, t, y):
        b, k = t.shape
        shape = teacher_eps.shape[2:]
        tk, yk = t.reshape(-1), y[:, None].expand(b, k).reshape(-1)
        per_row = discriminator_loss(model(teacher_eps.reshape(b * k, *shape), tk, yk),
                                     model(student_eps.reshape(b * k, *shape), tk, yk))
        return per_row.reshape(b, k).mean(dim=1)

    return per_example_from_batched(batched, lambda model: (None, None, timesteps, label_high(model)))


def _draw(n: int, k: int, shape, diffusion: GaussianDiffusion, settings: dict, conditional: bool, gen):
    """Timesteps [n,k] (from ``settings.noise_distribution``), noise [n,k,*shape] and the label-dropout mask [n]."""
    t = draw_timesteps(diffusion, (n, k), gen, settings)
    noise = torch.randn((n, k) + tuple(shape), generator=gen)
    drop = torch.rand(n, generator=gen) < (settings.label_dropout if conditional else 1.0)
    return t, noise, drop


def train_student(*, data: PreparedData, teacher_path: str, upstream_ledgers: list[str], settings: StudentSettings, labels_mode,
                  device: torch.device, out_path: str, loss_csv: str, ledger_path: str, log,
                  pseudo_labels: str | None = None, distributed: DistributedContext = SINGLE,
                  planned_n: int | None = None) -> list[dict]:
    """Distil the teacher into a DP student beside its discriminator in the one loop; write the student checkpoint
    and its ledger, return the entries.  ``settings``: the student section with the run's ``target_epsilon`` and
    ``delta``.  With ``distributed``, every process draws the same Poisson batch; DP-SGD clips each process's shard,
    all-reduces and adds the noise once; only the first process writes files.  ``planned_n``: the number of records
    the mechanism is planned for when it differs from the records trained on (the audit's canaries)."""
    mode = settings.mode
    if mode == "paper":
        check_paper_mode(settings, distributed.enabled)
    teacher, diffusion, teacher_state = load_diffusion_model(teacher_path, device, use_ema=True)
    teacher.requires_grad_(False)
    train = training_data(data, "train", labels_mode, device, pseudo_labels)
    if teacher.config.num_classes != train.num_classes:
        raise DpsadError(f"teacher has {teacher.config.num_classes} classes but the data has {train.num_classes}, "
                         "expected the same labels setting for teacher and student")
    d_private = settings.discriminator.privacy == "dp"
    plan = _student_plan(settings, mode, d_private, planned_n or train.n, read_ledgers(upstream_ledgers), log)
    settings = sized(settings, plan.settings)
    models, d_config = _student_models(teacher, diffusion, teacher_state, train, settings, plan, log)
    s_opt = eager(torch.optim.Adam)([p for p in models.student.parameters() if p.requires_grad], lr=settings.lr)
    d_opt = eager(torch.optim.Adam)(models.discriminator.parameters(), lr=settings.disc_lr)
    s_sched = torch.optim.lr_scheduler.LambdaLR(s_opt, student_lr_factor(settings.lr_schedule, plan.steps, 1.0 / plan.sample_rate))
    d_sched = torch.optim.lr_scheduler.LambdaLR(d_opt, warmup_cosine(plan.steps, 0, 0.0))
    ema = EMA(models.student, settings.ema_decay, settings.ema_warmup)
    randomness = dp_generators(settings.dp.noise_seed, distributed)
    public_gen = make_generator(settings.seed + 104_729)
    digest = settings_digest({"settings": settings.resume_view(), "target": plan.target_epsilon, "delta": plan.delta,
                              "n": train.n, "teacher": teacher_state.get("settings_digest"), "labels": str(labels_mode)})
    describe = lambda final: {  # noqa: E731
        "model_config": models.student.config.to_dict(), "diffusion_config": diffusion.config.to_dict(),
        "discriminator_config": d_config.to_dict(), "settings": as_plain(plan.settings), "class_names": train.class_names,
        "conditional": train.num_classes > 0, "sigmas": plan.noise_multipliers, "sample_rate": plan.sample_rate,
        "total_steps": plan.steps}
    loop = TrainingLoop(kind="dpsad_student", out_path=out_path, digest=digest, describe=describe, log=log,
                        distributed=distributed, ema=(ema, models.student), dp_plan=plan,
                        stateful={"model": models.student, "discriminator": models.discriminator, "ema": ema,
                                  "optimizer": s_opt, "disc_optimizer": d_opt, "scheduler": s_sched,
                                  "disc_scheduler": d_sched, "data_gen": randomness.sampling,
                                  "noise_gen": randomness.noise, "public_gen": public_gen})
    loop.resume()
    public = _public_split(data, settings, labels_mode, device, pseudo_labels)
    update = _student_update(models, plan, settings, train.n, public, randomness.noise, public_gen, distributed, log)
    models.student.train()
    loop.run(_student_step(models, update, (s_opt, s_sched), (d_opt, d_sched), train, settings, randomness.sampling,
                           plan, str(loop.resume_path)),
             total_steps=plan.steps, desc="distill_student", checkpoint_every=settings.checkpoint_every, log_every=5,
             postfix={"distill_mse": "mse", "disc_loss": "d"})
    entries = stamped(_sound_ledger_entries(plan, d_private, randomness.seed_kind) if mode == "sound"
                      else paper_ledger_entries(plan, diffusion.num_timesteps, randomness.seed_kind), data.attrs)
    loop.finish(entries, total_steps=plan.steps, loss_csv=loss_csv, ledger_path=ledger_path,
                upstream_ledgers=upstream_ledgers)
    return entries


def _student_models(teacher, diffusion, teacher_state: dict, train, settings: StudentSettings, plan: DpPlan,
                    log) -> tuple["Models", DiscriminatorConfig]:
    """The seeded student (the teacher's weights or Xavier's, its trained part chosen) and discriminator."""
    torch.manual_seed(settings.seed)  # initial weights are seeded like everything else
    student = UNet(teacher.config).to(train.x.device)
    if settings.init_from_teacher:
        taught = teacher_state["settings"]
        if taught.get("split") == "private" and taught.get("privacy") != "dp" and settings.mode == "sound":
            log.warning("initialising from a teacher that read private records without noise: the verdict will be false")
        student.load_state_dict(teacher.state_dict())
    else:
        xavier_init(student)
    rank = choose_trainable(student, settings.trainable, settings.lora_rank, sigma=plan.noise_multipliers.get("student", 0.0),
                            batch_size=plan.sample_rate * plan.n, log=log)
    trainable = (sum(p.numel() for p in student.parameters() if p.requires_grad) if rank else
                 select_trainable(student, "all" if settings.trainable in ("lora", "auto") else settings.trainable))
    d_config = DiscriminatorConfig(image_size=train.x.shape[-1], in_channels=train.x.shape[1], num_classes=train.num_classes,
                                   base_channels=settings.discriminator.base_channels)
    discriminator = Discriminator(d_config).to(train.x.device)
    xavier_init(discriminator)
    log.info("student: %d parameters (%d trained: %s); discriminator: %d; %d private records; mode %s",
             sum(p.numel() for p in student.parameters()), trainable, settings.trainable,
             count_parameters(discriminator), train.n, settings.mode)
    return Models(student=student, teacher=teacher, discriminator=discriminator, diffusion=diffusion), d_config


def _public_split(data: PreparedData, settings: StudentSettings, labels_mode, device, pseudo_labels):
    """The public split, where a sound run reads it: its discriminator instead of the private batch
    (``privacy: public``), or the subspaces' examples (``dp.subspace``); else None."""
    reader = ("discriminator.privacy = 'public'" if settings.discriminator.privacy != "dp" else
              "student.dp.subspace: true" if settings.dp.subspace else None)
    if reader is None or settings.mode != "sound":
        return None
    if len(data.splits["public"]) == 0:
        raise DpsadError(f"{reader} but the public split is empty, expected public images (public_fraction > 0)")
    return training_data(data, "public", labels_mode, device, pseudo_labels)


def _student_update(models: "Models", plan: DpPlan, settings: StudentSettings, n: int, public, noise_gen: torch.Generator,
                    public_gen: torch.Generator, distributed: DistributedContext, log):
    """The update rule: :class:`SoundUpdate` (the student's and, when DP, the discriminator's DP-SGD engines on one
    Poisson batch, the sum divided by the expected batch of the ``n`` records trained on; ``public``: the public split
    the discriminator reads instead, or the subspaces' examples) or the paper's equations."""
    weights = {"teacher_weight": settings.teacher_weight, "data_weight": settings.data_weight,
               "adv_weight": settings.adv_weight}
    sigmas, expected_batch = plan.noise_multipliers, plan.sample_rate * n
    if settings.mode != "sound":
        return PaperUpdate(models, weights, clip=plan.clip_norm, sigma=sigmas["student"], expected_batch=expected_batch,
                           noise_gen=noise_gen)

    def engine(model, loss, sigma):
        return DPSGD(model, loss, noise_multiplier=sigma, clip_norm=plan.clip_norm, expected_batch_size=expected_batch,
                     noise_generator=noise_gen, microbatch_size=settings.dp.microbatch_size, distributed=distributed,
                     per_example=settings.dp.per_example, precision=settings.dp.precision)

    s_loss = student_example_loss(models.diffusion, models.discriminator, models.discriminator_params, weights)
    s_engine = engine(models.student, s_loss, sigmas["student"])
    d_engine = engine(models.discriminator, discriminator_example_loss(models.diffusion.num_timesteps), sigmas.get("discriminator", 0.0))
    subspaces = (_student_subspaces(models, plan, settings, expected_batch, public, public_gen, s_loss, log)
                 if settings.dp.subspace else {})
    return SoundUpdate(models, s_engine, d_engine, public=public if settings.discriminator.privacy != "dp" else None,
                       public_gen=public_gen, settings=settings, subspaces=subspaces)


def _student_subspaces(models: "Models", plan: DpPlan, settings: StudentSettings, expected_batch: float, public,
                       public_gen: torch.Generator, s_loss, log) -> dict[str, PublicSubspace]:
    """``dp.subspace``: {update: its :class:`PublicSubspace`} for the student and the DP discriminator, each with
    k from its own noise multiplier.  The examples: public images, their timesteps, noise and dropped labels from
    the public generator; the student's inputs carry the public teacher's outputs, the discriminator's the
    teacher's and the student's eps (models that are public or the outputs of earlier noisy steps)."""
    k, shape = settings.timesteps_per_example, tuple(public.x.shape[1:])

    def student_inputs(m: int) -> tuple:
        x0, t, y, noise, teacher_out, _ = public_examples(models, public, m, settings, public_gen)
        return x0, t, y, noise, teacher_out.reshape(m, k, *shape)

    def discriminator_inputs(m: int) -> tuple:
        x0, t, y, noise, _, teacher_eps = public_examples(models, public, m, settings, public_gen)
        _, _, student_eps = eps_outputs(models.diffusion, models.student, x0, t, y, noise)
        return teacher_eps.reshape(m, k, *shape), student_eps.reshape(m, k, *shape), t, y

    subspaces = {}
    for name, model, loss, inputs in (("student", models.student, s_loss, student_inputs),
                                      ("discriminator", models.discriminator, discriminator_example_loss(models.diffusion.num_timesteps),
                                       discriminator_inputs)):
        if plan.noise_multipliers.get(name, 0.0) > 0:
            sub = subspace_plan(expected_batch=expected_batch, noise_multiplier=plan.noise_multipliers[name],
                                steps=plan.steps, public_records=public.n)
            subspaces[name] = PublicSubspace(model, loss, sub, inputs)
            log.info("DP training: the %s's noisy gradient projected onto %d directions of %d public examples' "
                     "gradients, estimated again every %d steps (post-processing)", name, sub.k, sub.public_examples,
                     sub.refresh_every)
    return subspaces


def public_examples(models: "Models", public, m: int, settings: StudentSettings, gen: torch.Generator) -> tuple:
    """``m`` public examples drawn with replacement, their timesteps, noise and dropped labels from ``gen`` (the
    public generator), and the public teacher's output and eps: x0 [m,C,H,W], t [m,k], y [m], noise
    [m,k,C,H,W], teacher output and eps [m*k,C,H,W]."""
    device, k = public.x.device, settings.timesteps_per_example
    pidx = torch.randint(public.n, (m,), generator=gen).to(device)
    x0, y = public.x[pidx], public.y[pidx].clone()
    t, noise, drop = _draw(m, k, tuple(public.x.shape[1:]), models.diffusion, settings, public.num_classes > 0, gen)
    t, noise = t.to(device), noise.to(device)
    y[drop.to(device)] = models.student.null_class
    _, teacher_out, teacher_eps = eps_outputs(models.diffusion, models.teacher, x0, t, y, noise)
    return x0, t, y, noise, teacher_out, teacher_eps


def _student_step(models: "Models", update, student_optim: tuple, disc_optim: tuple, train, settings: StudentSettings,
                  data_gen: torch.Generator, plan: DpPlan, checkpoint: str):
    """One distillation step on a Poisson batch: the student's update, then the discriminator's on the same batch."""
    student, teacher, discriminator, diffusion = models.student, models.teacher, models.discriminator, models.diffusion
    (s_opt, s_sched), (d_opt, d_sched) = student_optim, disc_optim
    sampler, k, shape = PoissonSampler(train.n, plan.sample_rate, data_gen), settings.timesteps_per_example, tuple(train.x.shape[1:])
    device = train.x.device

    def step_function(step: int, logged: bool) -> dict | None:
        idx = sampler.sample().to(device)
        b = int(idx.numel())
        x0, y = train.x[idx], train.y[idx].clone()
        t, noise, drop = _draw(b, k, shape, diffusion, settings, train.num_classes > 0, data_gen)
        t, noise = t.to(device), noise.to(device)
        y[drop.to(device)] = student.null_class
        _, teacher_out, teacher_eps = eps_outputs(diffusion, teacher, x0, t, y, noise)

        s_opt.zero_grad(set_to_none=True)
        models.discriminator_params["p"] = frozen_params(discriminator)  # the student's loss reads it as it is now
        s_info = update.student_gradients(x0, t, y, noise, teacher_out.reshape(b, k, *shape), step=step)
        s_opt.step()
        s_sched.step()
        check_parameters_finite(student, step + 1, checkpoint)  # on the released (noisy) weights, not a private loss

        _, _, student_eps = eps_outputs(diffusion, student, x0, t, y, noise)
        d_opt.zero_grad(set_to_none=True)
        update.discriminator_gradients(t, y, teacher_eps.reshape(b, k, *shape), student_eps.reshape(b, k, *shape),
                                       step=step)
        d_opt.step()
        d_sched.step()
        if not logged:
            return None
        with torch.no_grad():
            if b:
                tk, yk = t.reshape(-1), y[:, None].expand(b, k).reshape(-1)
                distill = float(diffusion.output_mse(student_eps, teacher_eps, tk).mean())
                d_loss = float(discriminator_loss(discriminator(teacher_eps, tk, yk), discriminator(student_eps, tk, yk)).mean())
            else:
                distill = d_loss = float("nan")
        return {"step": step + 1, "distill_mse": distill, "disc_loss": d_loss, "lr": s_sched.get_last_lr()[0], **s_info}

    return step_function


def _student_plan(settings: StudentSettings, mode: str, d_private: bool, n: int, upstream: list[dict], log) -> DpPlan:
    """The DP plan of the student and (when DP) its discriminator: one Poisson batch, sigma_eff split by the
    budget shares.  Paper mode: sized alike, with the paper's configured noise (not DP)."""
    if mode == "paper":
        return paper_plan(plan_dp_training(settings, "student", n=n, upstream=upstream, shares=None,
                                           stage="distill_student", log=log))
    split = settings.budget_split
    shares = {"student": split["student"], **({"discriminator": split["discriminator"]} if d_private else {})}
    return plan_dp_training(settings, "student", n=n, upstream=upstream, shares=shares, stage="distill_student", log=log)


def _sound_ledger_entries(plan: DpPlan, d_private: bool, seed_kind: str) -> list[dict]:
    if d_private:
        return plan.entries({"student": "distill_student", "discriminator": "discriminator"}, seed_kind)
    return plan.entries({"student": "distill_student"}, seed_kind) + [
        make_entry(stage="discriminator", private=False, mechanism="none", steps=plan.steps,
                   notes="trained on the public split only")]


def eps_outputs(diffusion, model, x0, t, y, noise):
    """Flattened [b*k] forward of ``model`` without gradients: (x_t, output, eps-space output).

    x0 [b,C,H,W], t [b,k], y [b], noise [b,k,C,H,W].
    """
    b, k, shape = x0.shape[0], t.shape[1], tuple(x0.shape[1:])
    x0k = x0[:, None].expand(b, k, *shape).reshape(b * k, *shape)
    tk, yk = t.reshape(-1), y[:, None].expand(b, k).reshape(-1)
    xt = diffusion.q_sample(x0k, tk, noise.reshape(b * k, *shape))
    with torch.no_grad():
        out = model(xt, tk, yk)
    return xt, out, diffusion.eps_from_output(out, xt, tk)


def _plain_discriminator_gradients(discriminator, teacher_eps, student_eps, t, y) -> None:
    """The discriminator's batch loss, backpropagated without clipping or noise.  eps [m,C,H,W], t [m], y [m]."""
    if teacher_eps.shape[0]:
        discriminator_loss(discriminator(teacher_eps, t, y), discriminator(student_eps, t, y)).mean().backward()


@dataclass
class Models:
    """The networks one distillation step touches."""

    student: torch.nn.Module
    teacher: torch.nn.Module
    discriminator: torch.nn.Module
    diffusion: object
    # the discriminator's weights the student's per-example loss reads, refreshed before each student update
    discriminator_params: dict = field(default_factory=dict)


class SoundUpdate:
    """The sound mechanism (docs/PRIVACY.md, "What a sound run does").

    Student: each record's whole loss over its K timesteps, its gradient clipped once in parameter space,
    noise sigma_s*C on the sum (``s_engine``).  Discriminator: the same Poisson batch through its own DP-SGD
    engine (one mechanism with the student, sigma_eff), or, with ``discriminator.privacy: public``, a batch of
    the public split only (``public``), so no private record reaches it.  ``subspaces``: the noisy sums projected
    onto public directions (``dp.subspace``; post-processing, the same ledger).
    """

    def __init__(self, models: Models, s_engine, d_engine, *, public, public_gen, settings: dict,
                 subspaces: dict[str, PublicSubspace] | None = None):
        self.models, self.s_engine, self.d_engine = models, s_engine, d_engine
        self.public, self.public_gen, self.settings = public, public_gen, settings
        self.subspaces = subspaces or {}

    def _noisy_sum(self, name: str, engine, batch: tuple, step: int):
        projection = self.subspaces.get(name)
        if projection is not None:
            projection.refresh(step)
        stats = engine.step_gradients(batch)
        if projection is not None:
            projection.project()
        return stats

    def student_gradients(self, x0, t, y, noise, teacher_out_k, step: int) -> dict:
        stats = self._noisy_sum("student", self.s_engine, (x0, t, y, noise, teacher_out_k), step)
        return {"batch": int(x0.shape[0]), "grad_norm": stats.mean_norm, "clipped": stats.clipped_fraction}

    def discriminator_gradients(self, t, y, teacher_eps_k, student_eps_k, step: int) -> None:
        """teacher_eps_k, student_eps_k [b,k,C,H,W] of the private batch; t [b,k], y [b]."""
        if self.public is None:
            self._noisy_sum("discriminator", self.d_engine, (teacher_eps_k, student_eps_k, t, y), step)
            return
        m, k = self.models, t.shape[1]
        px0, pt, py, pnoise, _, te = public_examples(m, self.public, self.settings.batch_size, self.settings,
                                                     self.public_gen)
        _, _, se = eps_outputs(m.diffusion, m.student, px0, pt, py, pnoise)
        _plain_discriminator_gradients(m.discriminator, te, se, pt.reshape(-1), py[:, None].expand(-1, k).reshape(-1))
