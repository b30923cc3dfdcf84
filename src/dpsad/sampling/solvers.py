"""Ancestral DDPM, DDIM and DPM-Solver++ (2M) samplers with classifier-free guidance.

Both work for either parameterisation through ``diffusion.eps_from_output``.
Guidance follows the paper's Eq. 5: eps = (1 + w) eps(x, y) - w eps(x, null).
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from ..diffusion import GaussianDiffusion


@torch.no_grad()
def guided_eps(model, diffusion: GaussianDiffusion, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, guidance: float) -> torch.Tensor:
    """Noise prediction with guidance weight ``guidance`` (0: plain conditional).  [N,C,H,W]."""
    if guidance == 0.0:
        return diffusion.eps_from_output(model(x, t, y), x, t)
    null = torch.full_like(y, model.null_class)
    out = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]))
    eps_all = diffusion.eps_from_output(out, torch.cat([x, x]), torch.cat([t, t]))
    cond, uncond = eps_all.chunk(2)
    return (1.0 + guidance) * cond - guidance * uncond


@torch.no_grad()
def ddpm_sample(model, diffusion: GaussianDiffusion, shape, y: torch.Tensor, *, guidance: float = 0.0,
                generator: torch.Generator | None = None, progress: bool = False) -> torch.Tensor:
    """Ancestral sampling over all T steps.  Returns x_0 estimates in [-1, 1], shape ``shape``."""
    device = y.device
    x = torch.randn(shape, generator=generator, device=device)
    steps = range(diffusion.num_timesteps - 1, -1, -1)
    for step in tqdm(steps, desc="ddpm", disable=not progress, leave=False):
        t = torch.full((shape[0],), step, device=device, dtype=torch.long)
        eps = guided_eps(model, diffusion, x, t, y, guidance)
        mean = diffusion.x_prev_from_eps(x, t, eps)
        if step > 0:
            var = diffusion.posterior_variance[step].item()
            x = mean + var ** 0.5 * torch.randn(shape, generator=generator, device=device)
        else:
            x = mean
    return x.clamp(-1.0, 1.0)


def ddim_timesteps(num_timesteps: int, steps: int) -> list[int]:
    """Evenly spaced timesteps from T-1 down to 0, ``steps`` of them (at most T)."""
    steps = min(steps, num_timesteps)
    seq = torch.linspace(0, num_timesteps - 1, steps).round().long().tolist()
    return sorted(set(seq), reverse=True)


@torch.no_grad()
def ddim_step(model, diffusion: GaussianDiffusion, x: torch.Tensor, step: int, prev_step: int, y: torch.Tensor, *,
              eta: float, guidance: float, generator: torch.Generator | None) -> torch.Tensor:
    """One DDIM update from timestep ``step`` to ``prev_step`` (-1 means the clean image)."""
    n = x.shape[0]
    t = torch.full((n,), step, device=x.device, dtype=torch.long)
    eps = guided_eps(model, diffusion, x, t, y, guidance)
    abar = diffusion.alphas_cumprod[step].item()
    abar_prev = diffusion.alphas_cumprod[prev_step].item() if prev_step >= 0 else 1.0
    x0 = ((x - (1 - abar) ** 0.5 * eps) / abar ** 0.5).clamp(-1.0, 1.0)
    eps = (x - abar ** 0.5 * x0) / (1 - abar) ** 0.5  # consistent with the clipped x0
    sigma = eta * ((1 - abar_prev) / (1 - abar) * (1 - abar / abar_prev)) ** 0.5
    direction = (max(1 - abar_prev - sigma ** 2, 0.0)) ** 0.5 * eps
    x_prev = abar_prev ** 0.5 * x0 + direction
    if sigma > 0 and prev_step >= 0:
        x_prev = x_prev + sigma * torch.randn(x.shape, generator=generator, device=x.device)
    return x_prev


@torch.no_grad()
def ddim_sample(model, diffusion: GaussianDiffusion, shape, y: torch.Tensor, *, steps: int = 50, eta: float = 0.0,
                guidance: float = 0.0, generator: torch.Generator | None = None, progress: bool = False) -> torch.Tensor:
    """DDIM sampling in ``steps`` steps; eta = 0 is deterministic given the initial noise.  Returns [-1, 1]."""
    x = torch.randn(shape, generator=generator, device=y.device)
    seq = ddim_timesteps(diffusion.num_timesteps, steps)
    for i, step in enumerate(tqdm(seq, desc="ddim", disable=not progress, leave=False)):
        prev_step = seq[i + 1] if i + 1 < len(seq) else -1
        x = ddim_step(model, diffusion, x, step, prev_step, y, eta=eta, guidance=guidance, generator=generator)
    return x.clamp(-1.0, 1.0)


def half_log_snr(diffusion: GaussianDiffusion) -> torch.Tensor:
    """lambda_t = log(alpha_t / s_t) = log(sqrt(abar_t) / sqrt(1 - abar_t)) per timestep, float64 [T]."""
    abar = diffusion.alphas_cumprod.double()
    return 0.5 * (abar / (1.0 - abar)).log()


def logsnr_timesteps(diffusion: GaussianDiffusion, steps: int) -> list[int]:
    """About ``steps`` timesteps from T-1 down to 0, evenly spaced in log-SNR (what DPM-Solver++ expects at
    low resolution: evenly spaced t packs the steps where little changes and leaves one huge last step)."""
    lam = half_log_snr(diffusion)
    targets = torch.linspace(lam[-1].item(), lam[0].item(), min(steps, diffusion.num_timesteps), dtype=torch.float64)
    return sorted({int(torch.argmin((lam - v).abs())) for v in targets}, reverse=True)


@torch.no_grad()
def dpmpp_2m_sample(model, diffusion: GaussianDiffusion, shape, y: torch.Tensor, *, steps: int = 20, guidance: float = 0.0,
                    generator: torch.Generator | None = None, progress: bool = False) -> torch.Tensor:
    """DPM-Solver++ (2M, Lu et al. 2022): a second-order multistep ODE solver in data prediction, ``steps`` model calls.

    With alpha_t = sqrt(abar_t), s_t = sqrt(1 - abar_t) and lambda_t = log(alpha_t / s_t), one step from t to
    t' (h = lambda_t' - lambda_t) is x' = (s_t'/s_t) x - alpha_t' (exp(-h) - 1) D, where D is the clipped x0
    prediction (first step) or its second-order extrapolation from the previous step's.  The last call's x0
    prediction is returned, in [-1, 1].  Timesteps are spaced evenly in log-SNR.
    """
    x = torch.randn(shape, generator=generator, device=y.device)
    seq = logsnr_timesteps(diffusion, steps)
    abar = diffusion.alphas_cumprod.double()
    alpha, s, lam = abar.sqrt(), (1.0 - abar).sqrt(), half_log_snr(diffusion)
    x0_prev, h_prev = None, None
    for i, step in enumerate(tqdm(seq, desc="dpm++2m", disable=not progress, leave=False)):
        t = torch.full((shape[0],), step, device=x.device, dtype=torch.long)
        eps = guided_eps(model, diffusion, x, t, y, guidance)
        x0 = ((x - s[step].item() * eps) / alpha[step].item()).clamp(-1.0, 1.0)
        if i + 1 == len(seq):
            break
        nxt = seq[i + 1]
        h = (lam[nxt] - lam[step]).item()
        if x0_prev is None:
            d = x0
        else:
            r = h_prev / h
            d = (1.0 + 1.0 / (2.0 * r)) * x0 - (1.0 / (2.0 * r)) * x0_prev
        x = (s[nxt] / s[step]).item() * x - alpha[nxt].item() * math.expm1(-h) * d
        x0_prev, h_prev = x0, h
    return x0


SAMPLERS = {"ddpm": ddpm_sample, "ddim": ddim_sample, "dpmpp_2m": dpmpp_2m_sample}
