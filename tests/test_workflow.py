"""The Snakemake workflow: DAG, an end-to-end tiny run, rerun behaviour, profiles."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from dpsad.privacy.books.curator_record import REPLACED_HOME, TEST_HOME_ENV
from dpsad.synthetic import load_synthetic

from workflow_helpers import ROOT, SNAKEMAKE, planned_jobs, run_snakemake, skip_without_make_tests_venv, snakemake, workdir  # noqa: F401 (re-exported)


def dry_run_in_place(tiny_run: Path, *args: str) -> subprocess.CompletedProcess:
    """A dry run in the shared tiny run itself, without Snakemake's locks: other workers read and copy the tiny
    run meanwhile, and a copy taken while a dry run held its locks would start locked."""
    return snakemake(tiny_run, "-n", "--nolock", *args)


@pytest.mark.e2e
def test_dry_run_of_the_whole_default_dag(tmp_path):
    jobs = planned_jobs(snakemake(workdir(tmp_path), "-n", "--cores", "2", "all"))
    assert jobs == {"prepare_data": 1, "train_moco": 1, "extract_features": 1, "kmeans_labels": 1, "cluster_report": 1, "train_teacher": 3,
                    "distill_student": 3, "train_dpdm": 2, "train_dpgan": 1, "train_pe": 1, "account": 8, "sample": 8,
                    "train_evaluator": 1, "evaluate": 8, "evaluate_real": 1, "compare": 1, "release_budget": 1, "release_run": 2,
                    "privacy_spent": 1, "all": 1}


@pytest.mark.e2e
def test_sweep_target_trains_each_method_at_each_epsilon_and_is_not_in_all(tmp_path):
    cwd = workdir(tmp_path)
    jobs = planned_jobs(snakemake(cwd, "-n", "sweep"))
    # dpsad and dpdm trained at epsilon 2 and 5; dpsad_eps1, dpsad_eps10 and dpdm_eps10 of `runs` are the points at
    # 1 and 10 as they stand; the public and nonprivate rows are the floor and the ceiling
    assert jobs["distill_student"] == 4 and jobs["train_dpdm"] == 3 and jobs["sweep_plot"] == 1
    assert jobs["evaluate"] == 9 and "train_dpgan" not in jobs and "compare" not in jobs
    assert "sweep_plot" not in planned_jobs(snakemake(cwd, "-n", "all"))


@pytest.mark.e2e
def test_release_target_builds_the_release_folders_and_nothing_else(tmp_path):
    """Only the runs data.mnist5k.release lists (public, dpsad_eps10), after their budget."""
    jobs = planned_jobs(snakemake(workdir(tmp_path), "-n", "release"))
    assert jobs["release_run"] == 2 and jobs["sample"] == 2 and jobs["release_budget"] == 1 and jobs["release"] == 1
    assert jobs["distill_student"] == 1 and jobs["train_teacher"] == 1
    assert not {"evaluate", "train_evaluator", "compare", "all", "train_dpdm", "train_dpgan"} & set(jobs)


@pytest.mark.e2e
def test_labels_are_chosen_per_run_and_moco_is_in_the_dag_only_when_a_run_uses_kmeans(tmp_path):
    cwd = workdir(tmp_path)
    true_only = tmp_path / "true_only.yaml"
    true_only.write_text("runs:\n  - {name: public, method: public, teacher: public}\n"
                         "  - {name: dpsad_eps10, method: dpsad, teacher: public, target_epsilon: 10.0}\n")
    jobs = planned_jobs(snakemake(cwd, "-n", "--cores", "2", "--configfile", "config/config.yaml", str(true_only), "all"))
    assert not {"train_moco", "extract_features", "kmeans_labels"} & set(jobs) and jobs["train_teacher"] == 1
    # Every run on k-means labels (top-level switch): one MoCo and one k-means job serve all of them.
    # (the public teacher is then on k-means labels too, so it cannot also be the feature teacher)
    all_kmeans = tmp_path / "all_kmeans.yaml"
    all_kmeans.write_text("labels: kmeans\nkmeans: {teacher: null}\n")
    kmeans = planned_jobs(snakemake(cwd, "-n", "--cores", "2", "--configfile", "config/config.yaml", str(all_kmeans), "all"))
    assert kmeans["train_moco"] == kmeans["extract_features"] == kmeans["kmeans_labels"] == 1
    # labels: none at the top: the default's k-means run keeps its teacher's labels, the others are unconditional.
    none = planned_jobs(snakemake(cwd, "-n", "--cores", "2", "--config", "labels=none", "all"))
    assert none["train_moco"] == 1 and none["train_teacher"] == 3


@pytest.mark.e2e
def test_a_run_whose_labels_differ_from_its_teachers_is_a_config_error(tmp_path):
    overlay = tmp_path / "bad.yaml"
    overlay.write_text("runs:\n  - {name: bad, method: dpsad, teacher: public, labels: kmeans, target_epsilon: 10.0}\n")
    result = snakemake(workdir(tmp_path), "-n", "--configfile", "config/config.yaml", str(overlay), "all", check=False)
    assert result.returncode != 0
    assert "labels = 'kmeans' but teacher 'public' is conditioned on labels True" in result.stdout + result.stderr


@pytest.mark.e2e
def test_slurm_profile_dry_run_from_the_repository_root(tmp_path):
    result = snakemake(workdir(tmp_path), "--profile", "slurm", "-n", "all")
    assert "Using profiles slurm and workflow specific profile profiles/default" in result.stdout + result.stderr
    assert planned_jobs(result)["train_teacher"] == 3


@pytest.mark.e2e
def test_bad_config_is_a_one_line_error(tmp_path):
    cwd = workdir(tmp_path)
    result = snakemake(cwd, "-n", "--cores", "1", "--config", "labels=maybe", check=False)
    assert result.returncode != 0
    assert "labels = 'maybe', expected one of" in result.stdout + result.stderr


def test_tiny_end_to_end_artifacts_and_verdicts(tiny_run):
    results = tiny_run / "results" / "mnist5k"
    with h5py.File(results / "data.h5") as handle:
        assert handle["train"]["images"].shape == (4000, 16, 16, 1)  # the default reduces MNIST-5k to 16x16
    runs = ("nonprivate", "dpsad_eps1", "dpsad_eps10", "dpdm_eps10", "dpgan_eps10")
    verdicts = {run: json.loads((results / run / "privacy.json").read_text()) for run in runs}
    assert verdicts["nonprivate"]["dp_guarantee"] is False
    assert any("without noise" in r for r in verdicts["nonprivate"]["reasons"])
    # The public row reads no private record: a true guarantee at epsilon 0, released like any DP run.
    public = json.loads((results / "public" / "privacy.json").read_text())
    assert public["dp_guarantee"] is True and public["epsilon"] == 0.0
    assert load_synthetic(results / "public" / "synthetic.h5").attrs["epsilon"] == 0.0
    # The warm-started DPDM composes the public teacher's ledger (no private entry) with its own DP-SGD.
    assert [c["stage"] for c in verdicts["dpdm_eps10"]["components"]][0].startswith("train_teacher")
    assert [c["private"] for c in verdicts["dpdm_eps10"]["components"]] == [False, True]
    for run, target in (("dpsad_eps1", 1.0), ("dpsad_eps10", 10.0), ("dpdm_eps10", 10.0), ("dpgan_eps10", 10.0)):
        assert verdicts[run]["dp_guarantee"] is True and 0 < verdicts[run]["epsilon"] <= target
        data = load_synthetic(results / run / "synthetic.h5")
        assert data.attrs["dp_guarantee"] is True and data.attrs["epsilon"] == pytest.approx(verdicts[run]["epsilon"])
        assert data.images.shape == (20, 16, 16, 1) and sorted(set(data.labels.tolist())) == list(range(10))
        assert (results / run / "grid.png").stat().st_size > 0 and (results / run / "epsilon.png").exists()
    table = (tiny_run / "results" / "comparison.md").read_text()
    for row in ("real", "public") + runs:
        assert f"| mnist5k | {row} |" in table
    rows = {row["run"]: row for row in csv.DictReader(open(tiny_run / "results" / "comparison.csv"))}
    for run in runs:
        gain = float(rows[run]["acc_cnn"]) - float(rows["public"]["acc_cnn"])
        assert float(rows[run]["cnn_gain_over_public"]) == pytest.approx(gain)
    assert rows["public"]["cnn_gain_over_public"] == "" and rows["real"]["cnn_gain_over_public"] == ""
    metrics = json.loads((results / "dpsad_eps10" / "metrics.json").read_text())
    assert set(metrics["accuracy"]) == {"logreg", "mlp", "cnn", "cnn_std", "cnn_runs"} and metrics["dp_guarantee"] is True
    assert "fid_inception" not in metrics  # a stage of its own, with weights only: the table says why not
    assert rows["dpsad_eps10"]["fid_inception"].startswith("not computed: no Inception-v3 weights configured")
    nonprivate = load_synthetic(results / "nonprivate" / "synthetic.h5")
    assert nonprivate.attrs["dp_guarantee"] is False
    # Runs on k-means labels beside runs on true labels: only the k-means run composes the MoCo and
    # k-means ledgers (both fitted on the public split: no private entry), and it keeps its guarantee.
    kmeans = json.loads((results / "dpsad_kmeans_eps10" / "privacy.json").read_text())
    stages = [c["stage"] for c in kmeans["components"]]
    assert "train_moco" in stages and "kmeans_labels" in stages and "train_teacher[public_kmeans]" in stages
    assert kmeans["dp_guarantee"] is True and 0 < kmeans["epsilon"] <= 10.0
    assert [c["private"] for c in kmeans["components"] if c["stage"] in ("train_moco", "kmeans_labels")] == [False, False]
    for run in runs + ("public",):
        other = json.loads((results / run / "privacy.json").read_text())
        assert not {"train_moco", "kmeans_labels"} & {c["stage"] for c in other["components"]}, run
    clusters = load_synthetic(results / "dpsad_kmeans_eps10" / "synthetic.h5")
    assert clusters.class_names == [f"cluster_{c}" for c in range(10)] and clusters.attrs["dp_guarantee"] is True
    scored = json.loads((results / "dpsad_kmeans_eps10" / "metrics.json").read_text())
    assert scored["label_source"] == "kmeans" and len(scored["cluster_to_class"]) == 10
    assert set(scored["cluster_to_class"]) <= set(range(10)) and metrics["label_source"] == "true"
    assert rows["dpsad_kmeans_eps10"]["labels"] == "kmeans" and rows["dpsad_eps10"]["labels"] == "true"
    report = (results / "cluster_report.md").read_text()
    assert "| moco |" in report and "| raw_pixels |" in report and "| teacher_encoder |" in report
    assert (tiny_run / "logs" / "mnist5k" / "prepare_data.log").exists()
    assert (tiny_run / "logs" / "mnist5k" / "train_teacher_public.bench.tsv").exists()


def test_the_epsilons_the_jobs_remembered_are_the_compositions_they_name(tiny_run):
    """The account, sample and release jobs share each stated epsilon through the workflow's memo
    (.snakemake/dpsad-epsilons): every remembered epsilon on the stated grid is its key's composition, and every
    DP run's stated epsilon is one of them."""
    from dpsad.privacy.accounting import PLD_DISCRETIZATION, SGMComponent, Accountant

    memos = [json.loads(p.read_text()) for p in (tiny_run / ".snakemake" / "dpsad-epsilons").rglob("*.json")]
    stated = [m for m in memos if float(m["key"]["pld_interval"]) == PLD_DISCRETIZATION and m["key"]["accountant"] == "pld"]
    for memo in stated:
        key = memo["key"]
        components = [SGMComponent(float(sigma), float(q), steps) for sigma, q, steps in key["components"]]
        assert Accountant("pld").epsilon(components, float(key["delta"])) == memo["epsilon"], key
    results = tiny_run / "results" / "mnist5k"
    for run in ("dpsad_eps1", "dpsad_eps10", "dpsad_kmeans_eps10", "dpdm_eps10", "dpgan_eps10"):
        privacy = json.loads((results / run / "privacy.json").read_text())
        assert privacy["epsilon"] in [m["epsilon"] for m in stated], run


def test_the_default_dp_runs_clip_below_the_records_gradient_norms(tiny_run):
    """The default clip bound binds for most records (so each adds a full C of signal against sigma*C), and the
    ledgers account for that bound."""
    results = tiny_run / "results" / "mnist5k"
    for run, csv_name in (("dpsad_eps10", "student_loss.csv"), ("dpdm_eps10", "dpdm_loss.csv")):
        rows = list(csv.DictReader(open(results / run / csv_name)))
        clipped = [float(row["clipped"]) for row in rows if int(row["batch"]) > 0]
        assert clipped and sum(clipped) / len(clipped) > 0.5, (run, clipped)
        private = [c for c in json.loads((results / run / "privacy.json").read_text())["components"] if c["private"]]
        assert private[0]["clip_norm"] == pytest.approx(0.1), run


def test_release_folders_hold_only_what_may_be_shared(tiny_run):
    import torch

    from dpsad.release_folder import RELEASED_DIFFUSION, RELEASED_GAN
    from dpsad.sampling import load_any_generator

    release = tiny_run / "release" / "mnist5k"

    def listing(folder):  # Snakemake marks directory outputs with an empty .snakemake_timestamp
        return sorted(p.name for p in folder.iterdir() if p.name != ".snakemake_timestamp")

    for run, kind in (("public", RELEASED_DIFFUSION), ("dpsad_eps10", RELEASED_DIFFUSION), ("dpdm_eps10", RELEASED_DIFFUSION),
                      ("dpgan_eps10", RELEASED_GAN), ("dpsad_kmeans_eps10", RELEASED_DIFFUSION)):
        folder = release / run
        assert listing(folder) == ["README.md", "generator.pt", "privacy.json", "samples.png", "synthetic.h5"]
        state = torch.load(folder / "generator.pt", weights_only=False)
        assert state["kind"] == kind
        assert set(state) <= {"kind", "model_config", "diffusion_config", "gan_config", "weights", "class_names", "conditional"}
        with h5py.File(folder / "synthetic.h5") as handle:
            assert set(handle) == {"images", "labels"}
            notes = handle.attrs["guarantee_notes"]
            if run == "public":
                assert notes.startswith("No private record was read")
            else:
                assert "secret seeds" in notes and "n is treated as public" in notes
        privacy = json.loads((folder / "privacy.json").read_text())
        assert privacy["dp_guarantee"] is True and "losses" not in json.dumps(privacy)
        draw, _ = load_any_generator(folder / "generator.pt", torch.device("cpu"))
        images, labels = draw({"sampler": "ddim", "steps": 2, "eta": 1.0, "guidance": 0.0, "n_per_class": 1,
                               "n_samples": None, "batch_size": 10, "seed": 0}).collect()
        assert images.shape == (10, 16, 16, 1) and labels.tolist() == list(range(10))
    # Private Evolution: its population is the synthetic set, released with its card and no generator.  It
    # evolves the run's own DPDM training (pe.dpdm_share 0.5): the release composes its DP-SGD and the votes.
    evolved = release / "pe_eps1"
    assert listing(evolved) == ["README.md", "privacy.json", "samples.png", "synthetic.h5"]
    card = (evolved / "README.md").read_text()
    assert "Private Evolution on a DP generator" in card and "no model is trained" not in card
    privacy = json.loads((evolved / "privacy.json").read_text())
    assert privacy["dp_guarantee"] is True and 0.95 < privacy["epsilon"] <= 1.0
    assert [c["mechanism"] for c in privacy["components"] if c["private"]] == ["sgm", "gaussian"]
    with h5py.File(evolved / "synthetic.h5") as handle:
        assert handle.attrs["method"] == "pe" and handle["images"].shape == (20, 16, 16, 1)
    # No guarantee: nothing derived from the private records is released, only the reasons.
    nonprivate = release / "nonprivate"
    assert listing(nonprivate) == ["NOT_RELEASED.txt", "README.md", "privacy.json"]
    assert "without noise" in (nonprivate / "NOT_RELEASED.txt").read_text()
    # protected(): every released run folder and file is write-protected once built; the dataset's budget is
    # rewritten as releases are added, and readable as the umask says
    for path in release.rglob("*"):
        if path.name != "BUDGET.json":
            assert path.stat().st_mode & 0o222 == 0, path
    umask = os.umask(0)
    os.umask(umask)
    assert (release / "BUDGET.json").stat().st_mode & 0o777 == 0o666 & ~umask
    # what a recipient reads is readable as the umask says (the group too), not owner-only as mkdtemp and
    # temporary files make them (protected() then gives a folder's files the folder's mode, minus write)
    for path in release.rglob("*"):
        assert path.stat().st_mode & 0o444 == 0o444 & ~umask, path
        if path.is_dir():
            assert path.stat().st_mode & 0o111 == 0o111 & ~umask, path


@pytest.mark.e2e
def test_execution_settings_rerun_nothing(tiny_run):
    """device, GPUs, processes, checkpoint intervals and how per-example gradients are formed (method,
    precision, microbatch size) do not change what a stage computes: no stage reruns (and no DP stage spends its budget
    again) when they change."""
    jobs = planned_jobs(dry_run_in_place(tiny_run, "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
                                  "--config", "device=cpu", "gpus_per_job=1", "distributed={'processes': 1}",
                                  "student={'checkpoint_every': 7, 'dp': {'per_example': 'vmap', 'precision': 'bf16', "
                                  "'microbatch_size': 8}}", "dpdm={'dp': {'per_example': 'vmap', 'microbatch_size': 8}}",
                                  "dpgan={'dp': {'microbatch_size': 8}}", "teachers={'public': {'checkpoint_every': 3}}",
                                  "all"))
    assert jobs == {}


@pytest.mark.e2e
def test_unchanged_config_reruns_nothing(tiny_run):
    assert planned_jobs(dry_run_in_place(tiny_run, "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml", "all")) == {}


@pytest.mark.e2e
def test_changed_data_parameter_reruns_prepare_data_and_dependants(tiny_run):
    jobs = planned_jobs(dry_run_in_place(tiny_run, "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
                                  "--config", "data={'mnist5k': {'seed': 3}}", "all"))
    assert jobs.get("prepare_data") == 1 and jobs.get("train_teacher") == 3 and jobs.get("train_moco") == 1


@pytest.mark.e2e
def test_changed_sampling_parameters_rerun_only_sampling(tiny_run):
    jobs = planned_jobs(dry_run_in_place(tiny_run, "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
                                  "--config", "sample={'steps': 5}", "all"))
    # every run, Private Evolution's too (its sample settings are a param like the others')
    assert set(jobs) == {"sample", "evaluate", "compare", "release_run", "all"} and jobs["sample"] == 8


@pytest.mark.e2e
def test_changed_target_epsilon_reruns_the_student_not_the_teacher(tiny_run, tmp_path):
    overlay = tmp_path / "eps.yaml"
    config = (ROOT / "tests" / "data" / "tiny.yaml").read_text()
    runs = ("runs:\n  - {name: nonprivate, method: nonprivate, teacher: private}\n"
            "  - {name: dpsad_eps1, method: dpsad, teacher: public, target_epsilon: 2.0}\n"
            "  - {name: dpsad_eps10, method: dpsad, teacher: public, target_epsilon: 10.0}\n"
            "  - {name: dpdm_eps10, method: dpdm, target_epsilon: 10.0}\n"
            "  - {name: dpgan_eps10, method: dpgan, target_epsilon: 10.0}\n")
    listed = "release: [public, nonprivate, dpsad_eps1, dpsad_eps10, dpsad_kmeans_eps10, dpdm_eps10, dpgan_eps10, pe_eps1]"
    assert listed in config
    overlay.write_text(config.replace(listed, "release: [nonprivate, dpsad_eps1, dpsad_eps10, dpdm_eps10, dpgan_eps10]") + runs)
    jobs = planned_jobs(dry_run_in_place(tiny_run, "--cores", "2", "--configfile", "config/config.yaml", str(overlay), "all"))
    # the budget is recomposed; the other runs' releases are not rebuilt (a new total changes no earlier release)
    assert jobs == {"distill_student": 1, "account": 1, "sample": 1, "evaluate": 1, "compare": 1, "release_budget": 1,
                    "release_run": 1, "privacy_spent": 1, "all": 1}


@pytest.mark.e2e
def test_fitting_kmeans_on_the_private_split_makes_only_the_kmeans_runs_false(tiny_run, tmp_path):
    import shutil

    cwd = tmp_path / "copy"
    shutil.copytree(tiny_run, cwd, symlinks=True)  # results and Snakemake's records: only changed stages rerun
    results = cwd / "results" / "mnist5k"
    true_run = results / "dpsad_eps10" / "privacy.json"
    before = true_run.stat().st_mtime_ns
    snakemake(cwd, "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
              "--config", "kmeans={'fit_split': 'private'}", "--",
              "results/mnist5k/dpsad_kmeans_eps10/privacy.json", "results/mnist5k/dpsad_eps10/privacy.json")
    kmeans = json.loads((results / "dpsad_kmeans_eps10" / "privacy.json").read_text())
    assert kmeans["dp_guarantee"] is False
    assert kmeans["reasons"] == ["kmeans_labels: trained on private records without noise"]
    assert true_run.stat().st_mtime_ns == before and json.loads(true_run.read_text())["dp_guarantee"] is True


@pytest.mark.e2e
def test_an_unlabelled_npz_runs_on_kmeans_labels_and_refuses_true_labels(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "unlabelled.npz", images=rng.integers(0, 256, (160, 12, 12, 1), dtype=np.uint8))
    overlay = tmp_path / "unlabelled.yaml"
    overlay.write_text(f"""
labels: none
datasets: [blank]
data:
  blank: {{source: npz, path: {tmp_path / 'unlabelled.npz'}, test_fraction: 0.2, public_fraction: 0.25,
          private_fraction: 0.75, seed: 0}}
kmeans: {{clusters: 3}}
sample: {{n_per_class: 2}}
runs:
  - {{name: dpsad_kmeans, method: dpsad, teacher: public_kmeans, target_epsilon: 10.0}}
""")
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    configs = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", str(overlay))
    snakemake(cwd, "--cores", "2", *configs, "--", "results/blank/dpsad_kmeans/synthetic.h5")
    synthetic = load_synthetic(cwd / "results" / "blank" / "dpsad_kmeans" / "synthetic.h5")
    assert synthetic.attrs["dp_guarantee"] is True and synthetic.class_names == ["cluster_0", "cluster_1", "cluster_2"]
    assert sorted(set(synthetic.labels.tolist())) == [0, 1, 2]
    failed = snakemake(cwd, "--cores", "2", *configs, "--config", "labels=true", "--", "results/blank/teacher/public.pt",
                       check=False)
    assert failed.returncode != 0
    assert "labels: true but the dataset has no labels, expected labels: kmeans or none" in failed.stdout + failed.stderr


@pytest.mark.e2e
def test_a_moved_source_reruns_nothing_and_a_replaced_file_reruns_prepare_data(tmp_path):
    import shutil

    import h5py
    import numpy as np

    def write_images(path, seed):
        rng = np.random.default_rng(seed)
        np.savez(path, images=rng.integers(0, 256, (120, 12, 12, 1), dtype=np.uint8), labels=np.arange(120) % 3)

    def configs(npz):
        overlay = tmp_path / "mine.yaml"
        overlay.write_text(f"datasets: [mine]\ndata:\n  mine: {{source: npz, path: {npz}, public_fraction: 0.25, "
                           "private_fraction: 0.75}\n")
        return ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", str(overlay))

    (tmp_path / "data").mkdir()
    write_images(tmp_path / "data" / "images.npz", 0)
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    target = ("--", "results/mine/data.h5")
    snakemake(cwd, "--cores", "1", *configs(tmp_path / "data" / "images.npz"), *target)
    with h5py.File(cwd / "results" / "mine" / "data.h5") as handle:
        recorded = handle.attrs["source_checksum"]
    assert len(recorded) == 64
    shutil.move(tmp_path / "data", tmp_path / "moved")  # the folder moves; the config follows it
    assert planned_jobs(snakemake(cwd, "-n", *configs(tmp_path / "moved" / "images.npz"), *target)) == {}
    write_images(tmp_path / "moved" / "images.npz", 1)  # same path, other content
    assert planned_jobs(snakemake(cwd, "-n", *configs(tmp_path / "moved" / "images.npz"), *target)) == {"prepare_data": 1}


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "celeba_hair", "celeba_gender", "celeba64"])
def test_paper_scale_configs_dry_run(tmp_path, name):
    jobs = planned_jobs(snakemake(workdir(tmp_path), "-n", "--profile", "slurm", "--configfile", f"config/paper/{name}.yaml", "all"))
    assert jobs["train_teacher"] == 2 and jobs["distill_student"] >= 2 and jobs["train_dpdm"] == 1 and jobs["compare"] == 1


@pytest.mark.e2e
def test_the_previous_long_default_stays_reachable(tmp_path):
    """config/long/mnist5k_55min.yaml: the former default (400 public MNIST digits, 2,000-step teacher) still plans."""
    jobs = planned_jobs(snakemake(workdir(tmp_path), "-n", "--configfile", "config/long/mnist5k_55min.yaml", "all"))
    assert jobs["train_teacher"] == 3 and jobs["distill_student"] == 3 and jobs["train_dpgan"] == 1 and jobs["compare"] == 1


@pytest.mark.e2e
def test_jobs_import_the_package_of_the_checkout_that_runs_them(tmp_path):
    """A second checkout sharing this .venv (whose editable install points here) still runs its own src/."""
    import shutil

    for name in ("Snakefile", "workflow", "config", "profiles", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    snakemake(tmp_path, "--cores", "1", "results/mnist5k/data.h5")
    log = (tmp_path / "logs" / "mnist5k" / "prepare_data.log").read_text()
    assert f"from {(tmp_path / 'src' / 'dpsad').resolve()}" in log


@pytest.mark.e2e
def test_audit_target_puts_a_lower_bound_beside_every_accounted_epsilon(tiny_run, tmp_path):
    import shutil

    cwd = tmp_path / "copy"
    shutil.copytree(tiny_run, cwd, symlinks=True)  # the tiny run is read by the other workers' tests too
    configs = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", "tests/data/audit.yaml")
    snakemake(cwd, "audit", "--cores", "2", *configs)
    results = cwd / "results" / "mnist5k"
    audits = {run: json.loads((results / run / "audit.json").read_text())
              for run in ("dpsad_eps10", "dpdm_eps10", "dpgan_eps10", "dpsad_paper_eps1")}
    for run in ("dpsad_eps10", "dpdm_eps10", "dpgan_eps10"):
        a = audits[run]
        assert a["dp_guarantee"] is True and 0 < a["accounted_epsilon"] <= 10.0
        assert 0 <= a["eps_lower_bound"] <= a["accounted_epsilon"]
        assert 0 <= a["mechanism_audit"]["eps_lower_bound"] <= a["accounted_epsilon"]
        assert len(a["scores"]) == len(a["included"]) == 200 and a["training_records"] == 4000 + sum(a["included"])
        # the audited mechanism is the released run's: same q and steps, however many canaries were drawn in
        released = json.loads((results / run / "privacy.json").read_text())["components"]
        assert ({(e["sample_rate"], e["steps"]) for e in a["components"] if e["mechanism"] == "sgm"}
                == {(e["sample_rate"], e["steps"]) for e in released if e["mechanism"] == "sgm" and e["private"]})
        assert a["eps_lower_bound"] <= a["largest_reachable_lower_bound"] < 5.0
    paper = audits["dpsad_paper_eps1"]
    assert paper["mode"] == "paper" and paper["dp_guarantee"] is False and 0 < paper["claimed_epsilon"] < 1.0
    assert 0.0 in paper["mechanism_audit"]["noise_multipliers"]  # its discriminator reads private batches without noise
    assert (results / "dpsad_eps10" / "audit_scores.png").stat().st_size > 0
    assert not list(results.glob("*/.audit-work-*"))
    # every audit run is a second use of the private records: the curator's spending log has it
    sources = {json.loads(line)["source"] for line in (results / "spent.jsonl").read_text().splitlines()}
    assert {f"audit_run: results/mnist5k/{run}/audit.json" for run in audits} <= sources
    table = (cwd / "results" / "audit.md").read_text()
    assert table.count("| mnist5k |") == 4 and "| dpsad_paper_eps1 | dpsad | paper | **no** |" in table
    # The audit is not part of `all`, and `all` does not rerun anything because of it ...
    assert "audit_run" not in planned_jobs(snakemake(cwd, "-n", "--cores", "2", "--configfile",
                                                     "config/config.yaml", "tests/data/tiny.yaml", "all"))
    # ... but a rebuilt comparison shows the bound of the audited runs.
    snakemake(cwd, "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml",
              "--forcerun", "compare", "all")
    lines = (cwd / "results" / "comparison.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| dataset |")).strip("| ").split(" | ")
    rows = {cells[1]: dict(zip(header, cells)) for cells in
            (line.strip("| ").split(" | ") for line in lines if line.startswith("| mnist5k |"))}
    bound = max(audits["dpsad_eps10"]["eps_lower_bound"], audits["dpsad_eps10"]["mechanism_audit"]["eps_lower_bound"])
    assert rows["dpsad_eps10"]["eps_lower_bound"] == f"{bound:.4g}"
    assert rows["dpsad_eps1"]["eps_lower_bound"] == "-"  # not audited


def readme_commands() -> list[tuple[str, list[str]]]:
    """(file:line, argv) of every make/snakemake command in the code blocks of the README and the docs pages,
    comments stripped."""
    import shlex

    commands = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        inside = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside = not inside
                continue
            argv = shlex.split(line, comments=True) if inside and not line.startswith(" ") else []
            if argv and (argv[0] in ("make", "snakemake") or argv[0].endswith("/snakemake")):
                commands.append((f"{page.relative_to(ROOT)}:{number}", argv))
    return commands


@pytest.mark.e2e
def test_every_command_of_the_readme_runs_as_a_dry_run(tmp_path):
    """Each `make demo ...` and `snakemake ...` line of the README's code blocks, as written plus -n, from a fresh
    directory (a user's own profile it names is an empty one here); `make test` would recurse and is left out."""
    commands = readme_commands()
    assert len(commands) >= 8, commands
    home = tmp_path / "home"
    (home / ".config" / "snakemake" / "mycluster").mkdir(parents=True)
    (home / ".config" / "snakemake" / "mycluster" / "config.yaml").write_text("jobs: 1\n")
    venv = Path(sys.executable).parents[1]
    skip_without_make_tests_venv(venv)
    failed, seen = [], set()
    for number, argv in commands:
        if argv[:2] == ["make", "test"] or tuple(argv) in seen:  # a command written on two pages runs once
            continue
        seen.add(tuple(argv))
        cwd = tmp_path / number.replace("/", "_").replace(":", "_")
        cwd.mkdir()
        workdir(cwd)
        for name in ("Makefile", "pyproject.toml"):
            (cwd / name).symlink_to(ROOT / name)
        env = {**os.environ, "HOME": str(home)}
        if argv[0] == "make":
            args = [a for a in argv[1:] if not a.startswith("ARGS=")]
            extra = next((a[len("ARGS="):] for a in argv if a.startswith("ARGS=")), "")
            command = ["make", "--no-print-directory", *args, f"VENV={venv}", f"ARGS={extra} -n"]
            result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
        else:
            result = run_snakemake(cwd, ["-n", *[str(home) + a[1:] if a.startswith("~") else a for a in argv[1:]]], env, 300)
        if result.returncode != 0:
            failed.append(f"{number}: {' '.join(argv)}\n{result.stderr[-800:]}")
        elif f"warning: {REPLACED_HOME}" not in result.stderr:  # the suite's test setting, said before any job
            failed.append(f"{number}: {' '.join(argv)} did not warn of {TEST_HOME_ENV}\n{result.stderr[-800:]}")
    assert not failed, "\n\n".join(failed)


def test_a_test_that_runs_the_workflow_without_the_e2e_marker_fails_at_once(tmp_path):
    """The unit tests (``pytest`` alone) run no workflow: a test that would is told to carry the e2e marker."""
    with pytest.raises(AssertionError, match="mark it e2e"):
        run_snakemake(workdir(tmp_path), ["-n", "all"], dict(os.environ))
    assert not (tmp_path / ".snakemake").exists()  # nothing was started
