"""config/gpu/mnist28.yaml: the bundled data at a GPU's compute plans, sizes and (in a tiny form) runs here."""

from __future__ import annotations

import pytest

import json
import re

import h5py
import yaml

from dpsad.config import validate_config
from dpsad.privacy.mechanism.plan import size_dp_training
from dpsad.privacy.stated import rounded_up

from workflow_helpers import ROOT, planned_jobs, snakemake, workdir

GPU = "config/gpu/mnist28.yaml"
DATASET = "mnist5k_28"


def gpu_config() -> dict:
    return validate_config(yaml.safe_load((ROOT / GPU).read_text()))


@pytest.mark.e2e
def test_the_gpu_configuration_plans_every_job_on_a_gpu_of_the_cluster(tmp_path):
    result = snakemake(workdir(tmp_path), "all", "-n", "--profile", "slurm", "--configfile", GPU)
    assert planned_jobs(result) == {"prepare_data": 1, "train_teacher": 2, "distill_student": 2, "train_dpdm": 1,
                                    "account": 5, "sample": 5, "train_evaluator": 1, "evaluate": 5, "evaluate_real": 1,
                                    "compare": 1, "release_budget": 1, "release_run": 2, "privacy_spent": 1, "all": 1}
    # each training and sampling job (13 of them) asks the scheduler for one GPU
    assert len(re.findall(r"resources: .*\bgpu=1\b", result.stdout)) == 2 + 2 + 1 + 5


@pytest.mark.e2e  # the whole configuration's plans at four times the demo's compute
def test_the_gpu_configuration_keeps_the_demos_dp_recipe_at_four_times_its_compute():
    gpu, demo = gpu_config(), validate_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    assert gpu["dp_sizing"]["example_gradients"] == 4 * demo["dp_sizing"]["example_gradients"]
    for section in ("student", "dpdm"):
        different = {key for key in demo[section] if gpu[section].get(key) != demo[section][key]}
        assert different <= {"checkpoint_every", "model", "dp"}, (section, different)  # model: the teacher's, copied
        # the dp section differs in execution settings only: hooks, faster on a GPU, and chunks of 256 examples,
        # whose gradients of the 6.2M-parameter UNet take half the memory of the default's 512
        execution = {"per_example": "auto", "microbatch_size": demo[section]["dp"]["microbatch_size"]}
        assert {**gpu[section]["dp"], **execution} == demo[section]["dp"], section
        assert gpu[section]["dp"]["per_example"] == "hooks" and gpu[section]["dp"]["microbatch_size"] == 256, section
    assert gpu["model"]["base_channels"] == 64 and gpu["model"]["attention_resolutions"] == [7]
    assert "image_size" not in yaml.safe_load((ROOT / GPU).read_text())["data"][DATASET]  # MNIST-5k's native 28x28
    # n = 4,000 private records: the sizes the README states
    rule = {key: gpu["dp_sizing"][key] for key in ("example_gradients", "min_steps", "target_snr", "max_sample_rate",
                                                   "min_batch_size")}
    at10, at1 = (size_dp_training(4000, epsilon, 1e-5, **rule) for epsilon in (10.0, 1.0))
    assert (at10.batch_size, at10.steps) == (256, 250) and (at1.batch_size, at1.steps) == (1000, 64)


@pytest.mark.e2e
def test_the_tiny_form_of_the_gpu_configuration_releases_28x28_images_with_a_true_guarantee(tmp_path):
    """Its released DP-SAD run end to end on the CPU: the paper UNet's shape (an attention block) at 28x28."""
    cwd = workdir(tmp_path)
    target = f"release/{DATASET}/dpsad_eps10"
    snakemake(cwd, target, "--cores", "2", "--configfile", GPU, "tests/data/tiny_gpu.yaml")
    folder = cwd / target
    with h5py.File(folder / "synthetic.h5") as handle:
        assert handle["images"].shape == (20, 28, 28, 1)
        assert bool(handle.attrs["dp_guarantee"]) and 0 < float(handle.attrs["epsilon"]) <= 10.0
    stated = json.loads((folder / "privacy.json").read_text())
    assert stated["dp_guarantee"] is True and stated["num_private_records"] == 4000
    assert "(" + rounded_up(stated["epsilon"], 6) in (folder / "README.md").read_text()
