"""Running the workflow from the tests: a working directory that sees the repository, Snakemake, its plans."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpsad.privacy.books.curator_record import TEST_HOME_ENV
from dpsad.privacy.epsilon_cache import CACHE_ENV, CALIBRATION_CACHE_ENV

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
E2E_ENV = "DPSAD_TEST_E2E"  # set by tests/conftest.py for the tests marked e2e
WORKFLOW_CALIBRATIONS_ENV = "DPSAD_TEST_WORKFLOW_CALIBRATIONS"  # this test run's, set by tests/conftest.py


def skip_without_make_tests_venv(venv: Path) -> None:
    """Skip a test that runs `make demo` with ``venv`` where `make test` did not install it (its stamp is missing or
    older than pyproject.toml): make would then try to build it, and the test would fail on that, not on its
    subject (seen where the suite ran under another Python with the project on its path)."""
    stamp = Path(venv) / ".installed-stamp"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip("needs the environment `make test` installs (.venv/.installed-stamp)")


class Wildcards(dict):
    """A job's wildcards as Snakemake gives them to an input function: by name and as a mapping."""

    __getattr__ = dict.__getitem__


def record_env(cwd: Path) -> dict[str, str]:
    """The environment that gives the workspace ``cwd`` a user's home of its own for the curator's record, inside
    it (the suite's stand-in for the home the user database names): a copy of the workspace carries it along, and
    no two tests' releases of the same records meet.  A test of the record itself passes its own instead."""
    home = str(Path(cwd).resolve() / ".test-home")
    return {TEST_HOME_ENV: home, "HOME": home}


def forget_releases(cwd: Path) -> None:
    """A curator who never released the workspace's records: no release/, no curator's record."""
    for name in ("release", ".test-home"):
        shutil.rmtree(Path(cwd) / name, ignore_errors=True)


def workdir(tmp_path: Path) -> Path:
    """A working directory that sees the repository's workflow but keeps its own results."""
    for name in ("Snakefile", "workflow", "config", "src", "slurm", "profiles", "tests", "envs", "experiments"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path




def threaded_rules() -> tuple[str, ...]:
    """The workflow's rules that set their threads (every one asks for two or more: dpsad.config.resources)."""
    names = []
    for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=(?:local)?rule \w+:)", path.read_text()):
            rule = re.match(r"(?:local)?rule (\w+):", block.strip())
            if rule and re.search(r"^\s+threads:", block, re.M):
                names.append(rule.group(1))
    return tuple(names)


# The tests' models are tiny, so one thread each lets two jobs share the 2 cores instead of running one at a time
# (a test-only setting: threads are no params and rerun nothing).
TWO_THREAD_RULES = threaded_rules()
ONE_THREAD_EACH = ("--set-threads", *(f"{rule}=1" for rule in TWO_THREAD_RULES))


def run_snakemake(cwd: Path, args: list[str], env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    """``snakemake <args>`` in ``cwd`` with ``env``, a real process run to its end (a curator's record of the
    workspace's own unless ``env`` names one).  Only in a test marked e2e."""
    if not os.environ.get(E2E_ENV):
        raise AssertionError("this test runs the workflow: mark it e2e (pytest.mark.e2e)")
    if TEST_HOME_ENV not in env or env[TEST_HOME_ENV] == os.environ.get(TEST_HOME_ENV):
        env = {**env, **record_env(cwd)}
    # The verdicts' cache of a user's run (the Snakefile's own, in the workspace).  The noise calibrations share a
    # cache of the suite's workflows: their jobs calibrate the same few plans, each composed once by the accountant
    # and then read, exactly as keyed (a user's run composes them afresh).  Not the unit tests' cache, where a test
    # that replaces part of the accountant could leave a composition no real one made.
    env = {k: v for k, v in env.items() if k not in (CACHE_ENV, CALIBRATION_CACHE_ENV)}
    if this_runs_cache := os.environ.get(WORKFLOW_CALIBRATIONS_ENV):
        env[CALIBRATION_CACHE_ENV] = this_runs_cache
    return subprocess.run([SNAKEMAKE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def snakemake(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # targets first: --config would swallow anything after it
    args = [a for a in args if a == "all"] + [a for a in args if a != "all"]
    first_option = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    args = args[:first_option] + list(ONE_THREAD_EACH) + args[first_option:]
    result = run_snakemake(cwd, args, env)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


def resource_lines(result: subprocess.CompletedProcess) -> dict[str, list[dict[str, str]]]:
    """{rule: [{resource: value} of each job]} from the job blocks of a dry run, in a stable order."""
    resources: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", result.stdout + result.stderr):
        rule = re.match(r"(?:local)?rule (\w+):", block.strip())
        line = re.search(r"^\s*resources: (.*)$", block, re.M)
        if rule and line:
            resources.setdefault(rule.group(1), []).append(dict(item.split("=", 1) for item in line.group(1).split(", ")))
    return {rule: sorted(jobs, key=lambda job: sorted(job.items())) for rule, jobs in resources.items()}


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run into {rule: count}."""
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}
