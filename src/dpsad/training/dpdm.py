"""DPDM: DP-SGD training of a diffusion model on the private split (the DPDM baseline and DP teachers).

Poisson sampling at q = B/n, each record's loss averaged over its K noise
draws (noise multiplicity, no privacy cost), its gradient clipped once in
parameter space, Gaussian noise sigma*C on the sum
(:mod:`dpsad.privacy.mechanism.dpsgd`), batch, steps and sigma from the DP plan
(:func:`dpsad.privacy.mechanism.plan.plan_dp_training`), so that the composition with
every upstream ledger meets the target.  Optional DPDM extras: the
clipping bound set from public batches (``dp.clip_from_public``) and the
per-epoch learning-rate decays of :func:`.diffusion_training.lr_factor`.  The loop
is :func:`.diffusion_training.train_diffusion_model`.
"""

from __future__ import annotations

import torch

from ..config.settings import DpdmSettings, TeacherSettings, sized
from ..data.datafile import PreparedData
from ..runtime.distributed import SINGLE, DistributedContext
from ..privacy.books.ledger import read_ledgers
from ..privacy.mechanism.dpsgd import DPSGD, PoissonSampler, dp_generators
from ..privacy.mechanism.plan import plan_dp_training
from ..errors import DpsadError
from .schedules import draw_timesteps
from .checkpoints import check_parameters_finite
from .public_subspace import PublicSubspace, subspace_plan
from .diffusion_training import LoopContext, Plan, TrainingData, train_diffusion_model, training_data


def public_batch(public: TrainingData, size: int, settings: DpdmSettings | TeacherSettings, diffusion, gen,
                 null_class: int | None = None) -> tuple:
    """``size`` public examples (drawn with replacement) with their timesteps and noise from ``gen``, the loop's
    public generator: the inputs of the training loss, (x0, t, y, noise).  With ``null_class``, labels are dropped
    to it as training drops them (``label_dropout``; all of them for an unconditional model)."""
    b = min(size, public.n)
    idx = torch.randint(public.n, (b,), generator=gen).to(public.x.device)
    y = public.y[idx].clone()
    if null_class is not None:
        drop = torch.rand(b, generator=gen) < (settings.label_dropout if public.num_classes else 1.0)
        y[drop.to(y.device)] = null_class
    t = draw_timesteps(diffusion, (b, settings.timesteps_per_example), gen, settings).to(public.x.device)
    noise = torch.randn((b, settings.timesteps_per_example) + tuple(public.x.shape[1:]), generator=gen).to(public.x.device)
    return public.x[idx], t, y, noise


def public_clip_norm(model, loss, public: TrainingData, settings: DpdmSettings | TeacherSettings, diffusion, gen) -> float:
    """DPDM's adaptive threshold: the mean per-example gradient norm on a batch of the public split.

    Reads only public records, so it costs no privacy; the noise scales with the
    same C, keeping the noise multiplier the accountant sees.
    """
    from ..privacy.mechanism.dpsgd import per_example_gradients

    grads = per_example_gradients(model, loss, public_batch(public, settings.batch_size, settings, diffusion, gen))
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    return float(norms.mean())


class DPSGDUpdate:
    """Poisson batches, per-example clipping and calibrated Gaussian noise (one sampled Gaussian per step).

    Assumptions: a record is one example of the split trained on (add/remove
    adjacency); batches and noise come from secret seeds unless
    ``dp.noise_seed`` fixes them (then the ledger says ``fixed``).
    """

    def __init__(self, settings: DpdmSettings | TeacherSettings, *, data: PreparedData, labels_mode, pseudo_labels, upstream_ledgers, device,
                 stage_name: str, planned_n: int | None = None):
        self.settings, self.dp, self.stage_name, self.planned_n = settings, settings.dp, stage_name, planned_n
        self.public_source = (data, labels_mode, pseudo_labels, device)
        self.upstream_ledgers = list(upstream_ledgers)
        self.clip_norms: list[float] = []
        self.loss_value = float("nan")

    def plan(self, train: TrainingData, distributed: DistributedContext, log) -> Plan:
        self.dp_plan = plan_dp_training(self.settings, "dpdm", n=self.planned_n or train.n,
                                        upstream=read_ledgers(self.upstream_ledgers), shares={"teacher": 1.0},
                                        stage=self.stage_name, log=log)
        self.settings = sized(self.settings, self.dp_plan.settings)
        self.n, self.q, self.sigma = train.n, self.dp_plan.sample_rate, self.dp_plan.noise_multipliers["teacher"]
        total_steps = self.dp_plan.steps
        if self.dp.clip_from_public:
            log.info("DP training: the clip bound is set from public batches every %d steps",
                     self.dp.clip_update_every)
        self.subspace_plan = None
        if self.dp.subspace:
            public_records = len(self.public_source[0].splits.get("public", ()))
            if public_records == 0:
                raise DpsadError("dp.subspace: true but the public split is empty, expected public images "
                                 "(the subspace is estimated from them alone)")
            self.subspace_plan = subspace_plan(expected_batch=self.q * self.n, noise_multiplier=self.sigma,
                                               steps=total_steps, public_records=public_records)
            log.info("DP training: the noisy gradient projected onto %d directions of %d public examples' "
                     "gradients, estimated again every %d steps (post-processing)", self.subspace_plan.k,
                     self.subspace_plan.public_examples, self.subspace_plan.refresh_every)
        # batches and noise from secret seeds (fixed only when dp.noise_seed is set)
        self.randomness = dp_generators(self.dp.noise_seed, distributed)
        return Plan(total_steps=total_steps, steps_per_epoch=1.0 / self.q, data_gen=self.randomness.sampling,
                    noise_gen=self.randomness.noise)

    def start(self, context: LoopContext) -> None:
        self.context = context
        if context.resumed is not None:
            self.clip_norms = list(context.resumed.get("clip_norms", []))
        self.engine = DPSGD(context.model, context.example_loss, noise_multiplier=self.sigma,
                            clip_norm=self.dp.clip_norm, expected_batch_size=self.q * self.n,
                            noise_generator=context.plan.noise_gen, microbatch_size=self.dp.microbatch_size,
                            distributed=context.distributed, per_example=self.dp.per_example,
                            precision=self.dp.precision)
        self.sampler = PoissonSampler(self.n, self.q, context.plan.data_gen)
        data, labels_mode, pseudo_labels, device = self.public_source
        self.public = (training_data(data, "public", labels_mode, device, pseudo_labels)
                       if self.dp.clip_from_public or self.subspace_plan is not None else None)
        self.subspace = None if self.subspace_plan is None else PublicSubspace(
            context.model, context.example_loss, self.subspace_plan,
            lambda m: public_batch(self.public, m, self.settings, context.diffusion, context.public_gen,
                                   null_class=context.model.null_class))  # the guidance row trains too

    def batch(self, step: int, data_gen: torch.Generator) -> torch.Tensor:
        c = self.context
        if self.subspace is not None:
            self.subspace.refresh(step)
        if self.dp.clip_from_public and step % self.dp.clip_update_every == 0:
            self.engine.clip_norm = c.distributed.broadcast_float(public_clip_norm(
                c.model, c.example_loss, self.public, self.settings, c.diffusion, c.public_gen))
            self.clip_norms.append(self.engine.clip_norm)
        elif self.dp.clip_from_public and self.clip_norms:
            self.engine.clip_norm = self.clip_norms[-1]
        return self.sampler.sample()

    def gradients(self, step: int, batch: tuple, logged: bool, checkpoint: str) -> dict:
        c = self.context
        x0, t, y, noise = batch
        b = int(x0.shape[0])
        stats = self.engine.step_gradients(batch)
        if self.subspace is not None:
            self.subspace.project()
        if logged:  # the curator's log only: one extra forward per logged step
            with torch.no_grad():
                self.loss_value = (float(c.diffusion.training_losses(c.model, x0, t[:, 0], y, noise[:, 0]).mean())
                                   if b else float("nan"))
        return {"step": step + 1, "loss": self.loss_value, "batch": b, "grad_norm": stats.mean_norm,
                "clipped": stats.clipped_fraction, "clip_norm": self.engine.clip_norm}

    def after_step(self, step: int, checkpoint: str) -> None:
        # a decision on the noisy parameters, never on the private loss
        check_parameters_finite(self.context.model, step + 1, checkpoint)

    def state(self) -> dict:
        return {"clip_norms": self.clip_norms}

    def entry(self, stage_name: str, total_steps: int) -> dict:
        adaptive = bool(self.clip_norms)
        return self.dp_plan.entries(
            {"teacher": stage_name}, self.randomness.seed_kind,
            clip_norms={"teacher": sum(self.clip_norms) / len(self.clip_norms)} if adaptive else None,
            notes={"teacher": f"clip norm set from public batches every {self.dp.clip_update_every} steps "
                              "(mean shown); noise scales with it"} if adaptive else None)[0]


def train_dpdm(*, data: PreparedData, settings: DpdmSettings | TeacherSettings, diffusion_settings: dict, labels_mode, device: torch.device,
               out_path: str, loss_csv: str, ledger_path: str, stage_name: str, log, pseudo_labels: str | None = None,
               distributed: DistributedContext = SINGLE, init_path: str | None = None,
               upstream_ledgers: list[str] = (), planned_n: int | None = None) -> dict:
    """DP-SGD training per ``settings`` (a ``dpdm`` or DP ``teachers.<name>`` section, with its ``target_epsilon``
    and ``delta``); writes the checkpoint and the ledger (``upstream_ledgers`` plus its own entry) and returns its
    entry.  ``planned_n``: as for :func:`.student.train_student`."""
    update = DPSGDUpdate(settings, data=data, labels_mode=labels_mode, pseudo_labels=pseudo_labels,
                         upstream_ledgers=upstream_ledgers, device=device, stage_name=stage_name, planned_n=planned_n)
    return train_diffusion_model(update=update, data=data, settings=settings, diffusion_settings=diffusion_settings,
                                 labels_mode=labels_mode, device=device, out_path=out_path, loss_csv=loss_csv,
                                 ledger_path=ledger_path, stage_name=stage_name, log=log, pseudo_labels=pseudo_labels,
                                 distributed=distributed, init_path=init_path, upstream_ledgers=upstream_ledgers)
