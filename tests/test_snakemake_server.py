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
