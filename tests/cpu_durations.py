"""``--cpu-durations N``: the N tests that took the most CPU time, the processes they ran included.
``--cpu-by-process``: the suite's CPU time by kind of process (Snakemake's starts, each rule's jobs, the rest), and
the tests whose processes took the most, with how many Snakemake starts and jobs each ran.

``--durations`` gives wall times, and a suite that runs more processes than the machine has cores (workers,
Snakemake, its jobs) measures the waiting as much as the test: the same test took twice as long beside others as
alone.  CPU time says what a test costs the suite.  A test's figure is its worker's CPU time from the start of its
setup to the end of its teardown, with that of every process the worker waited for (its Snakemake and, through
it, the jobs): a fixture built once for many tests counts in the test that built it.  Not counted: processes left running or killed
before their parent waited for them (a killed Snakemake's jobs), and daemons (SLURM's).
"""

from __future__ import annotations

import json
import os
import re
import resource
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

CPU_KEY = "cpu_seconds"
PROCESS_HOOK = Path(__file__).resolve().parent / "process_cpu"  # its sitecustomize.py logs each process's CPU
PROCESS_LOG_ENV = "DPSAD_PROCESS_CPU_LOG"
_JOB_SCRIPT = re.compile(r"\.snakemake/scripts/tmp\w+\.(\w+)\.py$")  # how Snakemake names a rule's script job
_started = pytest.StashKey[float]()
_process_log = pytest.StashKey[str]()
_measured: list[tuple[float, str]] = []


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="show the N tests that took the most CPU time, the processes they ran included")
    parser.addoption("--cpu-by-process", action="store_true",
                     help="show the suite's CPU time by kind of Python process: Snakemake's starts, each rule's "
                          "jobs, the rest (each process's own time, logged at its exit)")


def pytest_configure(config):
    """Under --cpu-by-process, every Python process started from here on (the xdist workers, Snakemake, its jobs:
    they inherit the environment) logs its own CPU time at exit; pytest's own first process does not.  Set once,
    by the process that starts the others.  The hook is a sitecustomize module: one the environment had is not
    loaded meanwhile (the project's virtual environment has none)."""
    if config.getoption("--cpu-by-process") and not os.environ.get(PROCESS_LOG_ENV):
        handle, path = tempfile.mkstemp(prefix="dpsad-process-cpu-", suffix=".jsonl")
        os.close(handle)
        config.stash[_process_log] = path
        os.environ[PROCESS_LOG_ENV] = path
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PROCESS_HOOK), os.environ.get("PYTHONPATH"))))


def process_kind(argv: list[str]) -> str:
    """The kind a Python process's command line names: ``job <rule>`` for a Snakemake script job, ``Snakemake``
    for a Snakemake start (the command, or its module under SLURM), else the script's or module's name."""
    words = argv[1:] or argv
    for word in words:
        if job := _JOB_SCRIPT.search(word):
            return f"job {job.group(1)}"
    program = Path(words[0]).name
    if program == "snakemake" or words[0].endswith("snakemake/__main__.py") or words[:2] == ["-m", "snakemake"]:
        return "Snakemake"
    return "python -c (xdist workers, test snippets)" if program == "-c" else program


def process_table(lines: list[str]) -> list[tuple[str, int, float]]:
    """[(kind, processes, CPU seconds)] from the hook's JSON lines, the costliest kind first."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for line in lines:
        record = json.loads(line)
        total = totals[process_kind(record["argv"])]
        total[0] += 1
        total[1] += record["cpu"]
    return sorted(((kind, count, cpu) for kind, (count, cpu) in totals.items()), key=lambda row: -row[2])


OUTSIDE_TESTS = "(outside any test: the xdist workers themselves)"
TESTS_SHOWN = 15


def processes_by_test(lines: list[str]) -> list[tuple[str, int, int, float]]:
    """[(test, Snakemake starts, jobs, CPU seconds of all its processes)] from the hook's JSON lines, the costliest
    test first: which tests start Snakemake most often, and which run the most jobs."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for line in lines:
        record = json.loads(line)
        kind = process_kind(record["argv"])
        total = totals[record.get("test") or OUTSIDE_TESTS]
        total[0] += kind == "Snakemake"
        total[1] += kind.startswith("job ")
        total[2] += record["cpu"]
    return sorted(((test, *figures) for test, figures in totals.items()), key=lambda row: -row[3])


def cpu_seconds() -> float:
    """User and system time of this process and of every child process it waited for, so far."""
    return sum(usage.ru_utime + usage.ru_stime
               for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_started] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _started in item.stash:
        report = outcome.get_result()
        # a list of the report's own: item.user_properties is shared by the test's three reports
        report.user_properties = [*report.user_properties, (CPU_KEY, cpu_seconds() - item.stash[_started])]


def pytest_runtest_logreport(report):
    """Where the reports arrive (the xdist controller, or the one process), keep each test's figure."""
    if report.when == "teardown":
        _measured.extend((float(value), report.nodeid) for name, value in report.user_properties if name == CPU_KEY)


def pytest_terminal_summary(terminalreporter, config):
    _write_process_table(terminalreporter, config)
    count = config.getoption("--cpu-durations")
    if count <= 0 or not _measured:
        return
    terminalreporter.write_sep("=", f"{count} tests that took the most CPU time (their processes included)")
    for seconds, nodeid in sorted(_measured, reverse=True)[:count]:
        terminalreporter.write_line(f"{seconds:8.2f}s cpu  {nodeid}")
    terminalreporter.write_line(f"{sum(seconds for seconds, _ in _measured):8.2f}s cpu  all {len(_measured)} tests")


def _write_process_table(terminalreporter, config) -> None:
    path = config.stash.get(_process_log, None)
    if path is None:
        return
    lines = Path(path).read_text().splitlines()
    Path(path).unlink()
    rows = process_table(lines)
    terminalreporter.write_sep("=", "CPU time by kind of Python process (each process's own; killed ones are missing)")
    for kind, count, cpu in rows:
        terminalreporter.write_line(f"{cpu:8.1f}s cpu {count:5d} processes {cpu / count:6.2f}s each  {kind}")
    terminalreporter.write_line(f"{sum(cpu for _, _, cpu in rows):8.1f}s cpu {sum(n for _, n, _ in rows):5d} processes")
    terminalreporter.write_sep("=", f"{TESTS_SHOWN} tests whose processes took the most CPU (Snakemake's starts, jobs)")
    for test, starts, jobs, cpu in processes_by_test(lines)[:TESTS_SHOWN]:
        terminalreporter.write_line(f"{cpu:8.1f}s cpu {starts:4d} Snakemake {jobs:4d} jobs  {test}")
