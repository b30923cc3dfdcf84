"""kill -9 during the teacher, the student (mid-checkpoint) and sampling; the README's `make demo` resumes.

Each kill takes down the whole process group (make, Snakemake and the job),
like a closed terminal or an OOM kill. After every kill the same command is
run again; at the end the ledgers must equal those of an uninterrupted run and
no temporary, resume or lock file may be left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_workflow import ROOT, snakemake, workdir

VENV = Path(sys.executable).parents[1]
TARGET = "results/mnist5k/dpsad_eps10/synthetic.h5"
ARGS = "--configfile config/config.yaml tests/data/tiny.yaml tests/data/interrupt.yaml"

pytestmark = pytest.mark.slow


def make_demo(cwd: Path) -> subprocess.Popen:
    """The README's `make demo`, aimed at one run's synthetic data with the test overlays."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(["make", "--no-print-directory", "demo", f"VENV={VENV}", f"TARGET={TARGET}", f"ARGS={ARGS}"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def kill_when(proc: subprocess.Popen, ready, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}:\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def log_mentions(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


def leftovers(cwd: Path) -> list[str]:
    results = cwd / "results"
    found = [p for p in results.rglob("*") if p.name.endswith((".tmp", ".resume"))]
    found += list((cwd / ".snakemake" / "locks").glob("*"))
    return sorted(str(p.relative_to(cwd)) for p in found)


@pytest.fixture
def interrupt_dir(tmp_path):
    stamp = VENV / ".installed-stamp"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip("needs the environment `make test` installs (.venv/.installed-stamp)")
    (tmp_path / "interrupted").mkdir()
    cwd = workdir(tmp_path / "interrupted")
    for name in ("Makefile", "pyproject.toml"):
        (cwd / name).symlink_to(ROOT / name)
    return cwd


def test_killed_runs_resume_with_the_readme_command(interrupt_dir, tmp_path):
    cwd = interrupt_dir
    run = cwd / "results" / "mnist5k"

    # 1. teacher, once its first resume checkpoint is written
    kill_when(make_demo(cwd), lambda: (run / "teacher" / "public.pt.resume").exists(), "the teacher's checkpoint")
    assert not (run / "teacher" / "public.pt").exists() and not (run / "teacher" / "public.loss.csv").exists()
    assert list((cwd / ".snakemake" / "locks").glob("*")), "expected the kill to leave Snakemake's lock"

    # 2. student, part-way; a SIGKILL inside torch.save leaves a truncated temporary, planted here
    #    because the real window (a few milliseconds) cannot be hit reliably from outside
    student = run / "dpsad_eps10"
    kill_when(make_demo(cwd), lambda: (student / "student.pt.resume").exists(), "the student's checkpoint")
    (student / ".student.pt.resume.k1ll3d.tmp").write_bytes((student / "student.pt.resume").read_bytes()[:500])
    assert not (student / "student.pt").exists() and not list(student.glob("*.csv"))
    assert (run / "teacher" / "public.pt").exists()  # the resumed teacher finished

    # 3. sampling, after the job has started
    kill_when(make_demo(cwd), lambda: log_mentions(cwd / "logs" / "mnist5k" / "sample_dpsad_eps10.log", "sample: dpsad"),
              "sampling to start")
    time.sleep(1.0)
    assert not (student / "synthetic.h5").exists(), "sampling finished before the kill; make it longer"

    # 4. the same command completes
    final = make_demo(cwd)
    output, _ = final.communicate(timeout=600)
    assert final.returncode == 0, output[-3000:]
    assert "removed the lock of an interrupted run" in output
    assert leftovers(cwd) == []
    assert (student / "synthetic.h5").exists() and (student / "student_loss.csv").exists()

    # the same ledgers as a run that was never interrupted
    (tmp_path / "reference").mkdir()
    reference = workdir(tmp_path / "reference")
    snakemake(reference, "--profile", "profiles/local", "results/mnist5k/dpsad_eps10/privacy.json", *ARGS.split())
    for name in ("teacher/public.ledger.json", "dpsad_eps10/student.ledger.json"):
        assert json.loads((run / name).read_text()) == json.loads((reference / "results" / "mnist5k" / name).read_text())
    interrupted = json.loads((student / "privacy.json").read_text())
    uninterrupted = json.loads((reference / "results" / "mnist5k" / "dpsad_eps10" / "privacy.json").read_text())
    assert interrupted["dp_guarantee"] is True and interrupted["epsilon"] == uninterrupted["epsilon"]
