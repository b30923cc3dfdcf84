"""Low-rank adapters: the per-example engines on the trainable set, nothing frozen moves, the merged checkpoint,
and the rule that sizes them from the DP plan."""

from __future__ import annotations

import logging

import pytest
import torch
from test_clipped_sum import assert_close_sums, unet_and_batch

from dpsad.models.lora import Adapted, add_adapters, adapter_parameters, merged_state_dict
from dpsad.models.unet import UNet
from dpsad.privacy.mechanism.clipped_sum import clipped_sum
from dpsad.privacy.mechanism.dpsgd import CLIP_MARGIN, DPSGD, clip_per_example, full_precision, per_example_gradients
from dpsad.privacy.mechanism.per_example import hook_per_example_gradients
from dpsad.training.adapters import MAX_NOISE_TO_SIGNAL, choose_trainable, noise_to_signal, planned_rank

LOG = logging.getLogger("test")


def adapted_unet(rank=2, n=3, k=1):
    unet, loss, batch = unet_and_batch("demo", n=n, k=k)
    add_adapters(unet, rank)
    for module in unet.modules():  # adapters away from their zero start, so every product is exercised
        if isinstance(module, Adapted):
            torch.nn.init.normal_(module.up.weight, std=0.05)
    return unet, loss, batch


def test_only_the_adapters_are_trainable_and_the_network_starts_as_its_base():
    unet, loss, batch = unet_and_batch("demo", n=2, k=1)
    before = loss.batched(unet, *batch).detach()
    trained = add_adapters(unet, 4)
    assert trained == adapter_parameters(UNet(unet.config), 4) == sum(p.numel() for p in unet.parameters() if p.requires_grad)
    names = [name for name, p in unet.named_parameters() if p.requires_grad]
    assert names and all(".down." in name or ".up." in name for name in names)
    assert torch.equal(loss.batched(unet, *batch).detach(), before)


@pytest.mark.parametrize("k", [1, 4])
def test_the_hooks_and_ghost_engines_give_vmaps_gradients_on_the_adapters(k):
    unet, loss, batch = adapted_unet(k=k)
    with full_precision():
        reference = per_example_gradients(unet, loss, batch)
        hooks = hook_per_example_gradients(unet, loss.batched, batch)
        assert set(hooks) == set(reference) == {n for n, p in unet.named_parameters() if p.requires_grad}
        for name, value in reference.items():
            assert torch.allclose(hooks[name], value, atol=1e-6, rtol=1e-4), name
        for clip in (1e-3, 1e3):
            ours, norms = clipped_sum(unet, loss.batched, batch, bounds=[clip], margin=CLIP_MARGIN)
            expected, expected_norms = clip_per_example(reference, clip)
            assert torch.allclose(norms[:, 0], expected_norms, rtol=1e-5)
            assert_close_sums(ours, expected)


@pytest.mark.parametrize("engine", ["ghost", "hooks", "vmap"])
def test_a_dp_step_moves_the_adapters_and_nothing_frozen(engine):
    unet, loss, batch = adapted_unet()
    frozen = {name: p.detach().clone() for name, p in unet.named_parameters() if not p.requires_grad}
    trained = {name: p.detach().clone() for name, p in unet.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD([p for p in unet.parameters() if p.requires_grad], lr=0.1)
    dpsgd = DPSGD(unet, loss, noise_multiplier=1.0, clip_norm=0.1, expected_batch_size=3,
                  noise_generator=torch.Generator().manual_seed(0), per_example=engine)
    dpsgd.step_gradients(batch)
    assert all(p.grad is None for p in unet.parameters() if not p.requires_grad)
    optimizer.step()
    assert all(torch.equal(p, frozen[name]) for name, p in unet.named_parameters() if name in frozen)
    assert all(not torch.equal(p, trained[name]) for name, p in unet.named_parameters() if name in trained)


def test_the_merged_state_loads_into_the_plain_network_and_computes_the_same():
    unet, loss, batch = adapted_unet()
    plain = UNet(unet.config)
    plain.load_state_dict(merged_state_dict(unet))  # strict: the plain network's own names, every one
    with torch.no_grad():
        assert torch.allclose(loss.batched(plain, *batch), loss.batched(unet, *batch), atol=1e-5)


def test_the_rule_trains_every_weight_while_the_noise_allows_and_smaller_adapters_as_it_grows():
    unet = UNet(unet_and_batch("demo", n=1, k=1)[0].config)
    full = sum(p.numel() for p in unet.parameters())
    quiet = MAX_NOISE_TO_SIGNAL * 250 / full ** 0.5  # the largest sigma at which every weight is trained (B = 250)
    assert planned_rank(unet, 0.99 * quiet, 250) is None
    ranks = [planned_rank(unet, factor * quiet, 250) for factor in (1.5, 3, 6, 100)]
    assert all(rank is not None for rank in ranks) and ranks == sorted(ranks, reverse=True) and ranks[-1] == 1
    for factor, rank in zip((1.5, 3, 6), ranks):
        assert noise_to_signal(factor * quiet, adapter_parameters(unet, rank), 250) <= MAX_NOISE_TO_SIGNAL
        assert noise_to_signal(factor * quiet, adapter_parameters(unet, 2 * rank), 250) > MAX_NOISE_TO_SIGNAL
    assert choose_trainable(unet, "auto", sigma=0.5 * quiet, batch_size=250, log=LOG) == 0
    assert choose_trainable(unet, "lora", 3, sigma=0.5 * quiet, batch_size=250, log=LOG) == 3


def test_a_lora_student_and_a_lora_dpdm_write_plain_checkpoints_that_sample(tmp_path, log):
    from helpers import tiny_config, tiny_data
    from test_training import student, teacher

    from dpsad.config import dpdm_settings
    from dpsad.privacy.books.ledger import read_ledgers, verdict
    from dpsad.sampling.draw import load_any_generator
    from dpsad.training.diffusion_training import load_diffusion_model
    from dpsad.training.checkpoints import load_checkpoint
    from dpsad.training.teacher import train_teacher

    files = teacher(tmp_path, log)
    start = load_checkpoint(files[0])["ema"]["model"]
    config = tiny_config(trainable="lora", lora_rank=2, init_from_teacher=True, lr=1e-2)
    for section in ("student", "dpdm"):  # the checkpoints are the point, not the accountant: RDP's calibration is quick
        config[section]["dp"]["accountant"] = "rdp"
    out, entries = student(tmp_path, log, files, config["student"])
    config["dpdm"].update(epochs=1, batch_size=6, lr=1e-2, warmup_steps=0, checkpoint_every=50, trainable="lora",
                          lora_rank=2, model=config["teachers"]["public"]["model"])
    settings = dpdm_settings(config, {"target_epsilon": 5.0, "delta": 1e-5, "dpdm": {"init": "public"}})
    train_teacher(data=tiny_data(), settings=settings, diffusion_settings=config["diffusion"], labels_mode=True,
                  device=torch.device("cpu"), out_path=tmp_path / "d.pt", loss_csv=tmp_path / "d.csv",
                  ledger_path=tmp_path / "d.json", stage_name="train_dpdm", log=log, init_path=str(files[0]),
                  upstream_ledgers=[str(files[1])])
    for path, ledger, target in ((out, tmp_path / "s.ledger.json", 10.0), (tmp_path / "d.pt", tmp_path / "d.json", 5.0)):
        state = load_checkpoint(path)
        assert set(state["model"]) == set(start) and set(state["ema"]["model"]) == set(start)  # plain UNet names
        moved = {name for name in start if not torch.equal(start[name], state["model"][name])}
        assert moved and all(name.endswith("weight") for name in moved)  # adapters move weights, never a bias or norm
        assert not any(name.startswith("norm") or ".norm" in name for name in moved)
        load_diffusion_model(path, torch.device("cpu"))
        draw, _ = load_any_generator(path, torch.device("cpu"))
        images, _ = draw({"sampler": "ddim", "steps": 2, "eta": 1.0, "guidance": 0.0, "n_per_class": 1,
                          "n_samples": None, "batch_size": 4, "seed": 0}).collect()
        assert images.shape[0] == 3
        result = verdict(read_ledgers([ledger]), delta=1e-5, accountant="rdp", target_epsilon=target,
                         num_private_records=24)
        assert result["dp_guarantee"] is True


@pytest.mark.parametrize("where", ["student", "dpdm", "teacher"])
def test_adapters_without_a_warm_start_are_refused(where):
    from helpers import MODEL

    from dpsad.config import validate_config
    from dpsad.errors import DpsadError

    config = {"datasets": ["toy"], "data": {"toy": {"source": "mnist5k"}}, "teachers": {"public": {"model": MODEL}},
              "runs": [{"name": "r", "method": "dpsad", "target_epsilon": 10.0}]}
    if where == "student":
        config["student"] = {"trainable": "lora", "init_from_teacher": False}
    elif where == "dpdm":
        config["runs"] = [{"name": "r", "method": "dpdm", "target_epsilon": 10.0, "dpdm": {"init": "scratch",
                                                                                            "trainable": "auto"}}]
    else:
        config["teachers"]["dp"] = {"split": "private", "privacy": "dp", "target_epsilon": 5.0, "trainable": "lora"}
    with pytest.raises(DpsadError, match="with init(_from_teacher)?: (scratch|false), expected init"):
        validate_config(config)
