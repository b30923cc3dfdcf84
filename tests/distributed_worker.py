"""A training process for tests/test_distributed.py, started by torch's launcher as a job's would be:
python -m torch.distributed.run --standalone --nproc-per-node=N tests/distributed_worker.py WHAT[,WHAT...] OUT_DIR"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.runtime.distributed import SINGLE, end_worker, worker_context
from dpsad.models.unet import UNet, UNetConfig
from dpsad.privacy.mechanism.dpsgd import DPSGD, dp_generators
from dpsad.training.diffusion_training import diffusion_example_loss

SIGMA, CLIP, EXPECTED_BATCH = 1.3, 0.5, 6.0


def build():
    torch.manual_seed(0)
    model = UNet(UNetConfig(image_size=12, in_channels=1, num_classes=3, base_channels=8, channel_mult=(1, 2), groups=4,
                            time_embed_dim=16))
    g = torch.Generator().manual_seed(1)
    batch = (torch.rand(7, 1, 12, 12, generator=g) * 2 - 1, torch.randint(0, 40, (7, 2), generator=g),
             torch.randint(0, 4, (7,), generator=g), torch.randn(7, 2, 1, 12, 12, generator=g))
    return model, batch


def dp_update(context, out_dir: Path, zero_loss: bool = False):
    """One DP step on a fixed batch with a fixed noise seed; with ``zero_loss`` every gradient is 0 and the step is
    the noise alone."""
    model, batch = build()
    diffusion = GaussianDiffusion(DiffusionConfig(timesteps=40))
    loss = diffusion_example_loss(diffusion)
    example_loss = (lambda *args: loss(*args) * 0.0) if zero_loss else loss
    engine = DPSGD(model, example_loss, noise_multiplier=SIGMA, clip_norm=CLIP, expected_batch_size=EXPECTED_BATCH,
                   noise_generator=torch.Generator().manual_seed(42), microbatch_size=3, distributed=context)
    engine.step_gradients(batch)
    if context.is_main:
        name = "noise" if zero_loss else "update"
        torch.save({n: p.grad for n, p in model.named_parameters()}, out_dir / f"{name}_{context.world_size}.pt")


def update(context, out_dir: Path):
    """The DP step on the fixed batch, then the same step with zero gradients (its noise alone)."""
    dp_update(context, out_dir)
    dp_update(context, out_dir, zero_loss=True)


def teacher(context, out_dir: Path):
    from dpsad.config import teacher_settings
    from dpsad.training.teacher import train_teacher
    from helpers import tiny_config, tiny_data

    config = tiny_config()
    train_teacher(data=tiny_data(), settings=teacher_settings(config, "dp"), diffusion_settings=config["diffusion"],
                  labels_mode=True, device=torch.device("cpu"), out_path=out_dir / f"t{context.world_size}.pt",
                  loss_csv=out_dir / f"t{context.world_size}.csv", ledger_path=out_dir / f"t{context.world_size}.json",
                  stage_name="train_teacher[dp]", log=logging.getLogger("dpsad-test"), distributed=context)


def secret(context, out_dir: Path):
    randomness = dp_generators(None, context)
    torch.save({"sampling": torch.rand(8, generator=randomness.sampling), "noise": torch.randn(8, generator=randomness.noise),
                "kind": randomness.seed_kind}, out_dir / f"rank{context.rank}.pt")


def run(what: str, out_dir: Path, context) -> None:
    """Each of the comma-separated checks in ``what``, in this one set of processes (the tests share a launch)."""
    torch.set_num_threads(1)
    checks = {"update": update, "teacher": teacher, "secret": secret}
    for name in what.split(","):
        if name not in checks:
            raise SystemExit(f"unknown test {name!r}, expected one of {sorted(checks)}")
        checks[name](context, out_dir)


if __name__ == "__main__":
    what, out = sys.argv[1], Path(sys.argv[2])
    if len(sys.argv) > 3 and sys.argv[3] == "single":
        run(what, out, SINGLE)
    else:
        context = worker_context()
        try:
            run(what, out, context)
            context.barrier()  # as dpsad.runtime.devices.launch_training ends a launched process
        finally:
            end_worker()
