"""Plan every DP training of a finished workspace again and print it beside what its ledgers recorded.

    PYTHONPATH=src:benchmarks python benchmarks/plan_check.py WORKSPACE [OVERLAY.yaml ...]

For each run of a DP method, the DP plan (:func:`dpsad.privacy.mechanism.plan.plan_dp_training`) is made from the
configuration (``config/config.yaml`` with the overlays merged over it, as ``--configfile`` does), n (the workspace's ``data.h5``) and the upstream entries of the run's own ledger, and its
sample rate, steps and noise multipliers are printed beside the ledger's.  A change to the plan's code that
should not change what it plans (a refactor) must print ``same`` on every row; exit status 1 otherwise.
Reads only ledgers and the data file's attributes, never a record.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

import yaml

from dpsad.config import deep_merge, method_settings, validate_config
from dpsad.config.resources import read_prepared_shape
from dpsad.privacy.books.ledger import read_ledgers
from dpsad.privacy.mechanism.plan import plan_dp_training

# method -> (ledger file, its own updates: ledger stage -> plan update, the plan's method and stage)
OWN = {
    "dpsad": ("student.ledger.json", {"distill_student": "student", "discriminator": "discriminator"}, "student"),
    "dpdm": ("dpdm.ledger.json", {"train_dpdm": "teacher"}, "dpdm"),
    "dpgan": ("dpgan.ledger.json", {"train_dpgan_critic": "critic"}, "dpgan"),
}


def check_run(workspace: Path, dataset: str, config: dict, run: dict) -> list[tuple]:
    """Rows (run, update, recorded (q, steps, sigma), planned (q, steps, sigma)) of one run's ledger."""
    ledger_name, own_updates, method = OWN[run["method"]]
    ledger = workspace / "results" / dataset / run["name"] / ledger_name
    if not ledger.is_file():
        print(f"{run['name']:<22} not trained in this workspace ({ledger} is missing)")
        return []
    entries = read_ledgers([ledger])
    own = [e for e in entries if e["stage"] in own_updates and e["mechanism"] == "sgm"]
    upstream = [e for e in entries if e not in own and e["stage"] not in own_updates]
    settings = method_settings(config, run)
    shape = read_prepared_shape(workspace / "results" / dataset / "data.h5")
    if run["method"] == "dpsad":
        split = settings.budget_split
        shares = {"student": split.student}
        if settings.discriminator.privacy == "dp":
            shares["discriminator"] = split.discriminator
    else:
        shares = {next(iter(own_updates.values())): 1.0}
    plan = plan_dp_training(settings, method, n=shape.private, upstream=upstream, shares=shares, stage=ledger_name,
                            log=logging.getLogger("plan_check"))
    return [(run["name"], e["stage"], (e["sample_rate"], e["steps"], e["noise_multiplier"]),
             (plan.sample_rate, plan.steps, plan.noise_multipliers[own_updates[e["stage"]]])) for e in own]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("overlays", type=Path, nargs="*", help="configuration files merged over config/config.yaml")
    args = parser.parse_args(argv)
    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())
    for overlay in args.overlays:
        config = deep_merge(config, yaml.safe_load(overlay.read_text()))
    config = validate_config(config)
    dataset = config["datasets"][0]
    different = 0
    print(f"{'run':<22} {'update':<16} {'recorded q, steps, sigma':<34} {'planned q, steps, sigma':<34} verdict")
    for run in config["runs"]:
        if run["method"] not in OWN:
            continue
        for name, update, recorded, planned in check_run(args.workspace, dataset, config, run):
            same = (math.isclose(recorded[0], planned[0], rel_tol=1e-12) and recorded[1] == planned[1]
                    and math.isclose(recorded[2], planned[2], rel_tol=1e-9))
            different += not same
            fmt = lambda v: f"{v[0]:.5g}, {v[1]}, {v[2]:.6g}"  # noqa: E731
            print(f"{name:<22} {update:<16} {fmt(recorded):<34} {fmt(planned):<34} {'same' if same else 'DIFFERENT'}")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
