"""DPDM and dp-GAN: the critic's per-example gradients, grouped clipping, warm start, ledgers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import every_other_poisson_draw_empty, tiny_config, tiny_data

import dpsad.gan.train as gan_train
from dpsad.config import dpdm_settings, dpgan_settings
from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.errors import DpsadError
from dpsad.gan.losses import critic_example_loss
from dpsad.gan.models import Critic, GANConfig
from dpsad.privacy.books.ledger import read_ledgers, verdict
from dpsad.privacy.mechanism.dpsgd import DPSGD, per_example_gradients
from dpsad.training.diffusion_training import load_diffusion_model
from dpsad.training.teacher import train_teacher

CPU = torch.device("cpu")


def critic_batch(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 1, 12, 12, generator=g) * 2 - 1, torch.rand(n, 1, 12, 12, generator=g) * 2 - 1,
            torch.rand(n, generator=g), torch.randint(0, 3, (n,), generator=g))


def tiny_critic(seed=0):
    torch.manual_seed(seed)
    return Critic(GANConfig(image_size=12, in_channels=1, num_classes=3, latent_dim=8, width=16))


def test_critic_per_example_gradients_with_gradient_penalty_match_a_loop():
    critic = tiny_critic()
    real, fake, rho, y = critic_batch()
    fast = per_example_gradients(critic, critic_example_loss(10.0), (real, fake, rho, y))
    for i in range(real.shape[0]):
        critic.zero_grad()
        x_hat = (rho[i] * real[i:i + 1] + (1 - rho[i]) * fake[i:i + 1]).requires_grad_(True)
        (g,) = torch.autograd.grad(critic(x_hat, y[i:i + 1]).sum(), x_hat, create_graph=True)
        loss = critic(fake[i:i + 1], y[i:i + 1]).sum() - critic(real[i:i + 1], y[i:i + 1]).sum() + 10.0 * (g.flatten().norm() - 1) ** 2
        loss.backward()
        for name, p in critic.named_parameters():
            assert torch.allclose(fast[name][i], p.grad, atol=1e-5), (name, i)


def test_the_penalty_term_reads_the_private_image():
    """Changing only the real image changes the penalty's gradient even when D(real) is held out."""
    critic = tiny_critic(1)
    real, fake, rho, y = critic_batch(2, seed=3)
    no_adv = critic_example_loss(10.0)

    def penalty_only(call, r, f, p, yy):
        return no_adv(call, r, f, p, yy) - (call(f[None], yy[None]).sum() - call(r[None], yy[None]).sum())

    a = per_example_gradients(critic, penalty_only, (real, fake, rho, y))
    b = per_example_gradients(critic, penalty_only, (real.flip(-1), fake, rho, y))
    assert any(not torch.allclose(a[n], b[n]) for n in a)


def test_group_clipping_bounds_compose_into_the_declared_sensitivity():
    critic = tiny_critic(2)
    group_of = gan_train.group_parameters(critic, "weight_bias")
    bounds = [0.3, 0.05]
    engine = DPSGD(critic, critic_example_loss(10.0), noise_multiplier=0.0, clip_norm=1.0, expected_batch_size=1.0,
                   noise_generator=torch.Generator().manual_seed(0), group_of=group_of, group_bounds=bounds)
    batch = critic_batch(6, seed=4)
    full, _ = engine.clip_and_accumulate(batch)
    declared = math.sqrt(sum(c * c for c in bounds))
    assert engine.total_sensitivity == pytest.approx(declared)
    for i in range(6):
        without, _ = engine.clip_and_accumulate(tuple(torch.cat([v[:i], v[i + 1:]]) for v in batch))
        for j, c in enumerate(bounds):
            change_j = math.sqrt(sum(float((full[n] - without[n]).pow(2).sum()) for n in full if group_of[n] == j))
            assert change_j <= c * (1 + 1e-5)
        change = math.sqrt(sum(float((full[n] - without[n]).pow(2).sum()) for n in full))
        assert change <= declared * (1 + 1e-5)


def test_grouped_noise_is_sigma_sqrt_k_times_each_bound():
    critic = tiny_critic(3)
    group_of = gan_train.group_parameters(critic, "weight_bias")
    engine = DPSGD(critic, critic_example_loss(10.0), noise_multiplier=2.0, clip_norm=1.0, expected_batch_size=1.0,
                   noise_generator=torch.Generator().manual_seed(0), group_of=group_of, group_bounds=[0.5, 0.1])
    zeros = {n: torch.zeros_like(p) for n, p in critic.named_parameters()}
    noisy = engine.add_noise(zeros)
    weights = torch.cat([noisy[n].flatten() for n in noisy if group_of[n] == 0])
    biases = torch.cat([noisy[n].flatten() for n in noisy if group_of[n] == 1])
    assert weights.std().item() == pytest.approx(2.0 * math.sqrt(2) * 0.5, rel=0.05)
    assert biases.std().item() == pytest.approx(2.0 * math.sqrt(2) * 0.1, rel=0.2)


def test_cluster_grouping_merges_similar_bounds():
    critic = tiny_critic()
    names = [n for n, _ in critic.named_parameters()]
    bounds = {n: (0.01 if n.endswith("bias") else 1.0) * (1 + 0.01 * i) for i, n in enumerate(names)}
    group_of = gan_train.group_parameters(critic, "cluster", bounds, k=2)
    assert len(set(group_of.values())) == 2
    assert len({group_of[n] for n in names if n.endswith("bias")}) == 1
    assert not {group_of[n] for n in names if n.endswith("bias")} & {group_of[n] for n in names if not n.endswith("bias")}


def run_dpgan(tmp_path, log, **overrides):
    config = tiny_config()
    config["dpgan"].update({"epochs": 1, "batch_size": 6, "warm_steps": 4, "n_critic": 2, "width": 16, "latent_dim": 8,
                            "checkpoint_every": 50, "public_batch_size": 4, **overrides})
    settings = dpgan_settings(config, {"target_epsilon": 10.0, "delta": 1e-5, "dpgan": {}})
    entries = gan_train.train_dpgan(data=tiny_data(), settings=settings, labels_mode=True,
                                    device=CPU, out_path=tmp_path / "g.pt", loss_csv=tmp_path / "g.csv",
                                    ledger_path=tmp_path / "g.json", upstream_ledgers=[], log=log)
    return entries


def test_warm_start_uses_only_the_public_split(tmp_path, log, monkeypatch):
    data = tiny_data()
    public_ids = {img.tobytes() for img in data.splits["public"].images}
    seen = []
    real_step = gan_train._wgan_gp_step

    def spy(generator, critic, real, y, *args, **kwargs):
        seen.extend(((real + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())
        return real_step(generator, critic, real, y, *args, **kwargs)

    monkeypatch.setattr(gan_train, "_wgan_gp_step", spy)
    run_dpgan(tmp_path, log)
    assert len(seen) == 4 * 6
    assert all(np.ascontiguousarray(img).tobytes() in public_ids for img in seen)


@pytest.mark.parametrize("n_critic", [1, 2])
def test_the_generator_steps_once_every_n_critic_critic_steps_in_both_phases(tmp_path, log, monkeypatch, n_critic):
    """The demo's dp-GAN takes a generator step after every critic step (n_critic 1): free post-processing of the
    DP critic.  Warm start: 4 public critic steps; private phase: the ledger's steps."""
    calls = []
    real_step = gan_train._generator_step

    def spy(*args, **kwargs):
        calls.append(1)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(gan_train, "_generator_step", spy)
    (entry,) = run_dpgan(tmp_path, log, n_critic=n_critic, epochs=2)
    assert entry["steps"] >= 4
    assert len(calls) == 4 // n_critic + entry["steps"] // n_critic


def test_an_empty_poisson_batch_is_a_noise_only_critic_step(tmp_path, log, monkeypatch):
    """Poisson sampling draws an empty batch now and then (secret seeds: on no fixed step); the step adds noise
    only, and training goes on.  Here every other draw is empty."""
    draws = every_other_poisson_draw_empty(monkeypatch)
    (entry,) = run_dpgan(tmp_path, log)
    assert len(draws) == entry["steps"] and entry["steps"] >= 2
    assert torch.isfinite(next(iter(torch.load(tmp_path / "g.pt", weights_only=False)["generator"].values()))).all()


def test_a_dpgan_shorter_than_its_logging_interval_writes_its_loss_file_and_plot(tmp_path, log):
    """Its loss rows come every 10 critic steps: with fewer, the CSV (a rule output) was missing, and the job failed
    after its DP training had finished, so that the next run trained again with new noise."""
    from dpsad.plots import loss_curve

    (entry,) = run_dpgan(tmp_path, log)
    assert entry["steps"] < 10
    assert (tmp_path / "g.csv").read_text().splitlines() == ["step"]
    loss_curve(tmp_path / "g.csv", tmp_path / "g.png", "dp-GAN")
    assert (tmp_path / "g.png").stat().st_size > 0


def test_dpgan_ledger_gives_a_guarantee_within_target(tmp_path, log):
    entries = run_dpgan(tmp_path, log, grouping="cluster", groups=2)
    (entry,) = entries
    assert entry["mechanism"] == "sgm" and entry["private"] and entry["steps"] == 4 and "2 clipping group(s)" in entry["notes"]
    result = verdict(read_ledgers([tmp_path / "g.json"]), delta=1e-5, accountant="pld", target_epsilon=10.0, num_private_records=24)
    assert result["dp_guarantee"] is True and result["epsilon"] <= 10.0


def test_dpdm_with_noise_multiplicity_and_public_clipping(tmp_path, log):
    config = tiny_config()
    config["dpdm"].update(epochs=1, batch_size=6, timesteps_per_example=4, noise_distribution="lognormal", loss_weighting="edm",
                          lr_schedule="logarithmic", checkpoint_every=50, model=config["teachers"]["public"]["model"])
    config["dpdm"]["dp"].update(clip_from_public=True, clip_update_every=2)
    settings = dpdm_settings(config, {"target_epsilon": 5.0, "delta": 1e-5, "dpdm": {}})
    assert settings["split"] == "private" and settings["privacy"] == "dp"
    entry = train_teacher(data=tiny_data(), settings=settings, diffusion_settings=config["diffusion"], labels_mode=True,
                          device=CPU, out_path=tmp_path / "d.pt", loss_csv=tmp_path / "d.csv", ledger_path=tmp_path / "d.json",
                          stage_name="train_dpdm", log=log)
    assert entry["mechanism"] == "sgm" and entry["steps"] == 4 and "public" in entry["notes"] and entry["clip_norm"] > 0
    result = verdict([entry], delta=1e-5, accountant="pld", target_epsilon=5.0, num_private_records=24)
    assert result["dp_guarantee"] is True and result["epsilon"] <= 5.0


def test_every_process_clips_to_the_first_processes_public_clip_norm(tmp_path, log):
    """DPDM's clip norm from public data is computed by every process, and two devices may round it apart: each
    takes the first process's (the broadcast), so that none clips to more than the one the noise is scaled to."""
    import dataclasses

    from dpsad.runtime.distributed import DistributedContext

    @dataclasses.dataclass(frozen=True)
    class FirstSays(DistributedContext):  # one process; the broadcast answers what the first process computed
        def broadcast_float(self, value):
            return 0.0321

    config = tiny_config()
    config["dpdm"].update(epochs=1, batch_size=6, checkpoint_every=50, model=config["teachers"]["public"]["model"])
    config["dpdm"]["dp"].update(clip_from_public=True, clip_update_every=2)
    settings = dpdm_settings(config, {"target_epsilon": 5.0, "delta": 1e-5, "dpdm": {}})
    entry = train_teacher(data=tiny_data(), settings=settings, diffusion_settings=config["diffusion"], labels_mode=True,
                          device=CPU, out_path=tmp_path / "d.pt", loss_csv=tmp_path / "d.csv", ledger_path=tmp_path / "d.json",
                          stage_name="train_dpdm", log=log, distributed=FirstSays())
    assert entry["clip_norm"] == 0.0321


def test_lognormal_timesteps_follow_the_edm_distribution():
    diffusion = GaussianDiffusion(DiffusionConfig())
    t = diffusion.sample_timesteps((20000,), torch.Generator().manual_seed(0), "lognormal")
    log_sigma = diffusion.sigmas()[t].log()
    inside = (log_sigma > diffusion.sigmas()[0].log() + 0.5) & (log_sigma < diffusion.sigmas()[-1].log() - 0.5)
    assert log_sigma[inside].median().item() == pytest.approx(-1.2, abs=0.1)
    # a distribution of middle noise levels, as the demo's student and DPDM use
    t = diffusion.sample_timesteps((20000,), torch.Generator().manual_seed(0), "lognormal", 1.0, 0.5)
    log_sigma = diffusion.sigmas()[t].log()
    assert log_sigma.median().item() == pytest.approx(1.0, abs=0.05)
    assert log_sigma.std().item() == pytest.approx(0.5, abs=0.05)
    assert diffusion.loss_weight(torch.tensor([0, 499]), "edm")[1] > diffusion.loss_weight(torch.tensor([0, 499]), "edm")[0]


def test_warm_started_dpdm_starts_from_the_teacher_weights(tmp_path, log):
    from test_training import teacher

    config = tiny_config()
    config["teachers"]["public"]["seed"] = 7  # initial weights unlike DPDM's own (seed 0)
    teacher_path, _ = teacher(tmp_path, log, "public", config)
    start = load_diffusion_model(teacher_path, CPU, use_ema=True)[0].state_dict()

    def dpdm(init, lr, tag, data=None):
        config["dpdm"].update(epochs=1, batch_size=6, lr=lr, warmup_steps=0, checkpoint_every=50,
                              model=config["teachers"]["public"]["model"])
        settings = dpdm_settings(config, {"target_epsilon": 5.0, "delta": 1e-5, "dpdm": {"init": init}})
        assert settings["init"] == init
        train_teacher(data=data or tiny_data(), settings=settings, diffusion_settings=config["diffusion"], labels_mode=True,
                      device=CPU, out_path=tmp_path / f"{tag}.pt", loss_csv=tmp_path / f"{tag}.csv",
                      ledger_path=tmp_path / f"{tag}.json", stage_name="train_dpdm", log=log,
                      init_path=teacher_path if init == "public" else None)
        return load_diffusion_model(tmp_path / f"{tag}.pt", CPU, use_ema=True)[0].state_dict()

    def distance(state):
        return max(float((state[k] - start[k]).abs().max()) for k in start)

    # A vanishing learning rate keeps the warm-started model at the teacher; from scratch it is far from it.
    assert distance(dpdm("public", 1e-12, "warm")) < 1e-6
    assert distance(dpdm("scratch", 1e-12, "cold")) > 1e-2
    # Other labels (4 classes, k-means clusters say): the label embedding is rebuilt.  Its null row is the
    # teacher's; the four new rows are fresh draws, apart from the null row and from each other at the scale
    # of the teacher's own label rows (rows left at the null row made a k-means teacher unconditional).
    relabelled = dpdm("public", 1e-12, "relabelled", data=tiny_data(classes=4))
    rows = relabelled["class_embed.weight"]
    assert rows.shape[0] == 5
    assert torch.allclose(rows[-1], start["class_embed.weight"][-1], atol=1e-6)
    teacher_spread = float((start["class_embed.weight"][:-1] - start["class_embed.weight"][-1]).norm(dim=1).mean())
    assert float(torch.cdist(rows[:-1], rows[-1:]).min()) > 0.5 * teacher_spread
    assert float(torch.pdist(rows[:-1]).min()) > 0.5 * teacher_spread
    assert max(float((relabelled[k] - start[k]).abs().max()) for k in start if not k.startswith("class_embed")) < 1e-6
    with pytest.raises(DpsadError, match="expected 1 channels at 16 px"):
        dpdm("public", 1e-3, "other_size", data=tiny_data(size=16))
