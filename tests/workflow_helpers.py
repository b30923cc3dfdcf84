"""Running the workflow from the tests: a working directory that sees the repository, Snakemake, its plans."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def workdir(tmp_path: Path) -> Path:
    """A working directory that sees the repository's workflow but keeps its own results."""
    for name in ("Snakefile", "workflow", "config", "src", "slurm", "profiles", "tests", "envs"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


# The rules that ask for more than one thread (dpsad.jobs.resources.RULE_THREADS).  The tests' models are tiny, so one thread each lets two jobs share the
# 2 cores instead of running one at a time (a test-only setting: threads are no params and rerun nothing).
TWO_THREAD_RULES = ("train_moco", "extract_features", "kmeans_labels", "cluster_report", "train_teacher", "distill_student", "train_dpdm",
                    "train_dpgan", "sample", "train_evaluator", "evaluate", "evaluate_real", "audit_run")
ONE_THREAD_EACH = ("--set-threads", *(f"{rule}=1" for rule in TWO_THREAD_RULES))


def snakemake(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # targets first: --config would swallow anything after it
    args = [a for a in args if a == "all"] + [a for a in args if a != "all"]
    first_option = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    args = args[:first_option] + list(ONE_THREAD_EACH) + args[first_option:]
    result = subprocess.run([SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run into {rule: count}."""
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}
