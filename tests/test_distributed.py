"""Data-parallel DP-SGD on CPU with gloo: two processes give the single-process update."""

from __future__ import annotations

import torch

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.distributed import SINGLE, launch
from dpsad.models.unet import UNet, UNetConfig
from dpsad.privacy.mechanism import DPSGD
from dpsad.training.diffusion_model import diffusion_example_loss


def build():
    torch.manual_seed(0)
    model = UNet(UNetConfig(image_size=12, in_channels=1, num_classes=3, base_channels=8, channel_mult=(1, 2), groups=4,
                            time_embed_dim=16))
    g = torch.Generator().manual_seed(1)
    batch = (torch.rand(7, 1, 12, 12, generator=g) * 2 - 1, torch.randint(0, 40, (7, 2), generator=g),
             torch.randint(0, 4, (7,), generator=g), torch.randn(7, 2, 1, 12, 12, generator=g))
    return model, batch


def dp_update(context, out_path):
    torch.set_num_threads(1)
    model, batch = build()
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=40))
    engine = DPSGD(model, diffusion_example_loss(diffusion), noise_multiplier=1.3, clip_norm=0.5, expected_batch_size=6.0,
                   noise_generator=torch.Generator().manual_seed(42), microbatch_size=3, distributed=context)
    engine.step_gradients(batch)
    if context.is_main:
        torch.save({n: p.grad for n, p in model.named_parameters()}, out_path)


def test_two_process_dp_update_equals_the_single_process_update(tmp_path):
    dp_update(SINGLE, tmp_path / "single.pt")
    launch(dp_update, 2, "gloo", tmp_path / "double.pt")
    single, double = torch.load(tmp_path / "single.pt"), torch.load(tmp_path / "double.pt")
    for name in single:
        assert torch.allclose(single[name], double[name], atol=1e-6), name


def test_two_process_teacher_training_runs_and_writes_once(tmp_path, log):
    """The whole DP teacher loop under two processes: one checkpoint, one ledger, the planned step count."""
    from dpsad.training.teacher import train_teacher
    from helpers import tiny_config, tiny_data

    config = tiny_config()
    settings = config["teachers"]["dp"]

    def train(context):
        torch.set_num_threads(1)
        train_teacher(data=tiny_data(), settings=settings, diffusion_settings=config["diffusion"], labels_mode=True,
                      device=torch.device("cpu"), out_path=tmp_path / "t.pt", loss_csv=tmp_path / "t.csv",
                      ledger_path=tmp_path / "t.json", stage_name="train_teacher[dp]", log=log, distributed=context)

    launch(train, 2, "gloo")
    state = torch.load(tmp_path / "t.pt", weights_only=False)
    assert state["step"] == 4 and state["ledger"][0]["mechanism"] == "sgm"


def draw_secret(context, out_dir):
    from dpsad.privacy.mechanism import dp_generators

    randomness = dp_generators(None, context)
    torch.save({"sampling": torch.rand(8, generator=randomness.sampling), "noise": torch.randn(8, generator=randomness.noise),
                "kind": randomness.seed_kind}, out_dir / f"rank{context.rank}.pt")


def test_secret_seeds_are_shared_by_all_processes_and_differ_between_runs(tmp_path):
    """Every process must draw the same batches and noise; a new run must draw new ones."""
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        launch(draw_secret, 2, "gloo", tmp_path / run)
    a0, a1, b0 = (torch.load(tmp_path / f, weights_only=False) for f in ("a/rank0.pt", "a/rank1.pt", "b/rank0.pt"))
    assert a0["kind"] == "secret"
    assert torch.equal(a0["sampling"], a1["sampling"]) and torch.equal(a0["noise"], a1["noise"])
    assert not torch.equal(a0["sampling"], b0["sampling"]) and not torch.equal(a0["noise"], b0["noise"])
