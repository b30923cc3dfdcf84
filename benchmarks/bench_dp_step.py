"""One DP-SAD student step (per-example gradients, clipping, noise) against the same step without DP.

For each batch size, trained parameter set and per-example method, one child
process builds the demo's student UNet and discriminator, times the DP step
(the real student loss: teacher outputs given, discriminator frozen inside
the loss) and the plain step (one batched forward and backward of the same
losses, same trained parameters), and reports its own peak memory, so the
figures of one setting do not leak into another's:

    .venv/bin/python benchmarks/bench_dp_step.py                 # batch 64 and 512, all and conditioning
    .venv/bin/python benchmarks/bench_dp_step.py --batches 64 --methods hooks
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
from _common import peak_rss_mb, timed

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.models.discriminator import Discriminator, DiscriminatorConfig
from dpsad.models.unet import UNet, UNetConfig
from dpsad.privacy.mechanism.dpsgd import DPSGD
from dpsad.training.student import frozen_params, select_trainable, student_example_loss


def measure(batch: int, trainable: str, method: str, microbatch: int, k: int, threads: int, repeats: int) -> dict:
    """Median step times and the peak memory of the DP step for one setting (run in a child process)."""
    torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    student = UNet(UNetConfig(image_size=28, in_channels=1, num_classes=10, base_channels=16,
                              channel_mult=(1, 2, 4))).to(device)
    trained = select_trainable(student, trainable)
    disc = Discriminator(DiscriminatorConfig()).to(device)
    diffusion = GaussianDiffusion(DiffusionConfig())
    weights = {"teacher_weight": 1.0, "data_weight": 1.0, "adv_weight": 0.1}
    loss = student_example_loss(diffusion, disc, {"p": frozen_params(disc)}, weights)
    inputs = (torch.rand(batch, 1, 28, 28, device=device) * 2 - 1, torch.randint(0, 500, (batch, k), device=device),
              torch.randint(0, 11, (batch,), device=device), torch.randn(batch, k, 1, 28, 28, device=device),
              torch.randn(batch, k, 1, 28, 28, device=device))
    opt = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=1e-4)
    engine = DPSGD(student, loss, noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=batch,
                   noise_generator=torch.Generator(device=device).manual_seed(0), microbatch_size=microbatch,
                   per_example=method)

    def dp_step():
        opt.zero_grad()
        engine.step_gradients(inputs)
        opt.step()

    def plain_step():
        opt.zero_grad()
        loss.batched(student, *inputs).mean().backward()
        opt.step()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    dp_step()
    dp_peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else peak_rss_mb()
    plain_step()
    # alternate the two so that drifts of the machine's speed hit both alike
    dp_times, plain_times = [], []
    for _ in range(repeats):
        dp_times.append(timed(dp_step, repeats=1, warmup=0))
        plain_times.append(timed(plain_step, repeats=1, warmup=0))
    dp, plain = sorted(dp_times)[repeats // 2], sorted(plain_times)[repeats // 2]
    return {"device": device.type, "trained": trained, "dp_s": dp, "plain_s": plain, "dp_peak_mib": dp_peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--trainable", nargs="+", default=["all", "conditioning"], choices=["all", "conditioning"])
    parser.add_argument("--methods", nargs="+", default=["vmap", "hooks"], choices=["vmap", "hooks"])
    parser.add_argument("--microbatch", type=int, default=64)
    parser.add_argument("--timesteps-per-example", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        setting = json.loads(args.child)
        print(json.dumps(measure(**setting)))
        return
    print("| batch | trained | per-example | non-private step s | DP step s | DP / non-private | DP peak memory MiB |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batches:
        for trainable in args.trainable:
            for method in args.methods:
                setting = {"batch": batch, "trainable": trainable, "method": method, "microbatch": args.microbatch,
                           "k": args.timesteps_per_example, "threads": args.threads, "repeats": args.repeats}
                child = subprocess.run([sys.executable, __file__, "--child", json.dumps(setting)], check=True,
                                       capture_output=True, text=True)
                r = json.loads(child.stdout.strip().splitlines()[-1])
                print(f"| {batch} | {trainable} ({r['trained']:,}) | {method} | {r['plain_s']:.3f} | {r['dp_s']:.3f} | "
                      f"{r['dp_s'] / r['plain_s']:.2f}x | {r['dp_peak_mib']:.0f} ({r['device']}) |", flush=True)


if __name__ == "__main__":
    main()
