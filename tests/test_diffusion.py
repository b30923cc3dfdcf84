"""The diffusion process, the two parameterisations, the UNet and the samplers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.models.discriminator import Discriminator, DiscriminatorConfig
from dpsad.models.unet import UNet, UNetConfig
from dpsad.sampling.solvers import ddim_sample, ddim_step, ddpm_sample, dpmpp_2m_sample


def tiny_unet(size=28, channels=1, classes=3):
    return UNet(UNetConfig(image_size=size, in_channels=channels, num_classes=classes, base_channels=8,
                           channel_mult=(1, 2), groups=4, time_embed_dim=16))


@pytest.mark.parametrize("size, channels, mult", [(28, 1, (1, 2, 2)), (32, 3, (1, 2, 2)), (64, 3, (1, 1, 2, 2))])
def test_unet_shapes_and_no_batchnorm(size, channels, mult):
    model = UNet(UNetConfig(image_size=size, in_channels=channels, num_classes=2, base_channels=8, channel_mult=mult,
                            attention_resolutions=(size // 4,), groups=4, time_embed_dim=16))
    x = torch.randn(3, channels, size, size)
    out = model(x, torch.tensor([0, 10, 499]), torch.tensor([0, 1, 2]))
    assert out.shape == x.shape
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_outputs_of_one_example_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    model = tiny_unet()
    x, t, y = torch.randn(4, 1, 28, 28), torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3])
    full = model(x, t, y)
    x2 = x.clone()
    x2[1:] = torch.randn(3, 1, 28, 28)
    assert torch.allclose(model(x2, t, y)[0], full[0], atol=1e-6)
    d = Discriminator(DiscriminatorConfig(num_classes=3, base_channels=8, groups=4))
    assert torch.allclose(d(x2, t, y)[0], d(x, t, y)[0], atol=1e-6)


def test_losses_return_one_value_per_example():
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    model = tiny_unet()
    x0 = torch.rand(5, 1, 28, 28) * 2 - 1
    loss = diffusion.training_losses(model, x0, torch.randint(50, (5,)), torch.zeros(5, dtype=torch.long), torch.randn_like(x0))
    assert loss.shape == (5,)


def test_q_sample_statistics():
    diffusion = GaussianDiffusion(DiffusionConfig())
    x0 = torch.full((20000, 1, 1, 1), 0.5)
    t = torch.full((20000,), 250)
    xt = diffusion.q_sample(x0, t, torch.randn_like(x0, generator=None))
    abar = diffusion.alphas_cumprod[250]
    assert xt.mean().item() == pytest.approx(0.5 * abar.sqrt().item(), abs=0.02)
    assert xt.var().item() == pytest.approx((1 - abar).item(), rel=0.05)


def test_parameterisations_agree_on_a_known_case():
    torch.manual_seed(1)
    eps_d = GaussianDiffusion(DiffusionConfig(parameterization="eps"))
    xprev_d = GaussianDiffusion(DiffusionConfig(parameterization="x_prev"))
    x0 = torch.rand(4, 1, 8, 8) * 2 - 1
    noise = torch.randn_like(x0)
    t = torch.tensor([0, 5, 200, 499])
    xt = eps_d.q_sample(x0, t, noise)
    # the x_prev target (posterior mean) is what the true noise implies
    assert torch.allclose(xprev_d.target(x0, xt, t, noise), eps_d.x_prev_from_eps(xt, t, noise), atol=1e-5)
    # and converting it back recovers the noise
    assert torch.allclose(xprev_d.eps_from_output(xprev_d.target(x0, xt, t, noise), xt, t), noise, atol=2e-3)
    # the normalised losses coincide for corresponding outputs
    wrong_eps = noise + 0.1 * torch.randn_like(noise)
    loss_eps = eps_d.output_mse(wrong_eps, noise, t)
    loss_xprev = xprev_d.output_mse(eps_d.x_prev_from_eps(xt, t, wrong_eps), eps_d.x_prev_from_eps(xt, t, noise), t)
    assert torch.allclose(loss_eps, loss_xprev, rtol=1e-3)


def test_ddim_eta_zero_is_deterministic_and_eta_one_is_not():
    torch.manual_seed(2)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=40))
    model = tiny_unet().eval()
    x = torch.randn(2, 1, 28, 28)
    y = torch.tensor([0, 1])
    a = ddim_step(model, diffusion, x, 30, 20, y, eta=0.0, guidance=0.0, generator=torch.Generator().manual_seed(0))
    b = ddim_step(model, diffusion, x, 30, 20, y, eta=0.0, guidance=0.0, generator=torch.Generator().manual_seed(1))
    c = ddim_step(model, diffusion, x, 30, 20, y, eta=1.0, guidance=0.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.allclose(a, c)


@pytest.mark.parametrize("parameterization", ["eps", "x_prev"])
def test_samplers_shapes_range_and_guidance(parameterization):
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=20, parameterization=parameterization))
    model = tiny_unet().eval()
    y = torch.tensor([0, 1, 2])
    out = ddpm_sample(model, diffusion, (3, 1, 28, 28), y, guidance=1.8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, 1, 28, 28) and out.abs().max() <= 1.0 and torch.isfinite(out).all()
    out = ddim_sample(model, diffusion, (3, 1, 28, 28), y, steps=5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, 1, 28, 28) and torch.isfinite(out).all()


class GaussianDataDenoiser(nn.Module):
    """The exact noise predictor for data x0 ~ N(mean, std^2) per pixel: E[eps | x_t] = s_t (x_t - a_t m) / (a_t^2 std^2 + s_t^2)."""

    null_class = 0

    def __init__(self, diffusion, mean, std):
        super().__init__()
        self.abar, self.mean, self.std = diffusion.alphas_cumprod.double(), mean, std

    def forward(self, x, t, y):
        a, s = self.abar[t].sqrt().view(-1, 1, 1, 1), (1 - self.abar[t]).sqrt().view(-1, 1, 1, 1)
        return (s * (x.double() - a * self.mean) / (a ** 2 * self.std ** 2 + s ** 2)).float()


@pytest.mark.parametrize("sampler, steps, tolerance", [("ddim", 50, 0.01), ("dpmpp_2m", 10, 0.01), ("dpmpp_2m", 20, 0.005)])
def test_ode_samplers_reach_the_data_distribution_with_an_exact_denoiser(sampler, steps, tolerance):
    """With the exact score of Gaussian data the probability-flow ODE maps N(0, I) onto the data: a solver with
    a wrong step formula misses the mean or the spread."""
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=500))
    model = GaussianDataDenoiser(diffusion, mean=0.3, std=0.2)
    y = torch.zeros(4000, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    if sampler == "ddim":
        out = ddim_sample(model, diffusion, (4000, 1, 2, 2), y, steps=steps, eta=0.0, generator=gen)
    else:
        out = dpmpp_2m_sample(model, diffusion, (4000, 1, 2, 2), y, steps=steps, generator=gen)
    assert abs(out.mean().item() - 0.3) < tolerance
    assert abs(out.std().item() - 0.2) < 2 * tolerance
