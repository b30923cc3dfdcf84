"""Provenance: an artifact's ledger is the union of the ledgers of everything it was built from, transitively."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from dpsad.privacy.books.ledger import entries_digest, make_entry, read_ledgers, write_ledger
from workflow_helpers import ONE_THREAD_EACH, SNAKEMAKE, Wildcards, forget_releases, record_env, snakemake, workdir

LEAK = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", "tests/data/leak.yaml")


def test_a_rules_inputs_carry_the_ledger_of_every_artifact_but_the_prepared_data():
    from dpsad.config import inputs
    from dpsad.errors import DpsadError

    wildcards = Wildcards(dataset="toy", run="dpsad_eps1")
    named = inputs.with_upstream_ledgers(data=inputs.PREPARED_DATA, teacher=lambda wc: f"results/{wc.dataset}/teacher/a.pt",
                                         labels=lambda wc: ["results/toy/labels.h5", "results/toy/teacher/a.pt"],
                                         nothing=lambda wc: [])(wildcards)
    assert named["data"] == "results/toy/data.h5" and named["nothing"] == []
    assert named["upstream_ledgers"] == ["results/toy/teacher/a.ledger.json", "results/toy/labels.ledger.json"]
    with pytest.raises(DpsadError, match="results/toy/spent.json: no ledger sits beside it"):
        inputs.ledger_of("results/toy/spent.json")


def test_a_cumulative_ledger_counts_a_shared_ancestor_once(tmp_path):
    encoder = tmp_path / "encoder.ledger.json"
    write_ledger(encoder, [make_entry(stage="train_moco", private=True, mechanism="none")])
    labels = tmp_path / "labels.ledger.json"
    write_ledger(labels, [make_entry(stage="kmeans_labels", private=False, mechanism="none")], upstream=[encoder])
    teacher = tmp_path / "teacher.ledger.json"
    write_ledger(teacher, [make_entry(stage="train_teacher", private=False, mechanism="none")], upstream=[labels, encoder])
    assert [e["stage"] for e in read_ledgers([teacher])] == ["train_moco", "kmeans_labels", "train_teacher"]
    # read beside its ancestors, each use is still counted once
    assert [e["stage"] for e in read_ledgers([encoder, teacher, labels])] == ["train_moco", "kmeans_labels", "train_teacher"]


def test_entries_without_a_uid_are_never_merged(tmp_path):
    path = tmp_path / "old.ledger.json"
    entry = make_entry(stage="train_dpdm", private=True, mechanism="sgm", sample_rate=0.01, noise_multiplier=1.0,
                       steps=10, clip_norm=1.0, noise_seed="secret")
    del entry["uid"]
    path.write_text(json.dumps({"entries": [entry, dict(entry)], "entries_sha256": entries_digest([entry, entry])}))
    assert len(read_ledgers([path, path])) == 4  # over-counting an unidentified use is the safe side


def test_an_artifact_embeds_its_ledgers_entries_and_a_stage_refuses_one_another_ledger_lacks(tmp_path):
    """k-means labels (the .h5 artifacts as the checkpoints) keep their entries; a stage whose upstream ledger lacks
    them stops before it reads a record.  The prepared data and a file that is no HDF5 embed none: left to their
    readers."""
    from types import SimpleNamespace

    import h5py
    import numpy as np

    from dpsad.data.pseudo_labels import SPLITS, write_pseudo_labels
    from dpsad.errors import DpsadError
    from dpsad.job_spending import check_upstream_artifacts, embedded_entries

    def fit(name: str, split: str) -> tuple[str, str]:
        entry = make_entry(stage="kmeans_labels", private=split == "private", mechanism="none")
        labels, ledger = tmp_path / f"{name}.h5", tmp_path / f"{name}.ledger.json"
        write_pseudo_labels(labels, {s: np.zeros(3, np.int64) for s in SPLITS}, ["c0"], fit_split=split,
                            features="moco", ledger_entries=[entry], data_attrs={})
        write_ledger(ledger, [entry])
        return str(labels), str(ledger)

    def job(*inputs: str, upstream: list[str]):
        files = type("Inputs", (list,), {})(inputs)
        files.upstream_ledgers = upstream
        return SimpleNamespace(input=files)

    public_fit, public_ledger = fit("public", "public")
    private_fit, _ = fit("private", "private")
    (tmp_path / "data.h5").write_bytes(b"not hdf5")
    assert embedded_entries(public_fit) == read_ledgers([public_ledger])
    assert embedded_entries(tmp_path / "data.h5") is None
    check_upstream_artifacts(job(str(tmp_path / "data.h5"), public_fit, public_ledger, upstream=[public_ledger]))
    with pytest.raises(DpsadError, match=rf"{public_ledger}: lacks the entry for 'kmeans_labels' that {private_fit} "
                                         rf"was built with, .*: delete {private_fit} and rerun the rule"):
        check_upstream_artifacts(job(private_fit, public_ledger, upstream=[public_ledger]))
    with h5py.File(public_fit, "a") as handle:
        handle.attrs["ledger"] = "[{damaged"
    with pytest.raises(DpsadError, match=f"{public_fit}: its ledger attribute is damaged"):
        check_upstream_artifacts(job(public_fit, public_ledger, upstream=[public_ledger]))


@pytest.fixture(scope="module")
def leak_run(tiny_run, tmp_path_factory):
    """The issue's config: MoCo on the private split -> k-means labels -> teacher pk -> warm starts of a
    DPDM run (dpdm_x) and of a DP teacher (dpt) distilled by a DP-SAD run (dpsad_y)."""
    cwd = tmp_path_factory.mktemp("leak") / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)  # only the changed stages rerun
    forget_releases(cwd)  # a curator who never released these records: this test reads this configuration's own total
    snakemake(cwd, "--cores", "2", *LEAK, "--", "release")
    return cwd


@pytest.mark.parametrize("run", ["dpdm_x", "dpsad_y"])
def test_a_warm_start_from_a_teacher_on_private_moco_labels_has_no_guarantee(leak_run, run):
    privacy = json.loads((leak_run / "results" / "mnist5k" / run / "privacy.json").read_text())
    stages = [c["stage"] for c in privacy["components"]]
    assert privacy["dp_guarantee"] is False and privacy["epsilon"] is None
    assert privacy["reasons"] == ["train_moco: trained on private records without noise"]
    assert {"train_moco", "kmeans_labels", "train_teacher[pk]"} <= set(stages)
    released = leak_run / "release" / "mnist5k" / run
    assert sorted(p.name for p in released.iterdir() if p.name != ".snakemake_timestamp") == [
        "NOT_RELEASED.txt", "README.md", "privacy.json"]
    assert "train_moco" in (released / "NOT_RELEASED.txt").read_text()


def test_a_dp_teacher_warm_started_from_such_a_teacher_composes_its_whole_history(leak_run):
    entries = read_ledgers([leak_run / "results" / "mnist5k" / "teacher" / "dpt.ledger.json"])
    # (the public teacher is no input of the labels: with MoCo features it only adds a row to the cluster report)
    assert [e["stage"] for e in entries] == ["train_moco", "kmeans_labels", "train_teacher[pk]", "train_teacher[dpt]"]
    budget = json.loads((leak_run / "release" / "mnist5k" / "BUDGET.json").read_text())
    assert budget["epsilon"] == 0.0 and [r["released"] for r in budget["runs"]] == [False, False]


STALE = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", "tests/data/stale_resume.yaml")


@pytest.mark.e2e
def test_a_resume_checkpoint_built_from_other_inputs_is_never_resumed(leak_run, tmp_path_factory):
    """MoCo on the private split -> k-means labels -> teacher pk, killed (as by an out-of-memory kill) once its
    resume checkpoint exists; MoCo moved back to the public split; the release is built.  pk's first steps read
    labels of a MoCo fitted on private records without noise: the rerun must start pk over (or state no
    guarantee for what descends from it).  Built on a copy of the leak run, whose MoCo, features and labels
    already read the private split: only pk (a longer one here) trains before the kill."""
    cwd = tmp_path_factory.mktemp("stale") / "wf"
    shutil.copytree(leak_run, cwd, symlinks=True)
    forget_releases(cwd)
    private_moco = cwd / "private_moco.yaml"
    private_moco.write_text("moco: {split: private}\n")
    resume = cwd / "results" / "mnist5k" / "teacher" / "pk.pt.resume"
    env = {**os.environ, "OMP_NUM_THREADS": "1", **record_env(cwd)}
    job = subprocess.Popen([SNAKEMAKE, "results/mnist5k/teacher/pk.pt", "--cores", "1", *ONE_THREAD_EACH, *STALE,
                            str(private_moco)], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    deadline = time.monotonic() + 300
    while not resume.exists():
        assert job.poll() is None and time.monotonic() < deadline, "pk ended or took too long before its first checkpoint"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    encoder_ledger = json.loads((cwd / "results" / "mnist5k" / "moco" / "encoder.ledger.json").read_text())
    assert [e["private"] for e in encoder_ledger["entries"]] == [True]  # the checkpoint was built on private MoCo
    snakemake(cwd, "--unlock", *STALE)
    snakemake(cwd, "--cores", "2", *STALE, "--", "release")
    log = (cwd / "logs" / "mnist5k" / "train_teacher_pk.log").read_text()
    print([line for line in log.splitlines() if "resum" in line or "ignoring" in line])
    assert "resuming from" not in log and "inputs whose content has changed" in log
    for run in ("pub_pk", "dpdm_x"):
        privacy = json.loads((cwd / "results" / "mnist5k" / run / "privacy.json").read_text())
        stages = {c["stage"]: c["private"] for c in privacy["components"]}
        assert stages["train_moco"] is False and privacy["dp_guarantee"] is True, privacy["reasons"]


def dry_run_jobs(cwd, *args) -> list[dict]:
    """Every job of a dry run: {rule, inputs, outputs}, parsed from Snakemake's job listing (targets first)."""
    text = snakemake(cwd, *args, "-n", "--cores", "1").stdout
    jobs = []
    for block in re.split(r"\n(?=\[[^\]]+\]\n(?:local)?rule )", text):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        if not rule:
            continue
        files = {key: re.search(rf"^    {key}: (.*)$", block, re.M) for key in ("input", "output")}
        jobs.append({"rule": rule.group(1), **{key: set(m.group(1).split(", ")) if m else set() for key, m in files.items()}})
    return jobs


@pytest.mark.e2e
@pytest.mark.parametrize("targets", [
    ("all", "audit", "sweep", "--configfile", "config/config.yaml", "tests/data/tiny.yaml"),
    ("all",) + LEAK,
], ids=["default_with_audit_and_sweep", "warm_starts_and_dp_teacher"])
def test_every_input_that_carries_a_ledger_is_composed_by_the_job_that_reads_it(tmp_path, targets):
    """Walk every job of the DAG: an input X.pt / X.h5 whose producer also wrote X.ledger.json carries that
    ledger, and the job reading it composes that ledger: it reads it, or a ledger or privacy.json composed from it."""
    jobs = dry_run_jobs(workdir(tmp_path), *targets)
    producer = {path: job for job in jobs for path in job["output"]}
    checked = 0
    for job in jobs:
        # what the job composes: the ledgers it reads, and (ledgers being cumulative) everything those and the
        # privacy.json files it reads were composed from
        composed, frontier = set(), [p for p in job["input"] if p.endswith(("ledger.json", "privacy.json"))]
        while frontier:
            path = frontier.pop()
            if path not in composed:
                composed.add(path)
                frontier += [p for p in producer[path]["input"] if p.endswith("ledger.json")] if path in producer else []
        for path in job["input"]:
            ledger = re.sub(r"\.(pt|h5)$", ".ledger.json", path)
            if ledger != path and path in producer and ledger in producer[path]["output"]:
                assert ledger in composed, f"{job['rule']} reads {path} but composes no {ledger}"
                checked += 1
    rules = {job["rule"] for job in jobs}
    assert {"train_teacher", "distill_student", "account", "sample", "release_run"} <= rules
    assert checked >= 10


@pytest.mark.e2e
def test_a_teacher_copied_over_another_is_refused_before_the_student_reads_a_record(tiny_run, tmp_path):
    """The student's ledger composes the teacher's ledger file; a teacher checkpoint from another training, copied
    over the file (as a hand-made reuse or a restore of the wrong backup), would be composed with the ledger of
    the one it replaced.  Its job stops with one line naming both files before it reads the private split."""
    cwd = tmp_path / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)
    forget_releases(cwd)
    teachers = cwd / "results" / "mnist5k" / "teacher"
    shutil.copyfile(teachers / "public_kmeans.pt", teachers / "public.pt")  # newer: the students rerun
    student = "results/mnist5k/dpsad_eps10/student.pt"
    result = snakemake(cwd, "--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml", "--",
                       student, check=False)
    assert result.returncode != 0
    log = (cwd / "logs" / "mnist5k" / "distill_student_dpsad_eps10.log").read_text()
    assert ("results/mnist5k/teacher/public.ledger.json: lacks the entry for 'train_teacher[public_kmeans]' that "
            "results/mnist5k/teacher/public.pt was built with, expected the ledger written with it: delete "
            "results/mnist5k/teacher/public.pt and rerun the rule that writes it") in log, log[-2000:]
    assert "DP plan (distill_student)" not in log and not (cwd / student).exists()
