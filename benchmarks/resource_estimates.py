"""Print what each stage of a config asks a scheduler for (dpsad.config.resources): GPUs, threads, memory, runtime.

These are the estimates the rules use, not measurements; the module docstring of src/dpsad/config/resources.py says
how they were made.  Records default to the source's known size; give --records for your own data.
    PYTHONPATH=src .venv/bin/python benchmarks/resource_estimates.py --config config/examples/imagefolder.yaml \
        --records 50000 --public-records 10000
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import yaml
from snakemake.utils import update_config

from dpsad.config import validate_config
from dpsad.config.resources import DataShape, RuleTable, configured_shape, job_request

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a config file, merged over config/config.yaml like --configfile")
    parser.add_argument("--records", type=int, help="images in the dataset's own source (private + test)")
    parser.add_argument("--public-records", type=int, help="images in a separate public source")
    args = parser.parse_args()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    table = RuleTable.read(ROOT / "workflow" / "resources.yaml")
    update_config(config, yaml.safe_load(Path(args.config).read_text()))
    config = validate_config(copy.deepcopy(config))
    for dataset in config["datasets"]:
        shape = configured_shape(config["data"][dataset])
        if args.records:
            test = round(args.records * (config["data"][dataset].get("test_fraction") or 0.0))
            shape = DataShape(args.records - test, shape.public, test, shape.image_size, shape.channels)
        if args.public_records:
            shape = DataShape(shape.private, args.public_records, shape.test, shape.image_size, shape.channels)
        print(f"{dataset}: {shape.private} private, {shape.public} public, {shape.test} test images of "
              f"{shape.image_size}x{shape.image_size}x{shape.channels}; gpus_per_job {config['gpus_per_job']}")
        print(f"{'stage':<28}{'GPUs':>5}{'threads':>8}{'memory GB':>10}{'runtime h':>10}")
        jobs = [("prepare_data", {})]
        jobs += [("train_teacher", {"teacher": t}) for t in sorted({r["teacher"] for r in config["runs"] if r.get("teacher")})]
        method_rule = {"dpsad": "distill_student", "dpdm": "train_dpdm", "dpgan": "train_dpgan"}
        jobs += [(method_rule[r["method"]], {"run": r["name"]}) for r in config["runs"] if r["method"] in method_rule]
        jobs += [("sample", {"run": config["runs"][0]["name"]}), ("train_evaluator", {}), ("evaluate", {}), ("evaluate_real", {})]
        for rule, wildcards in jobs:
            request = job_request(config, rule, {"dataset": dataset, **wildcards}, shape, table)
            gpus = config["gpus_per_job"] if table.uses_gpu(rule) else 0
            label = f"{rule} {next(iter(wildcards.values()), '')}".strip()
            print(f"{label:<28}{gpus:>5}{table.rule_threads(rule):>8}{request.mem_mb / 1000:>10.0f}{request.runtime / 60:>10.1f}")


if __name__ == "__main__":
    main()
