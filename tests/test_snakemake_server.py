"""The tests' Snakemake server (tests/snakemake_server.py) answers as a ``snakemake`` process would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from workflow_helpers import SNAKEMAKE, SnakemakeServer, workdir

from dpsad.jobs.preflight import is_snakemake

TINY = ["--configfile", "config/config.yaml", "tests/data/tiny.yaml"]


@pytest.fixture
def server():
    started = SnakemakeServer()
    yield started
    started.close()


def test_the_server_gives_a_snakemake_processs_exit_status_output_and_files(server, tmp_path):
    cwd = workdir(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for args in (["-n", "all", *TINY], ["-n", "no/such/target", *TINY]):
        forked = server.run(cwd, args, env, timeout=300)
        real = subprocess.run([SNAKEMAKE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert forked.returncode == real.returncode, (args, forked.stdout[-2000:])
        last = [line for line in (real.stdout + real.stderr).splitlines() if line.strip()][-1]
        assert last in forked.stdout + forked.stderr, (args, last, forked.stdout[-2000:])
    assert forked.returncode != 0 and "MissingRuleException" in forked.stdout  # the second one: no such target
    # a run that writes: its files are in the working directory of the request
    server.run(cwd, ["results/mnist5k/data.h5", "--cores", "1", *TINY], env, timeout=300)
    assert (cwd / "results" / "mnist5k" / "data.h5").is_file()
    # its command line reads as a Snakemake to the workflow's checks, as a real one's does
    assert is_snakemake(Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode().split("\0"))


def test_a_command_past_its_timeout_is_stopped_and_the_server_serves_the_next(server, tmp_path):
    cwd = workdir(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(cwd, ["results/mnist5k/data.h5", "--cores", "1", *TINY], env, timeout=0.5)
    assert server.run(cwd, ["-n", "all", *TINY], env, timeout=300).returncode == 0


JOB = """import atexit, json, os, resource, signal, sys, threading, time
import numpy
import probe_module  # from PYTHONPATH, as the workflow's package is
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "value": os.environ["PROBE"],
                  "module": probe_module.__file__, "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
                  "umask": os.umask(0o22), "pgid": os.getpgid(0), "draw": int(numpy.random.randint(1 << 30)),
                  "parent": os.getppid()}))
sys.stdout.flush()
atexit.register(print, "atexit ran")
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
print("buffered, never flushed by the script")
way_out = os.environ.get("WAY_OUT")  # an environment variable: a script with arguments is run by the real python
if way_out == "signal":
    os.kill(os.getpid(), signal.SIGTERM)
if way_out == "raise":
    raise ValueError("uncaught")
if way_out == "interrupt":
    raise KeyboardInterrupt
sys.exit(3)
"""


def test_the_job_server_runs_a_script_as_its_own_python_process_would(tmp_path):
    """A job's script through the stand-in for ``python`` (workflow_helpers.JobServer) sees what it would see as
    ``python <script>``: its working directory, environment, PYTHONPATH, resource limits and umask, a fresh global
    random state, the caller's process group, and ends with the same exit status (or signal)."""
    import json
    import sys

    from workflow_helpers import JobServer

    jobs = JobServer()
    try:
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "probe_module.py").write_text("")
        (tmp_path / "job.py").write_text(JOB)
        env = {**os.environ, **jobs.env(), "PROBE": "seen", "PYTHONPATH": str(tmp_path / "lib")}

        def run(python: str, way_out: str = "") -> tuple[int, dict]:
            # a process group of its own, as Snakemake's (the server was started in the test's)
            proc = subprocess.Popen(["bash", "-c", 'ulimit -f 4096; umask 027; exec "$@"', "job", python, "job.py"],
                                    cwd=tmp_path, env={**env, "WAY_OUT": way_out}, stdout=subprocess.PIPE, text=True,
                                    process_group=0)
            first, *rest = proc.communicate(timeout=120)[0].splitlines()
            printed = json.loads(first)
            assert printed.pop("pgid") == proc.pid  # the job is in the group of the process that stood for it
            return proc.returncode, {**printed, "rest": sorted(rest)}

        real_status, real = run(sys.executable)
        forked_status, forked = run(str(jobs.shim))
        assert real_status == forked_status == 3
        # the job ran in a child of the server, and the rest is what it would be
        assert forked.pop("parent") == jobs.proc.pid != real.pop("parent")
        assert forked.pop("draw") != real.pop("draw")
        assert forked == real and forked["fsize"] == 4096 * 1024
        assert forked["umask"] == 0o027 and forked["value"] == "seen" and forked["path0"] == str(tmp_path)
        assert run(str(jobs.shim))[1]["draw"] != run(str(jobs.shim))[1]["draw"]  # each job its own global state
        # its end: threads joined, atexit handlers run, the buffered output flushed, the status of each way out
        assert forked["rest"] == ["atexit ran", "buffered, never flushed by the script", "thread joined"]
        for way_out, status in (("signal", -15), ("raise", 1), ("interrupt", -2)):  # -15: by SIGTERM, as the job was
            ended = run(str(jobs.shim), way_out)
            assert ended[1]["parent"] == jobs.proc.pid and run(sys.executable, way_out)[0] == ended[0] == status, way_out
        # a command line that is no script runs the real interpreter
        version = subprocess.run([str(jobs.shim), "-c", "import sys; print(sys.executable)"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert version.stdout.strip() == sys.executable
    finally:
        jobs.close()
