"""Private Evolution's released population as a teacher's training set: does a diffusion model fitted to it, drawn
again, give a classifier more than the population itself?

For each Private Evolution run given, the public teacher is fine-tuned on the run's released images and labels
(``synthetic.h5``) with the non-private reference teacher's recipe (``teachers.private``: steps, learning rate, EMA;
fixed before any figure was read, never tuned), then drawn with the run's ``sample`` settings; the CNN of the
evaluation is trained on the draw and scored on the **test split** (curator-only, like the comparison table).  The
fine-tuning reads only the release and the public teacher: post-processing, the run's ``privacy.json`` holds for it
too, and nothing here spends privacy.  The population itself is scored by the same call (it must give the run's own
``metrics.json`` figure: a check that the two are comparable)::

    PYTHONPATH=src .venv/bin/python experiments/pe_population_teacher.py mnist2k pe_dpdm_eps1 pe_dpdm_eps1_r2 \\
        --config config/checks/mnist2k.yaml

One JSON line a run on standard output: the population's CNN accuracy and gap closed, the fine-tuned teacher's, and
the seconds of each part.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path

import torch

from dpsad.config import sample_settings, teacher_settings, validate_config
from dpsad.data.datafile import PreparedData, Split, read_datafile
from dpsad.evaluation.utility import downstream_accuracy
from dpsad.files.artifacts import read_json
from dpsad.sampling import load_any_generator
from dpsad.synthetic import load_synthetic
from dpsad.training.teacher import train_teacher

from _tables import add_built_runs_arguments, layered_config


def cnn(images, labels, test, num_classes: int, evaluate: dict) -> float:
    """The evaluation's CNN accuracy (mean of its trainings) of a classifier trained on ``images``, on ``test``."""
    acc, _ = downstream_accuracy(images, labels, test.images, test.labels, num_classes,
                                 epochs=evaluate["classifier_epochs"], lr=evaluate["lr"],
                                 batch=evaluate["classifier_batch_size"], holdout=evaluate["holdout_fraction"],
                                 seed=evaluate["seed"], cnn_trainings=evaluate["cnn_trainings"])
    return float(acc["cnn"])


def population_teacher(release, data: PreparedData, config: dict, public_teacher: Path, out: Path, log) -> None:
    """The public teacher fine-tuned on the release's images and labels by ``teachers.private``'s recipe."""
    recipe = dataclasses.replace(teacher_settings(config, "private"), split="public")
    population = PreparedData(splits={"public": Split(release.images, release.labels)}, class_names=data.class_names,
                              labelled=True, image_size=data.image_size, channels=data.channels, attrs=dict(data.attrs))
    train_teacher(data=population, settings=recipe, diffusion_settings=config["diffusion"], labels_mode=True,
                  device=torch.device("cpu"), out_path=out, loss_csv=out.with_suffix(".csv"),
                  ledger_path=out.with_suffix(".ledger.json"), stage_name="population_teacher", log=log,
                  init_path=str(public_teacher))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_built_runs_arguments(parser, "Private Evolution runs under results/<dataset>/")
    args = parser.parse_args()

    torch.set_num_threads(2)
    logging.basicConfig(level=logging.WARNING)
    log = logging.getLogger("pe_population_teacher")
    results = Path(args.workspace) / "results" / args.dataset
    config = validate_config(layered_config(parser, args.config))
    runs = {run["name"]: run for run in config["runs"]}
    data = read_datafile(results / "data.h5", splits=("test",))
    test, evaluate = data.splits["test"], config["evaluate"]
    floor, ceiling = (read_json(results / row / "metrics.json", "metrics")["accuracy"]["cnn"]
                      for row in ("public", "nonprivate"))
    for name in args.runs:
        if runs.get(name, {}).get("method") != "pe":
            parser.error(f"run '{name}': not a Private Evolution run of this configuration, expected method pe")
        release = load_synthetic(results / name / "synthetic.h5")
        start = time.time()
        own = cnn(release.images, release.labels, test, data.num_classes, evaluate)
        stated = read_json(results / name / "metrics.json", "metrics")["accuracy"]["cnn"]
        with tempfile.TemporaryDirectory(prefix="population-teacher-") as folder:
            checkpoint = Path(folder) / "teacher.pt"
            trained = time.time()
            population_teacher(release, data, config, results / "teacher" / "public.pt", checkpoint, log)
            drawn = time.time()
            draw, _ = load_any_generator(checkpoint, torch.device("cpu"), use_ema=True)
            images, labels = draw(sample_settings(config, runs[name])).collect()
            scored = time.time()
            fitted = cnn(images, labels, test, data.num_classes, evaluate)
        gap = lambda acc: round((acc - floor) / (ceiling - floor), 3)  # noqa: E731
        print(json.dumps({"dataset": args.dataset, "run": name, "population_cnn": round(own, 4),
                          "population_cnn_in_metrics": round(stated, 4), "population_gap": gap(own),
                          "teacher_cnn": round(fitted, 4), "teacher_gap": gap(fitted),
                          "fine_tune_s": round(drawn - trained, 1), "sample_s": round(scored - drawn, 1),
                          "score_s": round(trained - start + time.time() - scored, 1)}), flush=True)


if __name__ == "__main__":
    main()
