"""No job outlives its Snakemake, and a job that finished anyway is kept, not trained (and counted) twice.

Unit tests here drive the watcher with a stand-in Snakemake process and the
kept outputs through ``run_stage``; tests/test_interrupt.py kills the real
Snakemake during each long stage of the workflow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dpsad.jobs import kept_outputs
from dpsad.privacy.books.ledger import make_entry, write_ledger
from dpsad.privacy.books.spent_log import logged_rows
from dpsad.job_spending import record_stage_spending
from dpsad.jobs.stage import run_stage

JOB = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dpsad.jobs.one_running_copy import watch_snakemake
    outputs = sys.argv[1:]
    assert watch_snakemake(outputs, None, poll=0.1) is not None, "no Snakemake named to the job"
    print("watching", flush=True)
    for _ in range(600):
        time.sleep(0.1)
    Path(outputs[0] + ".lived").write_text("the job ran to its end")
""")


def start_under_fake_snakemake(tmp_path: Path, outputs: list[str], clean_env: bool = False) -> tuple[subprocess.Popen, int]:
    """A stand-in Snakemake that names itself to its jobs as the Snakefile does (``clean_env``: a launcher between
    them clears that from the job's environment), starts the job and waits for it; returns (it, the job's pid)."""
    fake = tmp_path / "bin" / "snakemake"
    fake.parent.mkdir()
    fake.write_text(textwrap.dedent(f"""
        import os, subprocess, sys
        from dpsad.jobs.one_running_copy import export_snakemake_identity
        export_snakemake_identity()
        env = {{k: v for k, v in os.environ.items() if k != "DPSAD_SNAKEMAKE"}} if {clean_env!r} else None
        job = subprocess.Popen([sys.executable, "-c", {JOB!r}, *sys.argv[1:]], stdout=open(sys.argv[1] + ".out", "w"), stderr=subprocess.STDOUT, env=env)
        print(job.pid, flush=True)
        job.wait()
    """))
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "DPSAD_SNAKEMAKE")}
    parent = subprocess.Popen([sys.executable, str(fake), *outputs], stdout=subprocess.PIPE, text=True, env=env)
    job_pid = int(parent.stdout.readline())
    out = Path(outputs[0] + ".out")
    deadline = time.monotonic() + 60
    while not (out.exists() and "watching" in out.read_text()):
        assert time.monotonic() < deadline, "the job never started watching"
        time.sleep(0.05)
    return parent, job_pid


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has ended; only its exit status is left


def wait_until_gone(pid: int, seconds: float) -> float:
    start = time.monotonic()
    while alive(pid):
        if time.monotonic() - start > seconds:
            raise AssertionError(f"job {pid} still alive {seconds} s after its Snakemake was killed")
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.e2e  # starts a Python process
@pytest.mark.parametrize("collected", [True, False], ids=["collected", "zombie"])
def test_a_job_ends_within_seconds_of_its_snakemake(tmp_path, collected):
    """Also when nobody collects the killed Snakemake (a container's init may never): a zombie is dead."""
    output = str(tmp_path / "model.pt")
    parent, job = start_under_fake_snakemake(tmp_path, [output])
    parent.send_signal(signal.SIGKILL)
    if collected:
        parent.wait()
    took = wait_until_gone(job, 10)
    parent.wait()
    assert took < 5 and not Path(output + ".lived").exists()
    assert "has ended, expected a live Snakemake: job stopped" in Path(output + ".out").read_text()


@pytest.mark.e2e  # starts a Python process
def test_a_job_whose_environment_lost_its_snakemakes_name_watches_its_snakemake_ancestor(tmp_path):
    output = str(tmp_path / "model.pt")
    parent, job = start_under_fake_snakemake(tmp_path, [output], clean_env=True)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_until_gone(job, 10) < 5 and not Path(output + ".lived").exists()
    assert "has ended, expected a live Snakemake: job stopped" in Path(output + ".out").read_text()


@pytest.mark.e2e  # starts a Python process
def test_a_job_whose_outputs_are_all_written_is_left_to_finish(tmp_path):
    output = tmp_path / "model.pt"
    output.write_text("complete")
    parent, job = start_under_fake_snakemake(tmp_path, [str(output)])
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(1.0)
    assert alive(job), "a job with every output written was stopped before its books were done"
    os.kill(job, signal.SIGKILL)


def _ledger_job(tmp_path: Path, trainings: list[int]) -> SimpleNamespace:
    out = tmp_path / "results" / "toy" / "run"
    out.mkdir(parents=True, exist_ok=True)
    output = SimpleNamespace(model=str(out / "model.pt"), ledger=str(out / "model.ledger.json"))
    data = tmp_path / "results" / "toy" / "data.h5"
    data.write_bytes(b"private records")
    return SimpleNamespace(log=[str(tmp_path / "job.log")], threads=1, rule="train_dp", input=[str(data)],
                           output=_Outputs(output), params=SimpleNamespace(items=lambda: {"lr": 0.1}.items()),
                           wildcards=SimpleNamespace(dataset="toy"))


class _Outputs(list):
    """Snakemake's named outputs: a list with attributes."""

    def __init__(self, named):
        super().__init__(vars(named).values())
        self.__dict__.update(vars(named))


def _train(trainings: list[int]):
    def body(snakemake, log):
        trainings.append(1)
        Path(snakemake.output.model).write_text(f"weights of training {len(trainings)}")
        entry = make_entry(stage="train_dp", private=True, mechanism="sgm", steps=10, sample_rate=0.1,
                           noise_multiplier=1.0, noise_seed="secret")
        write_ledger(snakemake.output.ledger, [entry])
    return body


def test_a_finished_job_run_again_gets_its_outputs_back_and_counts_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainings: list[int] = []
    job = _ledger_job(tmp_path, trainings)
    run_stage(job, _train(trainings), books=record_stage_spending)
    first = Path(job.output.model).read_text()
    spent = tmp_path / "results" / "toy" / "spent.jsonl"
    assert len(logged_rows(spent)) == 1
    # Snakemake died before it recorded the job's end: its rerun deletes the outputs as incomplete
    for path in job.output:
        Path(path).unlink()
    run_stage(job, _train(trainings), books=record_stage_spending)
    assert trainings == [1] and Path(job.output.model).read_text() == first
    assert len(logged_rows(spent)) == 1
    assert "nothing is trained again" in Path(job.log[0]).read_text()
    # another identity (the data changed): the kept copy is dropped and the job trains
    for path in job.output:
        Path(path).unlink()
    Path(job.input[0]).write_bytes(b"other records")
    run_stage(job, _train(trainings), books=record_stage_spending)
    assert trainings == [1, 1] and len(logged_rows(spent)) == 2


def test_a_kept_copy_is_dropped_once_a_job_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainings: list[int] = []
    job = _ledger_job(tmp_path, trainings)
    run_stage(job, _train(trainings), books=record_stage_spending)
    assert list(kept_outputs.FINISHED_FOLDER.glob("*/manifest.json"))
    consumer = SimpleNamespace(log=[str(tmp_path / "sample.log")], threads=1, rule="sample",
                               input=[job.output.model], output=[str(tmp_path / "synthetic.h5")])
    run_stage(consumer, lambda sm, log: Path(sm.output[0]).write_text("x"))
    assert not list(kept_outputs.FINISHED_FOLDER.glob("*"))


EXPORTED_JOB = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dpsad.jobs.one_running_copy import watch_snakemake
    time.sleep(float(sys.argv[2]))  # importing the package and torch: the window in which Snakemake may die
    print("watching", watch_snakemake([sys.argv[1]], None, poll=0.1), flush=True)
    for _ in range(300):
        time.sleep(0.1)
    Path(sys.argv[1] + ".lived").write_text("the job ran to its end")
""")


def _identity_of(pid: int, environ: dict) -> dict:
    """The environment the Snakefile gives its jobs, naming process ``pid`` as their Snakemake."""
    from dpsad.jobs.one_running_copy import SNAKEMAKE_ENV, export_snakemake_identity

    probe = dict(environ)
    export_snakemake_identity(probe)  # this process's identity, then the pid swapped for the stand-in's
    host, _, _, job = probe[SNAKEMAKE_ENV].rsplit(":", 3)
    start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    return {**environ, SNAKEMAKE_ENV: f"{host}:{pid}:{start}:{job}"}


@pytest.mark.e2e  # starts a Python process
def test_a_job_whose_snakemake_died_before_it_could_watch_stops_at_once(tmp_path):
    """The job is no descendant of its Snakemake (reparented): the identity the Snakefile exported finds it gone."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    stand_in = subprocess.Popen(["sleep", "60"])
    env = _identity_of(stand_in.pid, env)
    output = str(tmp_path / "model.pt")
    job = subprocess.Popen([sys.executable, "-c", EXPORTED_JOB, output, "1.0"], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stand_in.kill()  # Snakemake killed in the job's first second
    stand_in.wait()
    start = time.monotonic()
    out, _ = job.communicate(timeout=30)
    took = time.monotonic() - start
    print(out, took)
    assert job.returncode == 1 and took < 10 and "has ended, expected a live Snakemake: job stopped" in out
    assert "watching" not in out and not Path(output + ".lived").exists()
    # alive, it is watched; killed later, the job follows it
    stand_in = subprocess.Popen(["sleep", "60"])
    job = subprocess.Popen([sys.executable, "-c", EXPORTED_JOB, output, "0"], env=_identity_of(stand_in.pid, env),
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert job.stdout.readline().startswith(f"watching ({stand_in.pid}, ")
    stand_in.kill()
    stand_in.wait()
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 1 and "has ended" in out


def test_an_identity_exported_from_another_host_or_slurm_job_is_not_trusted():
    """A cluster job's own Snakemake runs inside the job: the submitting one may end while the job runs on."""
    from dpsad.jobs.one_running_copy import SNAKEMAKE_ENV, export_snakemake_identity, exported_snakemake

    environ = {"SLURM_JOB_ID": "17"}
    export_snakemake_identity(environ)
    assert exported_snakemake(environ) == (os.getpid(), Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert exported_snakemake({**environ, "SLURM_JOB_ID": "18"}) is None  # a job the SLURM executor submitted
    assert exported_snakemake({SNAKEMAKE_ENV: environ[SNAKEMAKE_ENV].replace(":", "x:", 1)}) is None  # another host
    inner = {**environ, "SLURM_JOB_ID": "18"}
    export_snakemake_identity(inner)  # the cluster job's own Snakemake takes over
    assert inner[SNAKEMAKE_ENV] != environ[SNAKEMAKE_ENV] and exported_snakemake(inner) is not None
    outer = dict(environ)
    export_snakemake_identity(outer)  # a Snakemake child of a local run keeps the outer one's
    assert outer[SNAKEMAKE_ENV] == environ[SNAKEMAKE_ENV]


def test_a_ledger_stage_without_books_stops_before_reading_anything(tmp_path, monkeypatch, capsys):
    """Its use of the private records would go unrecorded: the stage ends with one line, nothing trained."""
    monkeypatch.chdir(tmp_path)
    trainings: list[int] = []
    with pytest.raises(SystemExit) as stopped:
        run_stage(_ledger_job(tmp_path, trainings), _train(trainings))
    assert stopped.value.code == 1 and trainings == []
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "train_dp writes a ledger but keeps no books" in line


def test_a_second_copy_of_a_running_stage_stops_at_once_naming_the_first(tmp_path, monkeypatch):
    """The lock a rerun meets while an orphan of a killed Snakemake still writes the same files (the kernel frees it
    however the holder ends; tests/test_interrupt.py holds it against a real `make demo`)."""
    from dpsad.errors import DpsadError
    from dpsad.jobs.one_running_copy import hold_outputs

    monkeypatch.chdir(tmp_path)
    output = str(tmp_path / "student.pt")
    with hold_outputs([output]):
        start = time.monotonic()
        with pytest.raises(DpsadError, match=rf"another process \(pid {os.getpid()}\) is running this stage"):
            with hold_outputs([output]):
                pass
        assert time.monotonic() - start < 1.0  # a live holder: refused at once, not after the grace period
    with hold_outputs([output]):
        pass
