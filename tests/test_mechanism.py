"""The DP-SGD mechanism checked against slow, obvious references.  Each test can fail."""

from __future__ import annotations

import math
import random
import types

import pytest
import torch

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.errors import DpsadError, PrivacyError
from dpsad.models.discriminator import Discriminator, DiscriminatorConfig
from dpsad.models.unet import UNet, UNetConfig, xavier_init
import dpsad.privacy.mechanism.dpsgd as dpsgd
from dpsad.privacy.mechanism.dpsgd import (
    DPSGD,
    MT19937_WORDS,
    PoissonSampler,
    clip_per_example,
    dp_generators,
    generator_of_state,
    per_example_gradients,
)
from dpsad.privacy.mechanism.per_example import hook_per_example_gradients, with_batched_form
from dpsad.training.student import (
    discriminator_example_loss,
    frozen_params,
    select_trainable,
    student_example_loss,
)
from dpsad.training.diffusion_training import diffusion_example_loss


def tiny_models(seed=0):
    torch.manual_seed(seed)
    unet = xavier_init(UNet(UNetConfig(image_size=12, in_channels=1, num_classes=3, base_channels=8,
                                       channel_mult=(1, 2), groups=4, time_embed_dim=16)))
    disc = xavier_init(Discriminator(DiscriminatorConfig(image_size=12, in_channels=1, num_classes=3, base_channels=8,
                                                         groups=4, time_embed_dim=16)))
    return unet, disc


def student_batch(n=5, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.rand(n, 1, 12, 12, generator=g) * 2 - 1
    t = torch.randint(0, 50, (n, k), generator=g)
    y = torch.randint(0, 4, (n,), generator=g)  # 3 = the null class
    noise = torch.randn(n, k, 1, 12, 12, generator=g)
    teacher_out = torch.randn(n, k, 1, 12, 12, generator=g)
    return x0, t, y, noise, teacher_out


def loop_gradients(model, example_loss, inputs):
    """The slow reference: one backward pass per example."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    rows = []
    for i in range(inputs[0].shape[0]):
        model.zero_grad()
        loss = example_loss(model, *(x[i] for x in inputs))
        loss.backward()
        rows.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    return {n: torch.stack([r[n] for r in rows]) for n in names}


def fast_gradients(mode, model, example_loss, inputs):
    """Per-example gradients by one of the two methods DP-SGD may use."""
    if mode == "vmap":
        return per_example_gradients(model, example_loss, inputs)
    return hook_per_example_gradients(model, example_loss.batched, inputs)


MODES = ["vmap", "hooks"]


@pytest.mark.parametrize("trainable", ["all", "conditioning"])
@pytest.mark.parametrize("mode", MODES)
def test_student_per_example_gradients_match_a_loop(mode, trainable):
    unet, disc = tiny_models()
    select_trainable(unet, trainable)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    weights = {"teacher_weight": 1.0, "data_weight": 1.0, "adv_weight": 1.0}
    loss = student_example_loss(diffusion, disc, {"p": frozen_params(disc)}, weights)
    inputs = student_batch()
    fast = fast_gradients(mode, unet, loss, inputs)
    slow = loop_gradients(unet, loss, inputs)
    assert set(fast) == {n for n, p in unet.named_parameters() if p.requires_grad}
    for name in fast:
        assert torch.allclose(fast[name], slow[name], atol=1e-5), name


@pytest.mark.parametrize("mode", MODES)
def test_discriminator_per_example_gradients_match_a_loop(mode):
    _, disc = tiny_models(1)
    g = torch.Generator().manual_seed(3)
    inputs = (torch.randn(4, 2, 1, 12, 12, generator=g), torch.randn(4, 2, 1, 12, 12, generator=g),
              torch.randint(0, 50, (4, 2), generator=g), torch.randint(0, 4, (4,), generator=g))
    loss = discriminator_example_loss(50)
    fast = fast_gradients(mode, disc, loss, inputs)
    slow = loop_gradients(disc, loss, inputs)
    assert set(fast) == set(slow)
    for name in slow:
        assert torch.allclose(fast[name], slow[name], atol=1e-5), name


@pytest.mark.parametrize("mode", MODES)
def test_teacher_per_example_gradients_match_a_loop(mode):
    unet, _ = tiny_models(2)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    x0, t, y, noise, _ = student_batch(k=3, seed=4)
    loss = diffusion_example_loss(diffusion)
    fast = fast_gradients(mode, unet, loss, (x0, t, y, noise))
    slow = loop_gradients(unet, loss, (x0, t, y, noise))
    assert set(fast) == set(slow)
    for name in slow:
        assert torch.allclose(fast[name], slow[name], atol=1e-5), name


def test_dp_sgd_steps_agree_across_per_example_methods():
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    x0, t, y, noise, _ = student_batch(n=7, k=2, seed=8)
    results = {}
    for mode in MODES:
        unet, _ = tiny_models(9)
        engine = DPSGD(unet, diffusion_example_loss(diffusion), noise_multiplier=0.5, clip_norm=0.05,
                       expected_batch_size=7, noise_generator=torch.Generator().manual_seed(1), microbatch_size=3,
                       per_example=mode)
        assert engine.per_example == mode
        stats = engine.step_gradients((x0, t, y, noise))
        results[mode] = ({n: p.grad.clone() for n, p in unet.named_parameters()}, stats)
    (g_vmap, s_vmap), (g_hooks, s_hooks) = results["vmap"], results["hooks"]
    assert s_vmap.clipped_fraction == s_hooks.clipped_fraction > 0  # clipping is active, and the same
    for name in g_vmap:
        assert torch.allclose(g_vmap[name], g_hooks[name], atol=1e-6), name


def test_the_microbatch_size_changes_memory_not_the_step():
    """microbatch_size is an execution setting (changing it reruns nothing): the noisy step is the same."""
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    x0, t, y, noise, _ = student_batch(n=7, k=2, seed=8)
    steps = []
    for microbatch in (2, 7):
        unet, _ = tiny_models(9)
        engine = DPSGD(unet, diffusion_example_loss(diffusion), noise_multiplier=0.5, clip_norm=0.05,
                       expected_batch_size=7, noise_generator=torch.Generator().manual_seed(1), microbatch_size=microbatch)
        engine.step_gradients((x0, t, y, noise))
        steps.append({n: p.grad.clone() for n, p in unet.named_parameters()})
    for name in steps[0]:
        assert torch.allclose(steps[0][name], steps[1][name], atol=1e-6), name


def test_hooks_refuse_a_batched_loss_that_mixes_examples():
    """Rows not grouped by example would clip the wrong quantity: the first step's check refuses it."""
    unet, _ = tiny_models(3)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    honest = diffusion_example_loss(diffusion)

    def shuffled(model, x0, t, y, noise):  # example i's loss computed on example i+1's rows
        roll = lambda v: torch.roll(v, 1, dims=0)  # noqa: E731
        return honest.batched(model, roll(x0), roll(t), roll(y), roll(noise))

    loss = with_batched_form(lambda call, *ex: honest(call, *ex), shuffled)
    x0, t, y, noise, _ = student_batch(n=4, k=1, seed=2)
    engine = DPSGD(unet, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=4,
                   noise_generator=torch.Generator().manual_seed(0), per_example="hooks")
    with pytest.raises(PrivacyError, match="differ from vmap"):
        engine.step_gradients((x0, t, y, noise))


def test_per_example_method_falls_back_to_vmap_where_hooks_do_not_apply():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, groups=1), torch.nn.BatchNorm2d(2))

    def loss(call, x):
        return call(x[None]).sum()

    assert DPSGD(model, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=1.0,
                 noise_generator=torch.Generator()).per_example == "vmap"  # no batched form
    batched = with_batched_form(loss, lambda m, x: m(x).flatten(1).sum(1))
    engine = DPSGD(model, batched, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=1.0,
                   noise_generator=torch.Generator())
    assert engine.per_example == "vmap"  # BatchNorm mixes rows: no hooks
    with pytest.raises(DpsadError, match="BatchNorm2d"):
        DPSGD(model, batched, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=1.0,
              noise_generator=torch.Generator(), per_example="hooks")


def test_clipping_bounds_every_example_in_parameter_space():
    unet, disc = tiny_models()
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    loss = student_example_loss(diffusion, disc, {"p": frozen_params(disc)}, {"teacher_weight": 1, "data_weight": 1, "adv_weight": 1})
    grads = per_example_gradients(unet, loss, student_batch(n=6))
    for clip in (1e-3, 0.1, 10.0):
        for i in range(6):
            single = {n: g[i:i + 1] for n, g in grads.items()}
            clipped, norm = clip_per_example(single, clip)
            clipped_norm = math.sqrt(sum(float(v.pow(2).sum()) for v in clipped.values()))
            assert clipped_norm <= clip * (1 + 1e-5)
            if norm.item() <= clip:  # small gradients pass unchanged
                assert clipped_norm == pytest.approx(norm.item(), rel=1e-5)


def test_sigma_zero_and_infinite_clip_equal_plain_sgd():
    unet, _ = tiny_models(5)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    x0, t, y, noise, _ = student_batch(n=6, k=1, seed=6)
    loss = diffusion_example_loss(diffusion)
    engine = DPSGD(unet, loss, noise_multiplier=0.0, clip_norm=float("inf"), expected_batch_size=6,
                   noise_generator=torch.Generator().manual_seed(0), microbatch_size=4)
    engine.step_gradients((x0, t, y, noise))
    dp_grads = {n: p.grad.clone() for n, p in unet.named_parameters()}
    unet.zero_grad()
    torch.stack([loss(unet, *(v[i] for v in (x0, t, y, noise))) for i in range(6)]).mean().backward()
    for name, p in unet.named_parameters():
        assert torch.allclose(dp_grads[name], p.grad, atol=1e-6), name


def test_noise_std_on_zero_gradients_is_sigma_times_c():
    model = torch.nn.Linear(200, 100)  # 20,100 coordinates

    def zero_loss(call, x):
        return (call(x[None]) * 0.0).sum()

    sigma, clip, expected = 1.7, 0.3, 1.0
    engine = DPSGD(model, zero_loss, noise_multiplier=sigma, clip_norm=clip, expected_batch_size=expected,
                   noise_generator=torch.Generator().manual_seed(0))
    engine.step_gradients((torch.randn(8, 200),))
    values = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert values.mean().abs().item() < 0.02
    assert values.std().item() == pytest.approx(sigma * clip / expected, rel=0.03)


def test_noise_is_not_scaled_by_batch_or_timesteps():
    """The noisy sum is divided by the expected batch size only: std = sigma*C/(qn), whatever K or the realised size."""
    model = torch.nn.Linear(100, 100)

    def zero_loss(call, x, t):
        return (call(x[None]) * 0.0).sum() + 0.0 * t.sum()

    engine = DPSGD(model, zero_loss, noise_multiplier=2.0, clip_norm=1.0, expected_batch_size=4.0,
                   noise_generator=torch.Generator().manual_seed(1))
    engine.step_gradients((torch.randn(9, 100), torch.zeros(9, 500)))  # K = 500 timesteps per example
    values = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert values.std().item() == pytest.approx(2.0 / 4.0, rel=0.03)


def test_the_noise_is_drawn_in_float64_past_the_edge_where_float32_draws_stop():
    """torch's float32 normal draws pair 24-bit uniforms (Box-Muller): no pair lies beyond sqrt(48 ln 2) = 5.77
    standard deviations, an edge an example's gradient moves outcomes past that no neighbouring dataset gives.  The
    engine's noise is drawn in float64 (53-bit uniforms: an edge at 8.57 of mass 2^-53) and then rounded."""
    float32 = torch.randn(2 ** 20, generator=torch.Generator().manual_seed(0)).reshape(-1, 2, 8)
    assert float(float32.square().sum(dim=1).sqrt().max()) <= math.sqrt(48 * math.log(2)) + 1e-5  # why float64

    model = torch.nn.Linear(300, 100)

    def zero_loss(call, x):
        return (call(x[None]) * 0.0).sum()

    sigma, clip = 1.3, 0.7
    engine = DPSGD(model, zero_loss, noise_multiplier=sigma, clip_norm=clip, expected_batch_size=1.0,
                   noise_generator=torch.Generator().manual_seed(5))
    engine.step_gradients((torch.randn(4, 300),))
    twin = torch.Generator().manual_seed(5)
    for name, param in model.named_parameters():
        drawn = (torch.randn(param.shape, generator=twin, dtype=torch.float64) * (sigma * clip)).float()
        assert param.grad.dtype == torch.float32 and torch.equal(param.grad, drawn), name
        assert not torch.equal(param.grad, torch.randn(param.shape, generator=torch.Generator().manual_seed(5))
                               * (sigma * clip))


def test_the_secret_generators_hold_a_whole_state_of_secret_words_not_a_32_bit_seed(monkeypatch):
    """``manual_seed`` keeps a seed's low 32 bits (2^32 replays would find a training's batches and noise); the
    secret generators' 624 state words come from ``secrets``, so no seed's initialisation gives them."""
    assert torch.equal(torch.randn(8, generator=torch.Generator().manual_seed(3)),
                       torch.randn(8, generator=torch.Generator().manual_seed(3 + 7 * 2 ** 32)))

    def words(generator):
        return [int(w) for w in generator.get_state().view(torch.int64)[3:3 + MT19937_WORDS]]

    def seeded(state):  # Mersenne Twister's initialisation from a 32-bit seed, word by word
        return all(state[i] == (1812433253 * (state[i - 1] ^ (state[i - 1] >> 30)) + i) % 2 ** 32
                   for i in range(1, MT19937_WORDS))

    assert seeded(words(torch.Generator().manual_seed(2 ** 40 + 11)))
    first, second = dp_generators(None), dp_generators(None)
    states = [words(g) for g in (first.sampling, first.noise, second.sampling, second.noise)]
    assert first.seed_kind == "secret" and not any(seeded(state) for state in states)
    assert len({tuple(state) for state in states}) == 4
    again = generator_of_state(states[1])
    assert torch.equal(torch.randn(100, generator=again), torch.randn(100, generator=first.noise))
    flipped = list(states[1])
    flipped[10] ^= 1  # a word the first 100 draws read (the twist reads words i, i + 1 and i + 397 for draw i)
    assert not torch.equal(torch.randn(100, generator=generator_of_state(states[1])),
                           torch.randn(100, generator=generator_of_state(flipped)))
    with pytest.raises(ValueError, match="expected 624 integers"):
        generator_of_state(states[1][:-1])
    fixed = dp_generators(7)
    assert fixed.seed_kind == "fixed" and seeded(words(fixed.noise))

    class Another(random.Random):  # a generator that would not draw from the words written into it
        def getrandbits(self, k):
            return super().getrandbits(k) ^ 1

    monkeypatch.setattr(dpsgd, "random", types.SimpleNamespace(Random=Another))
    with pytest.raises(PrivacyError, match="does not draw from the secret state written into it"):
        generator_of_state(states[1])


def test_poisson_batch_sizes_follow_binomial_and_can_be_empty():
    n, q, steps = 500, 0.02, 3000
    sampler = PoissonSampler(n, q, torch.Generator().manual_seed(0))
    sizes = torch.tensor([sampler.sample().numel() for _ in range(steps)], dtype=torch.float64)
    assert sizes.mean().item() == pytest.approx(n * q, rel=0.03)
    assert sizes.var().item() == pytest.approx(n * q * (1 - q), rel=0.1)
    tiny = PoissonSampler(20, 0.01, torch.Generator().manual_seed(0))
    assert any(tiny.sample().numel() == 0 for _ in range(200))


@pytest.mark.parametrize("q", [1e-4, 2e-4 / 3, 0.1, 0.3, 16 / 4000, 1 / 3, 1.0])
def test_each_record_is_in_a_batch_with_probability_at_most_q_decided_on_integers(q):
    """A float32 draw against q rounds q to float32 and then up to the draw's 2^-24 grid (above q by up to 6e-4 of
    it at q = 1e-4): the accountant's q would understate the rate.  The draw is an integer below 2^53 against
    floor(q 2^53), so the exact rate is that threshold over 2^53: at most q and within 2^-53 of it."""
    sampler = PoissonSampler(1000, q, torch.Generator().manual_seed(3))
    assert sampler.inclusion_probability <= q
    assert q - sampler.inclusion_probability < 2.0 ** -53
    batch = sampler.sample()
    draws = torch.randint(0, 2 ** 53, (1000,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    assert torch.equal(batch, torch.nonzero(draws < sampler.threshold).flatten())
    assert int(draws.max()) >= 2 ** 52 and int(draws.min()) < 2 ** 46  # the draws span the 53 bits
    if q == 1.0:
        assert batch.numel() == 1000


def test_empty_batch_still_adds_noise():
    model = torch.nn.Linear(10, 10)

    def loss(call, x):
        return call(x[None]).sum()

    engine = DPSGD(model, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=2.0,
                   noise_generator=torch.Generator().manual_seed(0))
    stats = engine.step_gradients((torch.zeros(0, 10),))
    assert stats.batch_size == 0
    assert all(p.grad.abs().sum() > 0 for p in model.parameters())


def test_one_example_moves_the_clipped_sum_by_at_most_c_with_many_noise_draws():
    """Noise multiplicity K > 1 is averaged inside the loss, so removing one record changes the sum by <= C."""
    unet, _ = tiny_models(7)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    loss = diffusion_example_loss(diffusion)
    x0, t, y, noise, _ = student_batch(n=5, k=8, seed=8)
    clip = 0.05
    engine = DPSGD(unet, loss, noise_multiplier=0.0, clip_norm=clip, expected_batch_size=1.0,
                   noise_generator=torch.Generator().manual_seed(0))
    full, _ = engine.clip_and_accumulate((x0, t, y, noise))
    without, _ = engine.clip_and_accumulate(tuple(v[1:] for v in (x0, t, y, noise)))
    change = math.sqrt(sum(float((full[n] - without[n]).pow(2).sum()) for n in full))
    assert change <= clip * (1 + 1e-5)
    assert change > 0.5 * clip  # this record's gradient was large enough to be clipped


def test_bf16_autocast_keeps_every_clipped_example_within_the_bound():
    """bf16 runs the forward and backward; per-example gradients are formed, clipped and summed in fp32."""
    unet, disc = tiny_models(4)
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    loss = student_example_loss(diffusion, disc, {"p": frozen_params(disc)}, {"teacher_weight": 1, "data_weight": 1, "adv_weight": 1})
    inputs = student_batch(n=6, seed=5)
    engine = DPSGD(unet, loss, noise_multiplier=0.0, clip_norm=1.0, expected_batch_size=6,
                   noise_generator=torch.Generator().manual_seed(0), precision="bf16")
    low = engine.per_example_gradients(inputs)
    exact = per_example_gradients(unet, loss, inputs)
    assert all(g.dtype == torch.float32 for g in low.values())
    norm = lambda grads, i: math.sqrt(sum(float(g[i].pow(2).sum()) for g in grads.values()))  # noqa: E731
    for i in range(6):
        assert norm(low, i) == pytest.approx(norm(exact, i), rel=0.1)  # bf16 rounding, not a different gradient
        for clip in (1e-3, 0.1):
            clipped, _ = clip_per_example({n: g[i:i + 1] for n, g in low.items()}, clip)
            assert math.sqrt(sum(float(v.pow(2).sum()) for v in clipped.values())) <= clip * (1 + 1e-5)
    stats = engine.step_gradients(inputs)  # the whole step under bf16: sum of 6 clipped examples
    assert stats.batch_size == 6
    total = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in unet.parameters()))
    assert total <= 1.0 * (1 + 1e-5)  # (sum of six norms <= 6 C) / expected batch 6
    with pytest.raises(DpsadError, match="bf16"):
        DPSGD(unet, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=6,
              noise_generator=torch.Generator(), per_example="vmap", precision="bf16")


def _tf32_rounded(x: torch.Tensor) -> torch.Tensor:
    """x with its mantissa rounded to TF32's 10 bits (values), passing gradients straight through."""
    scale = torch.exp2(torch.floor(torch.log2(x.detach().abs().clamp_min(1e-30))) - 10)
    return x + (torch.round(x.detach() / scale) * scale - x.detach())


@pytest.fixture
def emulated_tf32_convolutions(monkeypatch):
    """Convolutions round their operands as cuDNN does under TF32, whenever torch's flag allows it (its
    default): the vmap engine's weight gradients then come from rounded activations, the hooks' from exact
    ones, as on an A100, H100 or H200."""
    convolve = torch.nn.Conv2d._conv_forward

    def rounded(self, x, weight, bias):
        if _tf32_allowed(1):
            x, weight = _tf32_rounded(x), _tf32_rounded(weight)
        return convolve(self, x, weight, bias)

    monkeypatch.setattr(torch.nn.Conv2d, "_conv_forward", rounded)
    assert _tf32_allowed(1)  # PyTorch's default


def _tf32_allowed(which: int) -> bool:
    """Whether torch's switch ``which`` (0: cuBLAS matmuls, 1: cuDNN convolutions) allows TF32 now."""
    from dpsad.privacy.mechanism.dpsgd import tf32_switches

    owner, name, _ = tf32_switches()[which]
    return getattr(owner, name) in ("tf32", True)  # "none" and "ieee" (or False): full fp32


def test_the_hooks_self_check_holds_under_tf32_rounding_and_still_catches_a_wrong_grouping(emulated_tf32_convolutions):
    """The check used to compare the two engines at the precision training uses: under TF32 they differ by more
    than its tolerance, so paper-size DP training stopped at its first step on every Ampere or Hopper GPU.  It
    now compares them in full fp32 (TF32 off for the check alone), and a batched loss that mixes examples is
    still refused under the same rounding."""
    torch.manual_seed(0)
    unet = xavier_init(UNet(UNetConfig(image_size=16, in_channels=1, num_classes=3, base_channels=32,
                                       channel_mult=(1, 2, 2), groups=8, time_embed_dim=128)))
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=50))
    loss = diffusion_example_loss(diffusion)
    g = torch.Generator().manual_seed(3)
    batch = (torch.rand(3, 1, 16, 16, generator=g) * 2 - 1, torch.randint(0, 50, (3, 1), generator=g),
             torch.randint(0, 4, (3,), generator=g), torch.randn(3, 1, 1, 16, 16, generator=g))
    # what the check compared before: the engines at training precision
    hooks = hook_per_example_gradients(unet, loss.batched, batch)
    reference = per_example_gradients(unet, loss, batch)
    worst = max(float(((hooks[n] - r).flatten(1).norm(dim=1) / r.flatten(1).norm(dim=1).clamp_min(1e-12)).max())
                for n, r in reference.items())
    print(f"largest relative difference of the engines under emulated TF32: {worst:.2e} (tolerance 1e-3)")
    assert worst > 1e-3
    engine = DPSGD(unet, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=3,
                   noise_generator=torch.Generator().manual_seed(0), per_example="hooks")
    engine.step_gradients(batch)  # passes: the check runs in full fp32
    assert _tf32_allowed(1)  # and training keeps PyTorch's setting

    def shuffled(model, x0, t, y, noise):
        roll = lambda v: torch.roll(v, 1, dims=0)  # noqa: E731
        return loss.batched(model, roll(x0), roll(t), roll(y), roll(noise))

    mixed = DPSGD(unet, with_batched_form(lambda call, *ex: loss(call, *ex), shuffled), noise_multiplier=1.0,
                  clip_norm=1.0, expected_batch_size=3, noise_generator=torch.Generator().manual_seed(0),
                  per_example="hooks")
    with pytest.raises(PrivacyError, match="differ from vmap"):
        mixed.step_gradients(batch)


def test_no_example_contributes_more_than_c_to_the_clipped_sum(emulated_tf32_convolutions):
    """The norm and the summed contribution come from the same fp32 tensors (TF32 off for both) and the clip
    target keeps a margin for fp32's rounding of the norm: one example moves the sum by at most C."""
    from dpsad.privacy.mechanism.dpsgd import CLIP_MARGIN, full_precision, tf32_switches

    owner, name, _ = tf32_switches()[0]
    saved = getattr(owner, name)
    setattr(owner, name, "tf32" if name == "fp32_precision" else True)  # what a training script may set
    try:
        with full_precision():
            assert not _tf32_allowed(0) and not _tf32_allowed(1)
        assert _tf32_allowed(0) and _tf32_allowed(1)  # restored
        g = torch.Generator().manual_seed(5)
        grads = {"w": torch.randn(64, 1000, 100, generator=g) * torch.logspace(-3, 3, 64)[:, None, None],
                 "b": torch.randn(64, 10, generator=g)}
        for clip in (1e-3, 0.1, 1.0, 100.0):
            largest = 0.0
            for i in range(64):
                alone, _ = clip_per_example({n: v[i:i + 1] for n, v in grads.items()}, clip)
                largest = max(largest, math.sqrt(sum(float(v.double().pow(2).sum()) for v in alone.values())))
            print(f"C = {clip:g}: largest contribution {largest / clip:.8f} C")
            assert largest <= clip and largest >= clip * (1 - 2 * CLIP_MARGIN)
    finally:
        setattr(owner, name, saved)


@pytest.mark.parametrize("engine", ["opacus", "im2col", "grouped"])
def test_every_convolution_engine_gives_the_vmap_gradients(monkeypatch, engine):
    """On a GPU, convolutions take Opacus's grad sampler (one row per example) or im2col (several rows); on the
    CPU a grouped convolution's weight gradient (the 16x16 and 8x8 maps, strided too; im2col below).  All give
    the per-example gradients of the vmap reference, with one and with two rows an example."""
    from dpsad.privacy.mechanism import per_example

    assert per_example.conv_engine(torch.device("cuda"), 1) == "opacus"
    assert per_example.conv_engine(torch.device("cuda"), 4) == "im2col"
    assert per_example.conv_engine(torch.device("cpu"), 1) == "grouped"
    monkeypatch.setattr(per_example, "conv_engine", lambda device, rows: engine)
    torch.manual_seed(1)
    unet = xavier_init(UNet(UNetConfig(image_size=16, in_channels=1, num_classes=3, base_channels=8,
                                       channel_mult=(1, 2), groups=4, time_embed_dim=16)))
    loss = diffusion_example_loss(GaussianDiffusion(DiffusionConfig(timesteps=50)))
    g = torch.Generator().manual_seed(2)
    k = 1 if engine == "opacus" else 2
    batch = (torch.rand(4, 1, 16, 16, generator=g) * 2 - 1, torch.randint(0, 50, (4, k), generator=g),
             torch.randint(0, 4, (4,), generator=g), torch.randn(4, k, 1, 16, 16, generator=g))
    hooks = hook_per_example_gradients(unet, loss.batched, batch)
    reference = per_example_gradients(unet, loss, batch)
    for name, ref in reference.items():
        assert torch.allclose(hooks[name], ref, atol=1e-5, rtol=1e-4), name
