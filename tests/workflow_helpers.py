"""Running the workflow from the tests: a working directory that sees the repository, Snakemake, its plans."""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def record_env(cwd: Path) -> dict[str, str]:
    """The environment that gives the workspace ``cwd`` a curator's record and a machine witness of its own, inside
    it: a copy of the workspace carries them along, and no two tests' releases of the same records meet.  A test
    of the record itself sets DPSAD_CURATOR_DIR (and XDG_STATE_HOME) in the environment it passes instead."""
    return {"DPSAD_CURATOR_DIR": str(Path(cwd).resolve() / ".test-curator"),
            "XDG_STATE_HOME": str(Path(cwd).resolve() / ".test-state")}


def forget_releases(cwd: Path) -> None:
    """A curator who never released the workspace's records: no release/, no curator's record, no witnesses."""
    for name in ("release", ".dpsad", ".test-curator", ".test-state"):
        shutil.rmtree(Path(cwd) / name, ignore_errors=True)


def workdir(tmp_path: Path) -> Path:
    """A working directory that sees the repository's workflow but keeps its own results."""
    for name in ("Snakefile", "workflow", "config", "src", "slurm", "profiles", "tests", "envs"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


# The rules that ask for more than one thread (dpsad.jobs.resources.RULE_THREADS).  The tests' models are tiny, so one thread each lets two jobs share the
# 2 cores instead of running one at a time (a test-only setting: threads are no params and rerun nothing).
TWO_THREAD_RULES = ("train_moco", "extract_features", "kmeans_labels", "cluster_report", "train_teacher", "distill_student", "train_dpdm",
                    "train_dpgan", "train_pe", "sample", "train_evaluator", "evaluate", "evaluate_real", "audit_run")
ONE_THREAD_EACH = ("--set-threads", *(f"{rule}=1" for rule in TWO_THREAD_RULES))


class SnakemakeServer:
    """``snakemake <args>`` run by a fork of one process that has imported Snakemake (tests/snakemake_server.py):
    the same command line, working directory and environment, without paying Snakemake's imports each time.

    Only for commands that run to their end: a test that kills Snakemake starts a real ``snakemake`` process."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="snakemake-server-"))
        link = self.folder / "snakemake"  # the name the workflow's checks know a Snakemake command line by
        link.symlink_to(Path(__file__).with_name("snakemake_server.py"))
        self.proc = subprocess.Popen([sys.executable, str(link), SNAKEMAKE], cwd=self.folder, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        self.calls, self.pending = 0, b""

    def reply(self, timeout: float) -> dict:
        """The server's next reply line, or {} after ``timeout`` seconds without one."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return {}
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the Snakemake server ended (exit status {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, cwd: Path, args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        self.calls += 1
        out, err = (self.folder / f"{self.calls}.{name}" for name in ("out", "err"))
        request = {"cwd": os.path.abspath(cwd), "args": args, "env": env, "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        pid = self.reply(60)["pid"]
        ended = self.reply(timeout)
        if not ended:
            os.killpg(pid, signal.SIGKILL)
            self.reply(60)
            raise subprocess.TimeoutExpired([SNAKEMAKE, *args], timeout)
        result = subprocess.CompletedProcess([SNAKEMAKE, *args], ended["returncode"], out.read_text(), err.read_text())
        out.unlink()
        err.unlink()
        return result

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)


class JobServer:
    """Runs the Python job scripts of a Snakemake run, each in a fork of one process that has imported torch,
    SciPy, dp-accounting and the other heavy libraries (tests/job_server.py), through a stand-in for ``python``
    (tests/job_shim.py) that Snakemake runs in its place.

    Only for runs whose jobs are not measured as processes: a job's peak memory in its benchmark file is the
    stand-in's, and a test that kills jobs or reads their command lines runs a real ``snakemake``."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="dpsad-jobs-"))
        self.socket = self.folder / "socket"
        self.shim = self.folder / "python"
        self.shim.write_text(f"#!{sys.executable} -SE\n" + (ROOT / "tests" / "job_shim.py").read_text())
        self.shim.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "job_server.py"), str(self.socket)],
                                     env={**env, "OMP_NUM_THREADS": "1"}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.proc.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the tests' job server did not start (exit status {self.proc.wait()})")

    def env(self) -> dict[str, str]:
        """The variables that send a Snakemake run's jobs to this server."""
        return {"DPSAD_TEST_JOB_SHIM": str(self.shim), "DPSAD_TEST_JOB_SERVER": str(self.socket),
                "DPSAD_TEST_REAL_PYTHON": sys.executable}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)


_SERVER: SnakemakeServer | None = None
_JOBS: JobServer | None = None


def run_snakemake(cwd: Path, args: list[str], env: dict, timeout: float = 900,
                  forked_jobs: bool = True) -> subprocess.CompletedProcess:
    """``snakemake <args>`` in ``cwd`` with ``env``, to its end (through this test process's Snakemake server),
    its Python jobs run by the job server unless ``forked_jobs`` is False."""
    global _SERVER, _JOBS
    if "DPSAD_CURATOR_DIR" not in env:
        env = {**env, **record_env(cwd)}
    if _SERVER is None:
        _SERVER = SnakemakeServer()
        atexit.register(_SERVER.close)
    if forked_jobs:
        if _JOBS is None:
            _JOBS = JobServer()
            atexit.register(_JOBS.close)
        env = {**env, **_JOBS.env()}
    return _SERVER.run(cwd, args, env, timeout)


def snakemake(cwd: Path, *args: str, check: bool = True, forked_jobs: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # targets first: --config would swallow anything after it
    args = [a for a in args if a == "all"] + [a for a in args if a != "all"]
    first_option = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    args = args[:first_option] + list(ONE_THREAD_EACH) + args[first_option:]
    result = run_snakemake(cwd, args, env, forked_jobs=forked_jobs)
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
