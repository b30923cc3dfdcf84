"""Train a teacher-style diffusion model without privacy: a public teacher, or the non-private reference.

Plain minibatch training (uniform batches, Adam on the batch loss, warm-up +
cosine learning rate, gradient-norm clipping for stability, EMA) through the
one loop of :mod:`.diffusion_training`.  A teacher with ``privacy: dp`` trains
like DPDM, by :mod:`.dpdm`.  Either way the ledger states whether private
records were read.
"""

from __future__ import annotations

import torch

from ..config.settings import TeacherSettings
from ..data.datafile import PreparedData
from ..runtime.distributed import SINGLE, DistributedContext
from ..privacy.books.ledger import make_entry
from ..runtime.devices import make_generator
from .checkpoints import check_finite
from .diffusion_training import LoopContext, Plan, TrainingData, train_diffusion_model


class PlainUpdate:
    """Uniform batches of ``batch_size``, the mean loss, Adam; the private split (if read) without noise."""

    def __init__(self, settings: TeacherSettings):
        self.settings = settings

    def plan(self, train: TrainingData, distributed: DistributedContext, log) -> Plan:
        self.n = train.n
        seed = self.settings.seed
        return Plan(total_steps=self.settings.steps, steps_per_epoch=train.n / self.settings.batch_size,
                    data_gen=make_generator(seed), noise_gen=make_generator(seed + 1_000_003))

    def start(self, context: LoopContext) -> None:
        self.context = context

    def batch(self, step: int, data_gen: torch.Generator) -> torch.Tensor:
        return torch.randint(self.n, (self.settings.batch_size,), generator=data_gen)

    def gradients(self, step: int, batch: tuple, logged: bool, checkpoint: str) -> dict:
        c = self.context
        loss = c.example_loss.batched(c.model, *c.distributed.shard(batch)).mean()
        loss_value = loss.item()
        check_finite(loss_value, step + 1, checkpoint)
        loss.backward()
        c.distributed.average_gradients_(c.model)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(c.model.parameters(), self.settings.grad_clip))
        return {"step": step + 1, "loss": loss_value, "grad_norm": grad_norm}

    def after_step(self, step: int, checkpoint: str) -> None:
        pass

    def state(self) -> dict:
        return {"clip_norms": []}

    def entry(self, stage_name: str, total_steps: int) -> dict:
        split = self.settings.split
        private = split == "private"
        where = {"private": " on the private split", "central": " on the central images (a DP release, in its ledger)",
                 "population": f" on the population of PE run '{self.settings.population}' (a DP release, in its ledger)"}
        return make_entry(stage=stage_name, private=private, mechanism="none", steps=total_steps,
                          notes="trained without noise" + where.get(split, " on the public split only"))


def train_teacher(*, data: PreparedData, settings: TeacherSettings, diffusion_settings: dict, labels_mode, device: torch.device,
                  out_path: str, loss_csv: str, ledger_path: str, stage_name: str, log, pseudo_labels: str | None = None,
                  distributed: DistributedContext = SINGLE, init_path: str | None = None,
                  upstream_ledgers: list[str] = ()) -> dict:
    """Train a ``teachers.<name>`` section and write its checkpoint and ledger; returns the ledger entry.

    ``privacy: dp`` trains by DP-SGD like DPDM (:func:`dpsad.training.dpdm.train_dpdm`), its noise calibrated
    against ``upstream_ledgers``; otherwise see :class:`PlainUpdate` and :func:`train_diffusion_model`.
    """
    common = dict(data=data, settings=settings, diffusion_settings=diffusion_settings, labels_mode=labels_mode,
                  device=device, out_path=out_path, loss_csv=loss_csv, ledger_path=ledger_path, stage_name=stage_name,
                  log=log, pseudo_labels=pseudo_labels, distributed=distributed, init_path=init_path,
                  upstream_ledgers=upstream_ledgers)
    if settings.privacy == "dp":
        from .dpdm import train_dpdm

        return train_dpdm(**common)
    return train_diffusion_model(update=PlainUpdate(settings), **common)
