"""The SLURM profile against a real single-node SLURM cluster started for this test.

It builds on a copy of the finished tiny run (tests/conftest.py's ``tiny_run``): the overlay
tests/data/tiny_slurm.yaml changes the student, so the student, its sampling, evaluation, accounting and
release run again, each computing job through sbatch.  The student job is cancelled by the scheduler
(scancel) after its first checkpoint; the profile's retries resubmit it, it resumes, and its ledger counts
each step once.  The rules that do not rerun are shown to the scheduler by a dry run that forces them.

Marked ``slurm``: skipped when a cluster cannot be started here (not root,
no packages), except under CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config
from test_workflow import ROOT, SNAKEMAKE, planned_jobs
from workflow_helpers import forget_releases, record_env, resource_lines, run_snakemake

from dpsad.config import validate_config
from dpsad.config.resources import RuleTable, job_request, read_prepared_shape

pytestmark = pytest.mark.slurm
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
TABLE = RuleTable.read(ROOT / "workflow" / "resources.yaml")
SLURM_RULES = ("prepare_data", "train_teacher", "distill_student", "sample", "train_evaluator", "evaluate", "evaluate_real")
CONFIGS = ("config/config.yaml", "tests/data/tiny.yaml", "tests/data/tiny_slurm.yaml")


@pytest.fixture(scope="module")
def cluster():
    started = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=600)
    if started.returncode != 0:
        message = f"could not start SLURM: {started.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    yield
    subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, text=True, timeout=120)


def slurm_args(*extra: str) -> list[str]:
    """The shipped profile, with the overrides a 2-core test node without GPUs or accounting needs."""
    return [
        "all", "--profile", "slurm", "--configfile", *CONFIGS,
        "--slurm-no-account", "--slurm-status-command", "squeue", "--slurm-keep-successful-logs", "--slurm-init-seconds-before-status-checks", "1",
        # memory and runtime are the rules' own estimates (small for the tiny config); one CPU per job here
        "--default-resources", "slurm_partition=debug", "cpus_per_task=1",
        # one CPU per job on this 2-CPU node (each rule asks for its own otherwise: 8 for training, 4 for sampling);
        # the student's memory, overridden for this node, still grows with the attempt
        "--set-resources", *(f"{rule}:cpus_per_task=1" for rule in SLURM_RULES), "distill_student:mem_mb=1000*attempt",
        "--set-threads", "train_teacher=1", "distill_student=1", "sample=1", "train_evaluator=1", "evaluate=1",
        "evaluate_real=1", "--jobs", "4", "--latency-wait", "5", *extra,
    ]


def kill_student_after_first_checkpoint(cwd: Path, stop_at: float) -> bool:
    """scancel the distill_student job once its resumable checkpoint exists.  True if it did."""
    resume = cwd / "results" / "mnist5k" / "dpsad_eps10" / "student.pt.resume"
    while time.time() < stop_at:
        if resume.exists():
            jobs = subprocess.run(["squeue", "-h", "-o", "%i %k"], capture_output=True, text=True).stdout.splitlines()
            for line in jobs:
                job_id, _, comment = line.partition(" ")
                if "distill_student" in comment:
                    subprocess.run(["scancel", job_id], check=False)
                    return True
        time.sleep(0.5)
    return False


LOCAL_RULES = {"account", "privacy_spent", "compare", "sweep_plot", "audit_table", "release_run", "release_budget"}
UNCHANGED_RULES = {"prepare_data": {"dataset": "mnist5k"}, "train_teacher": {"dataset": "mnist5k", "teacher": "public"},
                   "train_evaluator": {"dataset": "mnist5k"}, "evaluate_real": {"dataset": "mnist5k"}}


def declared_local_rules() -> set[str]:
    """The rules of workflow/rules/ that declare ``localrule: True`` (they run beside Snakemake, not through sbatch)."""
    local, rule = set(), None
    for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for line in path.read_text().splitlines():
            if match := re.match(r"rule (\w+):", line):
                rule = match.group(1)
            elif line.strip() == "localrule: True":
                local.add(rule)
    return local


def merged_config() -> dict:
    """The validated configuration of CONFIGS, merged as Snakemake merges them."""
    config = {}
    for path in CONFIGS:
        update_config(config, copy.deepcopy(yaml.safe_load((ROOT / path).read_text())))
    return validate_config(config)


def test_tiny_pipeline_on_a_real_slurm_cluster(cluster, tiny_run, tmp_path):
    cwd = tmp_path / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)  # the changed student and what descends from it rerun
    # a curator who never released these records: the release below is this configuration's first
    forget_releases(cwd)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **record_env(cwd)}
    # the stages this run does not repeat would go to the scheduler too: only bookkeeping rules are local, and a
    # dry run that forces those stages gives each the request of dpsad.config.resources
    assert declared_local_rules() == LOCAL_RULES
    forced = run_snakemake(cwd, slurm_args("-n", "--forcerun", *UNCHANGED_RULES), env)
    assert forced.returncode == 0, (forced.stdout + forced.stderr)[-3000:]
    config, shape = merged_config(), read_prepared_shape(cwd / "results" / "mnist5k" / "data.h5")
    listed = resource_lines(forced)
    for rule, wildcards in UNCHANGED_RULES.items():
        assert {int(job["mem_mb"]) for job in listed[rule]} == {job_request(config, rule, wildcards, shape, TABLE).mem_mb}, rule
    proc = subprocess.Popen([SNAKEMAKE, *slurm_args()], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    killed = kill_student_after_first_checkpoint(cwd, time.time() + 900)
    output, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, output[-6000:]
    assert killed, "the student job was never seen with a checkpoint to kill"

    results = cwd / "results" / "mnist5k"
    privacy = json.loads((results / "dpsad_eps10" / "privacy.json").read_text())
    assert privacy["dp_guarantee"] is True and privacy["epsilon"] <= 10.0
    (student,) = [e for e in privacy["components"] if e["stage"] == "distill_student"]
    assert student["steps"] == math.ceil(0.2 / (16 / 4000))  # each step counted once despite the kill
    assert "resuming from" in (cwd / "logs" / "mnist5k" / "distill_student_dpsad_eps10.log").read_text()
    assert (results / "dpsad_eps10" / "synthetic.h5").exists() and (cwd / "results" / "comparison.md").exists()
    assert (cwd / "release" / "mnist5k" / "dpsad_eps10" / "synthetic.h5").exists()
    # every computing job went through sbatch (the plugin's per-job SLURM logs exist for each such rule); the
    # bookkeeping rules of a few seconds ran on the submitting machine (localrule)
    slurm_logs = {part for p in (cwd / ".snakemake" / "slurm_logs").rglob("*.log") for part in p.parts if part.startswith("rule_")}
    assert {"rule_distill_student", "rule_sample", "rule_evaluate"} <= slurm_logs
    assert not {"rule_account", "rule_compare", "rule_release_run", "rule_release_budget", "rule_prepare_data",
                "rule_train_teacher"} & slurm_logs  # local bookkeeping; the unchanged stages did not run again
    assert planned_jobs(run_snakemake(cwd, slurm_args("-n"), env)) == {}
    # the resubmitted student asked SLURM for twice the memory of the killed attempt
    jobs = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%k|%m"], capture_output=True, text=True).stdout.splitlines()
    student_memory = [fields[2] for fields in (line.split("|") for line in jobs) if "distill_student" in fields[1]]
    assert sorted(student_memory) == ["1000M", "2000M"], jobs
    # the other rules kept their own requests (dpsad.config.resources), not Snakemake's defaults
    for rule in ("sample", "evaluate"):
        wanted = job_request(config, rule, {"dataset": "mnist5k", "run": "dpsad_eps10"}, shape, TABLE).mem_mb
        asked = {fields[2] for fields in (line.split("|") for line in jobs) if fields[1].startswith(f"rule_{rule}_wildcards_")}
        assert asked == {f"{wanted}M"}, (rule, wanted, jobs)

    # the student again as one job of two SLURM tasks: srun starts one torch launcher per task, they meet at the
    # job's node, train as one mechanism, and the job writes one ledger
    short = cwd / "short_student.yaml"  # 13 steps: enough to train as one mechanism in two processes
    short.write_text("student: {epochs: 0.05, batch_size: 16, checkpoint_every: 10}\n")
    two_tasks = ["results/mnist5k/dpsad_eps10/student.pt"] + [a for a in slurm_args("--forcerun", "distill_student")
                                                             if a != "all"]
    two_tasks.insert(two_tasks.index("tests/data/tiny_slurm.yaml") + 1, str(short))
    two_tasks.insert(two_tasks.index("--set-resources") + 1, "distill_student:tasks=2")  # one option, many values
    result = run_snakemake(cwd, two_tasks, env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    log = (cwd / "logs" / "mnist5k" / "distill_student_dpsad_eps10.log").read_text()
    assert "2 training processes (2 launcher(s) of 1): srun --jobid=" in log and "--ntasks=2" in log
    assert "(training process 0 of 2)" in log
    entries = json.loads((results / "dpsad_eps10" / "student.ledger.json").read_text())["entries"]
    two = [e for e in entries if e["stage"] == "distill_student"]
    assert len(two) == 1 and two[0]["steps"] == math.ceil(0.05 / (16 / 4000)) and two[0]["uid"] != student["uid"]
    assert two[0]["sample_rate"] == student["sample_rate"] and two[0]["noise_seed"] == "secret"
