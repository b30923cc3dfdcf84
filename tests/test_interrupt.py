"""kill -9 during the teacher, the student (mid-checkpoint) and sampling; the README's `make demo` resumes; a
kill of Snakemake alone during each long stage stops its job within seconds.

Each kill takes down the whole process group (make, Snakemake and the job),
like a closed terminal or an OOM kill. After every kill the same command is
run again; at the end every step must be counted once in the ledger and no
temporary, resume or lock file may be left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_workflow import ROOT, workdir
from workflow_helpers import TWO_THREAD_RULES, skip_without_make_tests_venv

from dpsad.jobs.one_running_copy import hold_outputs, lock_path
from dpsad.jobs.preflight import live_snakemake_pids
from dpsad.privacy.accounting import steps_for_epochs
from dpsad.privacy.books.ledger import read_ledgers, verdict
from dpsad.training.checkpoints import load_checkpoint

VENV = Path(sys.executable).parents[1]
TARGET = "results/mnist5k/dpsad_eps10/synthetic.h5"
# one thread a job (as the other workflow tests): two-thread jobs beside the other pytest worker's slow down 3x
ARGS = ("--configfile config/config.yaml tests/data/tiny.yaml tests/data/interrupt.yaml --set-threads "
        + " ".join(f"{rule}=1" for rule in TWO_THREAD_RULES))

pytestmark = pytest.mark.e2e


def make_demo(cwd: Path, stdout=subprocess.PIPE) -> subprocess.Popen:
    """The README's `make demo`, aimed at one run's synthetic data with the test overlays."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(["make", "--no-print-directory", "demo", f"VENV={VENV}", f"TARGET={TARGET}", f"ARGS={ARGS}"],
                            cwd=cwd, env=env, stdout=stdout, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for(ready, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def resumed_steps(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"resuming from \S+ at step (\d+)", log.read_text())]


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


def lock_is_free(path: Path) -> bool:
    import fcntl

    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def log_mentions(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


def leftovers(cwd: Path) -> list[str]:
    results = cwd / "results"
    found = [p for p in results.rglob("*") if p.name.endswith((".tmp", ".resume"))]
    found += list((cwd / ".snakemake" / "locks").glob("*"))
    return sorted(str(p.relative_to(cwd)) for p in found)


@pytest.fixture
def interrupt_dir(tmp_path):
    skip_without_make_tests_venv(VENV)
    (tmp_path / "interrupted").mkdir()
    cwd = workdir(tmp_path / "interrupted")
    for name in ("Makefile", "pyproject.toml"):
        (cwd / name).symlink_to(ROOT / name)
    return cwd


def test_killed_runs_resume_with_the_readme_command(interrupt_dir):
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

    # 2b. only Snakemake is killed: its student job stops within a second (a rerun resumes from its last
    #     checkpoint), and a second copy of the stage started beside a running one is refused
    student_log = cwd / "logs" / "mnist5k" / "distill_student_dpsad_eps10.log"
    with open(cwd.parent / "orphan.out", "w") as out:
        orphaned = make_demo(cwd, stdout=out)
        wait_for(lambda: log_mentions(student_log, "resuming from"), "the resumed student")
        (snakemake_pid,) = live_snakemake_pids(cwd)
        os.kill(snakemake_pid, signal.SIGKILL)
        wait_for(lambda: log_mentions(student_log, "has ended, expected a live Snakemake: job stopped"), "the orphan to stop",
                 timeout=10)
        orphaned.wait(timeout=60)
    # the job logs its stop, then exits: the kernel frees its lock a moment after its files are closed
    lock = cwd / lock_path(student / "student.pt")
    wait_for(lambda: lock_is_free(lock), "the stopped job's lock to be freed", timeout=10)
    assert resumed_steps(student_log) == [5] and not (student / "student.pt").exists()
    stopped_at = load_checkpoint(student / "student.pt.resume")["step"]
    held = cwd / "results" / "mnist5k" / "dpsad_eps10" / "student.pt"
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with hold_outputs([str(held)]):
            refused = make_demo(cwd)
            output, _ = refused.communicate(timeout=300)
    finally:
        os.chdir(previous)
    assert refused.returncode != 0 and f"another process (pid {os.getpid()}) is running this stage" in output, output[-3000:]
    # the refused copy trained nothing: the checkpoint is still the orphan's last one
    assert load_checkpoint(student / "student.pt.resume")["step"] == stopped_at and not (student / "student.pt").exists()

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
    # one training: the last copy took over where the orphan stopped, not from an earlier step
    assert resumed_steps(student_log) == [stopped_at]

    # every step counted once: the ledger holds the planned steps (not the steps run before a kill added to
    # those after it), and the stated epsilon is that ledger's (the in-process kill test in test_training.py
    # compares a resumed ledger with an uninterrupted run's entry by entry)
    planned = steps_for_epochs(0.3, 16 / 4000)
    teacher_entries = read_ledgers([run / "teacher" / "public.ledger.json"])
    # the student's ledger is cumulative: the teacher's entry (the same use, once), then its own two
    upstream, *student_entries = read_ledgers([student / "student.ledger.json"])
    assert [e["steps"] for e in teacher_entries] == [40] and upstream == teacher_entries[0]
    assert [(e["steps"], e["noise_seed"]) for e in student_entries] == [(planned, "secret")] * 2
    assert student_entries[0]["batch"] == student_entries[1]["batch"]
    stated = json.loads((student / "privacy.json").read_text())
    recomputed = verdict(teacher_entries + student_entries, delta=1e-5, accountant="pld", target_epsilon=10.0,
                         num_private_records=4000)
    assert stated["dp_guarantee"] is True and recomputed["epsilon"] == pytest.approx(stated["epsilon"], rel=1e-9)


# --- only Snakemake is killed, during each long stage ------------------------------------------------

STAGES = [  # (rule, target, its log, run it to its end afterwards)
    ("train_moco", "results/mnist5k/moco/encoder.pt", "train_moco.log", False),
    ("train_teacher", "results/mnist5k/teacher/public.pt", "train_teacher_public.log", True),
    ("distill_student", "results/mnist5k/dpsad_eps10/student.pt", "distill_student_dpsad_eps10.log", True),
    ("train_dpdm", "results/mnist5k/dpdm_eps10/dpdm.pt", "train_dpdm_dpdm_eps10.log", True),
    ("train_dpgan", "results/mnist5k/dpgan_eps10/dpgan.pt", "train_dpgan_dpgan_eps10.log", True),
    ("sample", "results/mnist5k/dpsad_eps10/synthetic.h5", "sample_dpsad_eps10.log", False),
    ("train_evaluator", "results/mnist5k/evaluator.pt", "train_evaluator.log", False),
]
ORPHAN_ARGS = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml", "tests/data/orphans.yaml")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has ended


def test_a_killed_snakemake_leaves_no_job_running_and_each_training_counts_once(tmp_path):
    from workflow_helpers import ONE_THREAD_EACH, SNAKEMAKE, snakemake

    cwd = workdir(tmp_path)
    logs = cwd / "logs" / "mnist5k"
    snakemake(cwd, "results/mnist5k/data.h5", *ORPHAN_ARGS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for rule, target, log_name, finish in STAGES:
        with open(tmp_path / f"{rule}.out", "w") as out:
            proc = subprocess.Popen([SNAKEMAKE, target, *ONE_THREAD_EACH, *ORPHAN_ARGS], cwd=cwd, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            wait_for(lambda: log_mentions(logs / log_name, f"{rule}: dpsad"), f"{rule} to start", timeout=180)
            time.sleep(0.3)  # past its watcher's start, into its work
            family = descendants(proc.pid)
            assert proc.poll() is None and family and not (cwd / target).exists(), (
                f"{rule} ended before the kill; make it longer")
            proc.kill()  # Snakemake alone, not its process group
            proc.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in family):
            assert time.monotonic() < deadline, (f"{rule}: processes {[p for p in family if alive(p)]} alive 10 s after "
                                                 "Snakemake was killed")
            time.sleep(0.1)
        assert not (cwd / target).exists(), rule
        assert "has ended, expected a live Snakemake: job stopped" in (logs / log_name).read_text(), rule
        subprocess.run([sys.executable, "-m", "dpsad.jobs.preflight"], cwd=cwd, check=True)  # as `make demo` does first
        if finish:
            snakemake(cwd, target, *ORPHAN_ARGS)
        if rule == "distill_student":
            # the finished student run again (as Snakemake does when it died before recording the end): its
            # outputs are put back, nothing is trained again
            snakemake(cwd, target, "--forcerun", "distill_student", *ORPHAN_ARGS)
            assert "nothing is trained again" in (logs / log_name).read_text()
    # every DP training once in the curator's spending log: exactly the private entries of the final ledgers
    run = cwd / "results" / "mnist5k"
    ledgers = [run / "dpsad_eps10" / "student.ledger.json", run / "dpdm_eps10" / "dpdm.ledger.json",
               run / "dpgan_eps10" / "dpgan.ledger.json"]
    private = sorted(e["uid"] for e in read_ledgers(ledgers) if e["private"])
    spent = [json.loads(line)["entry"]["uid"] for line in (run / "spent.jsonl").read_text().splitlines()]
    assert sorted(spent) == private and len(private) >= 3


def test_a_job_whose_snakemake_dies_before_its_first_log_line_stops_within_seconds(tmp_path):
    """The window before a job reaches its watcher: reparented at once, it found no Snakemake among its ancestors
    and trained on alone (58.8 s here, to its end, before the Snakefile exported the Snakemake's identity)."""
    from workflow_helpers import ONE_THREAD_EACH, SNAKEMAKE, snakemake

    cwd = workdir(tmp_path)
    log = cwd / "logs" / "mnist5k" / "train_moco.log"
    snakemake(cwd, "results/mnist5k/data.h5", *ORPHAN_ARGS)
    (cwd / "long_moco.yaml").write_text("moco: {epochs: 400}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([SNAKEMAKE, "results/mnist5k/moco/encoder.pt", *ONE_THREAD_EACH, *ORPHAN_ARGS,
                             "long_moco.yaml"], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def job() -> list[int]:
        # the job's script, not "train_moco" alone: Snakemake's own command line holds that (--set-threads), and so
        # does every child it forks until that child execs (a helper it runs, or the job before it has started)
        found = []
        for pid in descendants(proc.pid):
            try:
                if b".train_moco.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                pass
        return found

    wait_for(lambda: bool(job()), "the train_moco job's process", timeout=180)
    family = descendants(proc.pid)
    proc.kill()  # Snakemake alone, while the job is still importing its package
    proc.wait()
    assert not log_mentions(log, "train_moco: dpsad"), "the job logged before the kill; kill earlier"
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in family):
        assert time.monotonic() < deadline, f"processes {[p for p in family if alive(p)]} alive 10 s after the kill"
        time.sleep(0.1)
    assert "has ended, expected a live Snakemake: job stopped" in log.read_text()
    assert not (cwd / "results" / "mnist5k" / "moco" / "encoder.pt").exists()
