"""What the dp_sizing rule gives: expected batch, steps and noise multiplier for several n and budgets.

No data is read: the rule needs only n, the budget and the compute.  The compute and the rule's settings are
the configuration's (``dp_sizing``); the DP-SAD student's noise is shared with its discriminator, so its own
multiplier is the joint one over sqrt(budget_split.student / sum).

    .venv/bin/python benchmarks/sizing_rule.py                      # the demo's dp_sizing
    .venv/bin/python benchmarks/sizing_rule.py --config config/examples/imagefolder.yaml --n 10000 100000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from dpsad.config import deep_merge, validate_config
from dpsad.privacy.mechanism.plan import size_dp_training

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="a configuration merged over config/config.yaml")
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 2000, 4000, 20000, 60000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if args.config:
        config = deep_merge(config, yaml.safe_load(Path(args.config).read_text()))
    rule = validate_config(config)["dp_sizing"]
    shared = dict(target_snr=rule["target_snr"], max_sample_rate=rule["max_sample_rate"],
                  min_batch_size=rule["min_batch_size"])
    print(f"dp_sizing: {rule}")
    print(f"{'training':<14}{'n':>8}{'epsilon':>9}{'batch':>7}{'steps':>7}{'epochs':>8}{'sigma':>8}{'B/sigma':>9}")
    for label, compute, min_steps in (("student, DPDM", rule["example_gradients"], rule["min_steps"]),
                                      ("dp-GAN critic", rule["critic_example_gradients"], rule["critic_min_steps"])):
        for n in args.n:
            for epsilon in args.epsilons:
                size = size_dp_training(n, epsilon, args.delta, example_gradients=compute, min_steps=min_steps, **shared)
                print(f"{label:<14}{n:>8}{epsilon:>9g}{size.batch_size:>7}{size.steps:>7}"
                      f"{size.batch_size * size.steps / n:>8.2f}{size.noise_multiplier:>8.3f}"
                      f"{size.batch_size / size.noise_multiplier:>9.0f}")


if __name__ == "__main__":
    main()
