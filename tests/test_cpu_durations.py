"""``--cpu-durations`` (tests/cpu_durations.py), the suite's own CPU figures per test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.e2e  # starts a Python process
def test_a_tests_cpu_time_holds_the_processes_it_ran_and_not_its_waiting(tmp_path):
    burn = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    (tmp_path / "test_pair.py").write_text(
        "import subprocess, sys, time\n\n"
        f"def test_busy_child():\n    subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n\n"
        "def test_idle():\n    time.sleep(0.6)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | {"PYTHONPATH": str(TESTS)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "cpu_durations", "-p", "no:cacheprovider",
                             "--cpu-durations", "5", "test_pair.py"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    figures = re.findall(r"^\s*([\d.]+)s cpu  test_pair\.py::(\w+)$", result.stdout, re.M)
    assert [name for _, name in figures] == ["test_busy_child", "test_idle"], result.stdout[-2000:]
    seconds = {name: float(value) for value, name in figures}
    assert seconds["test_busy_child"] >= 0.55 and seconds["test_idle"] < 0.3, seconds
    assert re.search(r"^\s*[\d.]+s cpu  all 2 tests$", result.stdout, re.M)


def test_each_process_is_counted_under_the_kind_its_command_names(tmp_path):
    """Snakemake's starts (the command, or its module as SLURM starts it), each rule's script jobs by rule, the
    rest by program; the table sums each kind's processes and own CPU, the costliest first."""
    import json

    from cpu_durations import process_kind, process_table

    python = "/venv/bin/python"
    assert process_kind([python, "/venv/bin/snakemake", "all", "--cores", "2"]) == "Snakemake"
    assert process_kind([python, "-m", "snakemake", "-n"]) == "Snakemake"
    assert process_kind([python, "/venv/lib/python3.11/site-packages/snakemake/__main__.py", "--target-jobs", "x"]) == "Snakemake"
    assert process_kind([python, "/ws/.snakemake/scripts/tmpa1b_c2.distill_student.py"]) == "job distill_student"
    assert process_kind([python, "-c"]) == "python -c (xdist workers, test snippets)"
    assert process_kind([python, "benchmarks/job_start.py", "--rule", "account"]) == "job_start.py"
    lines = [json.dumps({"cpu": cpu, "argv": [python, argv]}) for cpu, argv in
             ((1.5, "/venv/bin/snakemake"), (0.5, "/ws/.snakemake/scripts/tmpx.account.py"), (1.0, "/venv/bin/snakemake"),
              (0.25, "/ws/.snakemake/scripts/tmpy.account.py"))]
    assert process_table(lines) == [("Snakemake", 2, 2.5), ("job account", 2, 0.75)]


def test_each_tests_processes_are_summed_with_its_snakemake_starts_and_jobs():
    """The processes a test started, by the test the hook found in their environment; a process started outside
    any test (an xdist worker) under a row of its own."""
    import json

    from cpu_durations import OUTSIDE_TESTS, processes_by_test

    python = "/venv/bin/python"
    lines = [json.dumps({"cpu": cpu, "argv": [python, argv], "test": test}) for cpu, argv, test in
             ((1.0, "/venv/bin/snakemake", "t.py::a"), (2.0, "/ws/.snakemake/scripts/tmpx.sample.py", "t.py::a"),
              (0.5, "/venv/bin/snakemake", "t.py::b"), (1.0, "/venv/bin/snakemake", "t.py::b"),
              (4.0, "-c", ""), (0.25, "benchmarks/job_start.py", "t.py::b"))]
    assert processes_by_test(lines) == [(OUTSIDE_TESTS, 0, 0, 4.0), ("t.py::a", 1, 1, 3.0), ("t.py::b", 2, 0, 1.75)]


def test_the_process_hook_appends_one_line_of_its_own_cpu_per_process(tmp_path, monkeypatch):
    import atexit
    import importlib.util
    import json

    from cpu_durations import PROCESS_HOOK, PROCESS_LOG_ENV

    # unset here even under --cpu-by-process: this worker's own hook is registered already, and a second one would
    # write the worker's CPU time twice into the table
    monkeypatch.delenv(PROCESS_LOG_ENV, raising=False)
    registered = []
    monkeypatch.setattr(atexit, "register", lambda *args: registered.append(args))
    spec = importlib.util.spec_from_file_location("process_cpu_hook", PROCESS_HOOK / "sitecustomize.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert registered == []  # nothing registered, so nothing written at this worker's exit
    assert hook.LOG_ENV == PROCESS_LOG_ENV  # the hook cannot import the plugin: each names the variable
    log = tmp_path / "cpu.jsonl"
    hook.write_own_cpu(str(log))
    hook.write_own_cpu(str(log))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2 and all(r["argv"][0] == sys.executable and r["cpu"] > 0 for r in records)
    this_test = "tests/test_cpu_durations.py::test_the_process_hook_appends_one_line_of_its_own_cpu_per_process"
    assert {r["test"] for r in records} == {this_test}  # the test that runs, without pytest's "(call)"
    assert records[1]["cpu"] >= records[0]["cpu"]


@pytest.mark.e2e  # starts a Python process
def test_cpu_by_process_counts_the_processes_a_suite_started(tmp_path):
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    scripts = tmp_path / ".snakemake" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "tmpab12.account.py").write_text(burn)
    (tmp_path / "test_jobs.py").write_text(
        "import subprocess, sys\n\n"
        "def test_two_jobs():\n"
        "    for _ in range(2):\n"
        "        subprocess.run([sys.executable, '.snakemake/scripts/tmpab12.account.py'], check=True)\n")
    from cpu_durations import PROCESS_LOG_ENV

    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", PROCESS_LOG_ENV)}
    env["PYTHONPATH"] = str(TESTS)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "cpu_durations", "-p", "no:cacheprovider",
                             "--cpu-by-process", "test_jobs.py"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    row = re.search(r"^\s*([\d.]+)s cpu\s+(\d+) processes\s+[\d.]+s each  job account$", result.stdout, re.M)
    assert row and int(row.group(2)) == 2 and float(row.group(1)) >= 0.75, result.stdout[-2000:]
    by_test = re.search(r"^\s*([\d.]+)s cpu\s+(\d+) Snakemake\s+(\d+) jobs  test_jobs\.py::test_two_jobs$", result.stdout, re.M)
    assert by_test and by_test.group(2, 3) == ("0", "2") and float(by_test.group(1)) >= 0.75, result.stdout[-2000:]
