"""The Gaussian diffusion process, kept apart from any network.

Timesteps are 0-based: t in [0, T).  ``q_sample(x0, t)`` draws x_{t+1} in the
paper's 1-based notation; "x_prev" below is the posterior mean of the step
before ``t``.  Tensors are [N, C, H, W]; per-timestep coefficients are
gathered per example.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

PARAMETERIZATIONS = ("eps", "x_prev")


@dataclass(frozen=True)
class DiffusionConfig:
    """Linear beta schedule (paper: T = 500, beta 1e-4 .. 0.028) and the model's output meaning."""

    timesteps: int = 500
    beta_start: float = 1e-4
    beta_end: float = 0.028
    parameterization: str = "eps"

    def to_dict(self) -> dict:
        return asdict(self)


def _gather(values: torch.Tensor, t: torch.Tensor, ndim: int) -> torch.Tensor:
    """values: [T], t: [N] -> [N, 1, 1, 1] (for ndim = 4)."""
    out = values.to(t.device)[t]
    return out.reshape(-1, *([1] * (ndim - 1)))


class GaussianDiffusion:
    """Schedules precomputed once; methods named after the maths.

    Parameterisations: ``eps`` (the network predicts the added noise) and
    ``x_prev`` (the network predicts the mean of x_{t-1} given x_t, as in the
    DP-SAD paper).  They are related by
    x_prev = (x_t - b_t * eps) / sqrt(alpha_t), b_t = beta_t / sqrt(1 - alphabar_t),
    so every sampler and loss converts through :meth:`eps_from_output`.
    """

    def __init__(self, config: DiffusionConfig):
        if config.parameterization not in PARAMETERIZATIONS:
            raise ValueError(f"parameterization '{config.parameterization}', expected one of {PARAMETERIZATIONS}")
        if not 0 < config.beta_start < config.beta_end < 1:
            raise ValueError(f"beta schedule {config.beta_start}..{config.beta_end}, expected 0 < start < end < 1")
        self.config = config
        self.num_timesteps = config.timesteps
        betas = torch.linspace(config.beta_start, config.beta_end, config.timesteps, dtype=torch.float64)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)
        alphas_cumprod_prev = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        as32 = lambda v: v.to(torch.float32)  # noqa: E731
        self.betas = as32(betas)
        self.alphas = as32(alphas)
        self.alphas_cumprod = as32(alphas_cumprod)
        self.alphas_cumprod_prev = as32(alphas_cumprod_prev)
        self.sqrt_alphas_cumprod = as32(alphas_cumprod.sqrt())
        self.sqrt_one_minus_alphas_cumprod = as32((1.0 - alphas_cumprod).sqrt())
        self.posterior_variance = as32(betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod))
        self.posterior_mean_coef_x0 = as32(betas * alphas_cumprod_prev.sqrt() / (1.0 - alphas_cumprod))
        self.posterior_mean_coef_xt = as32((1.0 - alphas_cumprod_prev) * alphas.sqrt() / (1.0 - alphas_cumprod))
        self.eps_coef = as32(betas / (1.0 - alphas_cumprod).sqrt())  # b_t
        self.inv_sqrt_alphas = as32(1.0 / alphas.sqrt())

    # forward process -------------------------------------------------------------
    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Draw x_t ~ q(x_t | x_0) with the given standard normal ``noise``.  [N,C,H,W] -> [N,C,H,W]."""
        return _gather(self.sqrt_alphas_cumprod, t, x0.ndim) * x0 + _gather(self.sqrt_one_minus_alphas_cumprod, t, x0.ndim) * noise

    def q_posterior_mean(self, x0: torch.Tensor, xt: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Mean of q(x_{t-1} | x_t, x_0): the data's x_{t-1} target.  [N,C,H,W]."""
        return _gather(self.posterior_mean_coef_x0, t, xt.ndim) * x0 + _gather(self.posterior_mean_coef_xt, t, xt.ndim) * xt

    # conversions between parameterisations ---------------------------------------
    def x_prev_from_eps(self, xt: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        return _gather(self.inv_sqrt_alphas, t, xt.ndim) * (xt - _gather(self.eps_coef, t, xt.ndim) * eps)

    def eps_from_x_prev(self, xt: torch.Tensor, t: torch.Tensor, x_prev: torch.Tensor) -> torch.Tensor:
        return (xt - x_prev / _gather(self.inv_sqrt_alphas, t, xt.ndim)) / _gather(self.eps_coef, t, xt.ndim)

    def x0_from_eps(self, xt: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        return (xt - _gather(self.sqrt_one_minus_alphas_cumprod, t, xt.ndim) * eps) / _gather(self.sqrt_alphas_cumprod, t, xt.ndim)

    def eps_from_output(self, output: torch.Tensor, xt: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The noise prediction implied by a network output under this parameterisation."""
        if self.config.parameterization == "eps":
            return output
        return self.eps_from_x_prev(xt, t, output)

    def target(self, x0: torch.Tensor, xt: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """What the network should output for (x_t, t) given the clean x_0 and the noise drawn."""
        if self.config.parameterization == "eps":
            return noise
        return self.q_posterior_mean(x0, xt, t)

    def output_scale(self, t: torch.Tensor, ndim: int) -> torch.Tensor:
        """Per-timestep factor s_t with (output error) / s_t = (noise-prediction error).

        For ``x_prev`` the error in x_{t-1} is b_t / sqrt(alpha_t) times the noise
        error; dividing by it gives every timestep DDPM's "simple" weight.
        """
        if self.config.parameterization == "eps":
            return torch.ones(t.shape[0], *([1] * (ndim - 1)), device=t.device)
        return _gather(self.eps_coef * self.inv_sqrt_alphas, t, ndim)

    # noise-level distributions and weightings (DPDM options) -------------------------
    def sigmas(self) -> torch.Tensor:
        """EDM-style noise level of each timestep: sigma_t = sqrt((1 - alphabar_t) / alphabar_t).  [T]."""
        return ((1.0 - self.alphas_cumprod) / self.alphas_cumprod).sqrt()

    def sample_timesteps(self, shape, generator: torch.Generator, distribution: str = "uniform",
                         lognormal_mean: float = -1.2, lognormal_std: float = 1.2) -> torch.Tensor:
        """Timesteps of the given shape: uniform over [0, T), or log-normal in sigma (EDM) mapped to the nearest t."""
        if distribution == "uniform":
            return torch.randint(self.num_timesteps, shape, generator=generator)
        if distribution == "lognormal":
            log_sigma = lognormal_mean + lognormal_std * torch.randn(shape, generator=generator)
            log_table = self.sigmas().log()
            idx = torch.searchsorted(log_table, log_sigma.flatten().contiguous()).clamp(0, self.num_timesteps - 1)
            below = (idx - 1).clamp(min=0)
            closer_below = (log_sigma.flatten() - log_table[below]).abs() < (log_table[idx] - log_sigma.flatten()).abs()
            return torch.where(closer_below, below, idx).reshape(shape)
        raise ValueError(f"noise distribution '{distribution}', expected 'uniform' or 'lognormal'")

    def loss_weight(self, t: torch.Tensor, kind: str = "simple", sigma_data: float = 0.5) -> torch.Tensor:
        """Per-example weight on the noise-prediction MSE.  [N] -> [N].

        simple: 1 (DDPM); x0: sigma_t^2 (the MSE of the implied x_0); edm: (sigma^2 + sigma_data^2) / sigma_data^2
        (EDM's lambda(sigma) times sigma^2, i.e. EDM's weighting of the x_0 error).
        """
        if kind == "simple":
            return torch.ones_like(t, dtype=torch.float32)
        sigma2 = self.sigmas().to(t.device)[t] ** 2
        if kind == "x0":
            return sigma2
        if kind == "edm":
            return (sigma2 + sigma_data ** 2) / sigma_data ** 2
        raise ValueError(f"loss weighting '{kind}', expected 'simple', 'x0' or 'edm'")

    # losses ------------------------------------------------------------------------
    def output_mse(self, a: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Normalised MSE between two outputs at timesteps t, one value per example.  [N,...] -> [N]."""
        diff = (a - b) / self.output_scale(t, a.ndim)
        return diff.pow(2).flatten(1).mean(dim=1)

    def training_losses(self, model, x0: torch.Tensor, t: torch.Tensor, y: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Denoising loss, one value per example.  x0: [N,C,H,W], t, y: [N] -> [N]."""
        xt = self.q_sample(x0, t, noise)
        return self.output_mse(model(xt, t, y), self.target(x0, xt, t, noise), t)
