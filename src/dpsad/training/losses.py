"""DP-SAD losses, one value per example (paper Eqs. 7-12).

Model outputs are compared in the normalised x_{t-1} space of
:meth:`GaussianDiffusion.output_mse` (for the x_prev parameterisation this is
the MSE of the predicted x_{t-1} divided by (b_t / sqrt(alpha_t))^2, which
equals the MSE of the implied noise predictions).  The discriminator sees
the implied noise predictions, so teacher and student outputs have unit scale
at every timestep.  Index 0 of its logits means "teacher", 1 "student"
(the paper's [1, 0] / [0, 1] labels).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

TEACHER, STUDENT = 0, 1


def student_loss(s_out, teacher_out, target, d_logits_on_student, t, diffusion, *, teacher_weight: float,
                 data_weight: float, adv_weight: float) -> torch.Tensor:
    """L_dis + lambda * L_adv per example.  Tensors [N, ...] -> [N].

    The adversarial term is the non-saturating form -log D_teacher(student
    output) of Eq. 7's log(1 - D_teacher): same fixed point, usable gradients
    when the discriminator wins early.
    """
    distill = teacher_weight * diffusion.output_mse(s_out, teacher_out, t) + data_weight * diffusion.output_mse(s_out, target, t)
    adversarial = -F.log_softmax(d_logits_on_student, dim=-1)[:, TEACHER]
    return distill + adv_weight * adversarial


def discriminator_loss(logits_teacher, logits_student) -> torch.Tensor:
    """Cross-entropy for teacher outputs labelled 0 and student outputs labelled 1.  [N,2],[N,2] -> [N]."""
    return -F.log_softmax(logits_teacher, dim=-1)[:, TEACHER] - F.log_softmax(logits_student, dim=-1)[:, STUDENT]
