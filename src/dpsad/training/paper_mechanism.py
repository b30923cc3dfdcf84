"""The DP-SAD paper's student update as printed (Eqs. 14-17), for reproduction only: it is not DP.

Eq. 17 clips each example's gradient with respect to the student's *output* (not its parameters), so one
record can still move the parameters without bound, and it divides the noise by B*T; the discriminator
is updated on the private outputs without clipping or noise (docs/PRIVACY.md).  Everything here is kept
apart from the sound loop of :mod:`.student`: it runs only with ``mode: paper`` and ``allow_unsound: true``,
and its ledger entries are marked unsound, so every run built on it has ``dp_guarantee: false``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..config.settings import StudentSettings
from ..errors import DpsadError, PrivacyError
from ..privacy.books.ledger import make_entry
from ..privacy.mechanism.plan import DpPlan
from .losses import discriminator_loss, student_loss


def check_paper_mode(settings: StudentSettings, distributed_enabled: bool) -> None:
    """Refuse the paper's mechanism unless asked for by name, and where it cannot run."""
    if distributed_enabled:
        raise DpsadError("paper mode runs in a single process, expected distributed.processes: 1")
    if not settings.allow_unsound:
        raise PrivacyError("student mode 'paper' is not differentially private (see docs/PRIVACY.md); "
                           "set allow_unsound: true to run it for reproduction only")
    if settings.timesteps_per_example != 1:
        raise DpsadError(f"timesteps_per_example = {settings.timesteps_per_example} in paper mode, expected 1 "
                         "(the paper's single random step)")


def paper_plan(plan: DpPlan) -> DpPlan:
    """``plan`` (sized, no noise calibrated) with the paper's configured multiplier and a noise-free discriminator."""
    return replace(plan, noise_multipliers={"student": float(plan.settings["paper_noise_multiplier"]),
                                            "discriminator": 0.0})


def paper_ledger_entries(plan: DpPlan, num_timesteps: int, seed_kind: str) -> list[dict]:
    """The entries of a paper-mode training: unsound, so the verdict of every run built on it is false."""
    sigma = plan.noise_multipliers["student"]
    return [
        make_entry(stage="distill_student", private=True, mechanism="sgm", sample_rate=plan.sample_rate,
                   noise_multiplier=sigma / num_timesteps, steps=plan.steps, clip_norm=plan.clip_norm, sound=False,
                   noise_seed=seed_kind,
                   notes=(f"paper mode: output-space clipping (Eq. 17) does not bound the parameter-space sensitivity, "
                          f"and the noise is divided by T = {num_timesteps} (effective noise multiplier "
                          f"{sigma / num_timesteps:.5g})")),
        make_entry(stage="discriminator", private=True, mechanism="none", steps=plan.steps,
                   notes="paper mode: discriminator updated on private outputs without clipping or noise"),
    ]


class PaperUpdate:
    """One step of the paper's equations: the student's output-space gradient clipped, backpropagated and
    noised with sigma*C/(B*T); the discriminator on the private batch without clipping or noise.

    ``models``: an object with ``student``, ``discriminator`` and ``diffusion`` (:class:`.student.Models`)."""

    def __init__(self, models, weights: dict, *, clip: float, sigma: float, expected_batch: float, noise_gen):
        self.models, self.weights = models, weights
        self.clip, self.sigma, self.expected_batch, self.noise_gen = clip, sigma, expected_batch, noise_gen

    def student_gradients(self, x0, t, y, noise, teacher_out_k, step: int) -> dict:
        """x0 [b,C,H,W], t [b,1], y [b], noise and teacher_out_k [b,1,C,H,W]; fills the student's .grad."""
        m = self.models
        return paper_student_gradients(m.student, m.discriminator, m.diffusion, x0, t, y, noise, teacher_out_k,
                                       self.weights, clip=self.clip, sigma=self.sigma,
                                       expected_batch=self.expected_batch, noise_gen=self.noise_gen)

    def discriminator_gradients(self, t, y, teacher_eps_k, student_eps_k, step: int) -> None:
        """t [b,k], y [b], eps [b,k,C,H,W]: the batch loss backpropagated without clipping or noise (``step``:
        unused, as in the student's: the paper's update has no subspace)."""
        b, k = t.shape
        if b:
            tk, yk = t.reshape(-1), y[:, None].expand(b, k).reshape(-1)
            d = self.models.discriminator
            discriminator_loss(d(teacher_eps_k.flatten(0, 1), tk, yk), d(student_eps_k.flatten(0, 1), tk, yk)).mean().backward()


def paper_student_gradients(student, discriminator, diffusion, x0, t, y, noise, teacher_out_k, weights, *,
                            clip, sigma, expected_batch, noise_gen) -> dict:
    """Eq. 17 as printed: clip d loss_i / d x_theta,i in output space, backpropagate, add N(0, sigma^2 C^2)/(B T)."""
    b = x0.shape[0]
    if b == 0:
        for p in student.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    else:
        tk = t[:, 0]
        xt = diffusion.q_sample(x0, tk, noise[:, 0])
        s_out = student(xt, tk, y)
        target = diffusion.target(x0, xt, tk, noise[:, 0])
        logits = discriminator(diffusion.eps_from_output(s_out, xt, tk), tk, y)
        per_example = student_loss(s_out, teacher_out_k[:, 0], target, logits, tk, diffusion, **weights)
        (v,) = torch.autograd.grad(per_example.sum(), s_out, retain_graph=True)
        norms = v.flatten(1).norm(dim=1)
        v = v * (clip / (norms + 1e-12)).clamp(max=1.0)[:, None, None, None]
        s_out.backward(v / expected_batch)
    T = diffusion.num_timesteps
    for p in (p for p in student.parameters() if p.requires_grad):
        p.grad = p.grad + torch.randn(p.shape, generator=noise_gen).to(p.device) * sigma * clip / (expected_batch * T)
    return {"batch": b}
