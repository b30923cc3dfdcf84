"""The ghost engine's clipped sums against vmap's, at the demo's and the paper's shapes, K = 1 and 8.  Each test can
fail."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.errors import PrivacyError
from dpsad.models.unet import UNet, UNetConfig, xavier_init
from dpsad.privacy.mechanism import clipped_sum as ghost_engine
from dpsad.privacy.mechanism.clipped_sum import clipped_sum, ghost_pays
from dpsad.privacy.mechanism.dpsgd import (CLIP_MARGIN, DPSGD, clip_per_example, clip_per_group, full_precision,
                                     per_example_gradients)
from dpsad.privacy.mechanism.per_example import layer_calls, per_example_from_batched, with_batched_form
from dpsad.training.diffusion_training import diffusion_example_loss

SHAPES = {  # the demo's UNet, and the 28x28 UNet of benchmarks/bench_opacus.py --paper (1.08M parameters)
    "demo": {"image_size": 16, "base_channels": 32, "channel_mult": (1, 2, 2), "groups": 8, "time_embed_dim": 128},
    "paper": {"image_size": 28, "base_channels": 32, "channel_mult": (1, 2, 2), "groups": 8, "time_embed_dim": 128},
}


def unet_and_batch(shape: str, n: int, k: int, seed: int = 0):
    torch.manual_seed(seed)
    config = SHAPES[shape]
    unet = xavier_init(UNet(UNetConfig(in_channels=1, num_classes=10, **config)))
    size = config["image_size"]
    g = torch.Generator().manual_seed(seed + 1)
    batch = (torch.rand(n, 1, size, size, generator=g) * 2 - 1, torch.randint(0, 50, (n, k), generator=g),
             torch.randint(0, 11, (n,), generator=g), torch.randn(n, k, 1, size, size, generator=g))
    return unet, diffusion_example_loss(GaussianDiffusion(DiffusionConfig(timesteps=50))), batch


def assert_close_sums(ours: dict, reference: dict, rtol: float = 1e-4) -> None:
    for name, ref in reference.items():
        error = float((ours[name] - ref).norm())
        assert error <= rtol * float(ref.norm()) + 1e-9, (name, error, float(ref.norm()))


@pytest.mark.parametrize("shape", ["demo", pytest.param("paper", marks=pytest.mark.e2e)])  # the paper's UNet: seconds
@pytest.mark.parametrize("k", [1, 8])
def test_the_ghost_engine_gives_vmaps_clipped_sum(shape, k):
    unet, loss, batch = unet_and_batch(shape, n=3, k=k)
    calls = layer_calls(unet, loss.batched, batch)
    ghost = [prefix for prefix, module, pairs in calls if ghost_pays(module, pairs, 3)]
    convolutions = [prefix for prefix, module, _ in calls if isinstance(module, torch.nn.Conv2d)]
    assert ghost and set(convolutions) - set(ghost)  # mixed: some weights by Gram matrices, the rest per example
    if k == 1:
        assert set(ghost) & set(convolutions)  # low-resolution convolutions go ghost
    for clip in (1e-3, 1e3):  # every example clipped; none clipped
        with full_precision():
            ours, norms = clipped_sum(unet, loss.batched, batch, bounds=[clip], margin=CLIP_MARGIN)
            reference, reference_norms = clip_per_example(per_example_gradients(unet, loss, batch), clip)
        assert torch.allclose(norms[:, 0], reference_norms, rtol=1e-5)
        assert_close_sums(ours, reference)


def test_grouped_clipping_gives_vmaps_sums():
    """dp-GAN's grouped clipping (weights and biases apart, each with its own bound) by the ghost engine."""
    unet, loss, batch = unet_and_batch("demo", n=3, k=2, seed=5)
    group_of = {name: int(name.endswith("bias")) for name, _ in unet.named_parameters()}
    bounds = [0.02, 0.005]
    with full_precision():
        ours, norms = clipped_sum(unet, loss.batched, batch, bounds=bounds, group_of=group_of, margin=CLIP_MARGIN)
        reference, reference_norms = clip_per_group(per_example_gradients(unet, loss, batch), group_of, bounds)
    assert torch.allclose(norms, reference_norms, rtol=1e-5)
    assert_close_sums(ours, reference)


def test_no_per_example_gradient_of_a_ghost_weight_is_ever_formed(monkeypatch):
    """A 512 x 512 linear layer on one row per example: its norms come from Gram matrices and its sum from one
    product, and the per-example [N, 512, 512] gradient is never made."""
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1))
    loss = with_batched_form(lambda call, x: call(x[None]).sum(), lambda m, x: m(x)[:, 0])
    formed = []
    original = ghost_engine.layer_gradients

    def recording(module, pairs, n, skip=()):
        formed.append((module.weight.shape, skip))
        return original(module, pairs, n, skip)

    monkeypatch.setattr(ghost_engine, "layer_gradients", recording)
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0))
    with full_precision():
        ours, _ = clipped_sum(model, loss.batched, (x,), bounds=[0.1], margin=CLIP_MARGIN)
        reference, _ = clip_per_example(per_example_gradients(model, loss, (x,)), 0.1)
    assert (torch.Size([512, 512]), ("weight",)) in formed
    assert_close_sums(ours, reference)


def test_the_default_engine_is_ghost_on_a_cpu_hooks_elsewhere_and_its_first_step_refuses_a_loss_that_mixes_examples():
    unet, loss, batch = unet_and_batch("demo", n=4, k=2, seed=2)
    engine = DPSGD(unet, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=4,
                   noise_generator=torch.Generator().manual_seed(0))
    assert engine.per_example == "ghost"
    elsewhere = DPSGD(copy.deepcopy(unet).to("meta"), loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=4,
                      noise_generator=torch.Generator().manual_seed(0))
    assert elsewhere.per_example == "hooks"  # the faster engine on a GPU (benchmarks/README.md)

    def shuffled(model, x0, t, y, noise):  # example i's loss computed on example i+1's rows
        roll = lambda v: torch.roll(v, 1, dims=0)  # noqa: E731
        return loss.batched(model, roll(x0), roll(t), roll(y), roll(noise))

    mixed = DPSGD(unet, with_batched_form(lambda call, *ex: loss(call, *ex), shuffled), noise_multiplier=1.0,
                  clip_norm=1.0, expected_batch_size=4, noise_generator=torch.Generator().manual_seed(0))
    assert mixed.per_example == "ghost"
    with pytest.raises(PrivacyError, match="per-example norms of the ghost engine differ from vmap's"):
        mixed.step_gradients(batch)
    engine.step_gradients(batch)  # the honest loss passes the same check


def test_whether_the_first_step_check_passes_depends_on_no_private_record():
    """The engines' first-call check runs on made-up examples: a batched loss that goes wrong only on records with
    certain values (here, pixels above 50) would have failed the check, and stopped the run, only for some private
    sets.  Each engine passes on both batches; the loss that mixes every batch is still refused (test above)."""
    unet, loss, batch = unet_and_batch("demo", n=4, k=2, seed=4)

    def mixes_large_records(model, x0, t, y, noise):
        rolled = torch.where(x0.abs().amax() > 50, torch.roll(x0, 1, dims=0), x0)  # a batch of one: unchanged
        return loss.batched(model, rolled, t, y, noise)

    unusual = (batch[0] * 100,) + batch[1:]
    for per_example in ("ghost", "hooks"):
        for records in (batch, unusual):
            engine = DPSGD(unet, with_batched_form(lambda call, *ex: loss(call, *ex), mixes_large_records),
                           noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=4,
                           noise_generator=torch.Generator().manual_seed(0), per_example=per_example)
            engine.step_gradients(records)


@pytest.mark.parametrize("per_example", ["ghost", "hooks"])
def test_the_first_step_check_refuses_a_loss_that_regroups_labels_and_one_that_is_nan_on_its_inputs(per_example):
    """The made-up examples' labels and timesteps vary by row, so a batched loss that lays out one example's labels
    as ``repeat`` (example-major for the images, draw-major for the labels) is refused; and a loss whose check
    gradients are NaN, or all zero, is refused rather than passed (NaN > tolerance is False, 0 <= tolerance True).
    The check needs no record: it runs on an empty batch too."""
    unet, loss, batch = unet_and_batch("demo", n=4, k=2, seed=6)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))

    def regrouped_labels(model, x0, t, y, noise):
        b, k = t.shape
        x0k = x0[:, None].expand(b, k, *x0.shape[1:]).reshape(b * k, *x0.shape[1:])
        tk, noisek = t.reshape(-1), noise.reshape(b * k, *x0.shape[1:])
        xt = diffusion.q_sample(x0k, tk, noisek)
        out = model(xt, tk, y.repeat(k))  # should be y[:, None].expand(b, k).reshape(-1)
        return diffusion.output_mse(out, diffusion.target(x0k, xt, tk, noisek), tk).reshape(b, k).mean(dim=1)

    def nan_on_the_check(model, x0, t, y, noise):
        return loss.batched(model, x0, t, y, noise) * torch.where(x0.amin() < -0.5, float("nan"), 1.0)

    def flat(model, x0, t, y, noise):  # every gradient zero: any comparison would pass
        return 0.0 * loss.batched(model, x0, t, y, noise)

    empty = tuple(v[:0] for v in batch)  # the check reads shapes only: every process of a run checks at step one
    for batched, records, message in ((regrouped_labels, batch, "differ from vmap"),
                                      (regrouped_labels, empty, "differ from vmap"),
                                      (nan_on_the_check, batch, r"first-batch check got gradient norms \[nan"),
                                      (flat, batch, r"first-batch check got gradient norms \[0.0")):
        engine = DPSGD(unet, per_example_from_batched(batched, loss.integer_highs), noise_multiplier=1.0,
                       clip_norm=1.0, expected_batch_size=4, noise_generator=torch.Generator().manual_seed(0),
                       per_example=per_example)
        with pytest.raises(PrivacyError, match=message):
            engine.step_gradients(records)


@pytest.mark.parametrize("per_example", ["ghost", "hooks", "vmap"])
def test_a_record_whose_gradient_is_not_finite_adds_nothing_and_the_step_stays_finite(per_example):
    """One record's NaN made the noisy sum NaN and stopped the training, on a private value.  Its whole gradient
    now counts as zero (a clipped gradient like any other): the sum is the other records' sum."""
    unet, loss, batch = unet_and_batch("demo", n=4, k=2, seed=5)
    broken = (batch[0].clone(),) + batch[1:]
    broken[0][0, 0, 0, 0] = float("nan")
    engine = DPSGD(unet, loss, noise_multiplier=0.0, clip_norm=0.05, expected_batch_size=1.0,
                   noise_generator=torch.Generator().manual_seed(0), per_example=per_example)
    summed, norms = engine.clip_and_accumulate(broken)
    others, _ = engine.clip_and_accumulate(tuple(v[1:] for v in batch))
    assert math.isinf(float(norms[0])) and bool(torch.isfinite(norms[1:]).all())
    assert_close_sums(summed, others)
    noisy = DPSGD(unet, loss, noise_multiplier=1.0, clip_norm=1e6, expected_batch_size=4.0,
                  noise_generator=torch.Generator().manual_seed(0), per_example=per_example)
    stats = noisy.step_gradients(broken)
    assert all(bool(torch.isfinite(p.grad).all()) for p in unet.parameters())
    assert stats.clipped_fraction == 0.25  # the broken record counts as clipped, the others are not (C = 1e6)


def test_one_record_moves_the_ghost_sum_by_at_most_c_with_eight_noise_draws():
    unet, loss, batch = unet_and_batch("demo", n=5, k=8, seed=3)
    clip = 0.05
    engine = DPSGD(unet, loss, noise_multiplier=0.0, clip_norm=clip, expected_batch_size=1.0,
                   noise_generator=torch.Generator().manual_seed(0))
    full, _ = engine.clip_and_accumulate(batch)
    without, _ = engine.clip_and_accumulate(tuple(v[1:] for v in batch))
    change = math.sqrt(sum(float((full[n] - without[n]).double().pow(2).sum()) for n in full))
    print(f"one record moves the sum by {change / clip:.6f} C")
    assert 0.99 * clip < change <= clip
