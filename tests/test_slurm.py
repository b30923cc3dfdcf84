"""The SLURM profile against a real single-node SLURM cluster started for this test.

Every job goes through sbatch.  The student job is cancelled by the scheduler
(scancel) after its first checkpoint; the profile's retries resubmit it, it
resumes, and its ledger counts each step once.

Marked ``slurm``: skipped when a cluster cannot be started here (not root,
no packages), except under CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import pytest
from test_workflow import ROOT, SNAKEMAKE, planned_jobs, workdir

pytestmark = pytest.mark.slurm
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
SLURM_RULES = ("prepare_data", "train_teacher", "distill_student", "sample", "train_evaluator", "evaluate", "evaluate_real")


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
        "all", "--profile", "slurm", "--configfile", "config/config.yaml", "tests/data/tiny.yaml", "tests/data/tiny_slurm.yaml",
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


def test_tiny_pipeline_on_a_real_slurm_cluster(cluster, tmp_path):
    cwd = workdir(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
    assert {"rule_prepare_data", "rule_train_teacher", "rule_distill_student", "rule_sample", "rule_evaluate"} <= slurm_logs
    assert not {"rule_account", "rule_compare", "rule_release_run", "rule_release_budget"} & slurm_logs
    assert planned_jobs(subprocess.run([SNAKEMAKE, *slurm_args("-n")], cwd=cwd, capture_output=True, text=True, env=env)) == {}
    # the resubmitted student asked SLURM for twice the memory of the killed attempt
    jobs = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%k|%m"], capture_output=True, text=True).stdout.splitlines()
    student_memory = [fields[2] for fields in (line.split("|") for line in jobs) if "distill_student" in fields[1]]
    assert sorted(student_memory) == ["1000M", "2000M"], jobs
    # the other rules kept their own requests (dpsad.jobs.resources), not Snakemake's defaults
    teacher_memory = {fields[2] for fields in (line.split("|") for line in jobs) if "train_teacher" in fields[1]}
    assert teacher_memory and all(int(m.rstrip("M")) >= 2000 for m in teacher_memory), jobs

    # the student again as one job of two SLURM tasks: srun starts one torch launcher per task, they meet at the
    # job's node, train as one mechanism, and the job writes one ledger
    short = cwd / "short_student.yaml"  # 13 steps: enough to train as one mechanism in two processes
    short.write_text("student: {epochs: 0.05, batch_size: 16, checkpoint_every: 10}\n")
    two_tasks = ["results/mnist5k/dpsad_eps10/student.pt"] + [a for a in slurm_args("--forcerun", "distill_student")
                                                             if a != "all"]
    two_tasks.insert(two_tasks.index("tests/data/tiny_slurm.yaml") + 1, str(short))
    two_tasks.insert(two_tasks.index("--set-resources") + 1, "distill_student:tasks=2")  # one option, many values
    result = subprocess.run([SNAKEMAKE, *two_tasks], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    log = (cwd / "logs" / "mnist5k" / "distill_student_dpsad_eps10.log").read_text()
    assert "2 training processes (2 launcher(s) of 1): srun --jobid=" in log and "--ntasks=2" in log
    assert "(training process 0 of 2)" in log
    entries = json.loads((results / "dpsad_eps10" / "student.ledger.json").read_text())["entries"]
    two = [e for e in entries if e["stage"] == "distill_student"]
    assert len(two) == 1 and two[0]["steps"] == math.ceil(0.05 / (16 / 4000)) and two[0]["uid"] != student["uid"]
    assert two[0]["sample_rate"] == student["sample_rate"] and two[0]["noise_seed"] == "secret"
