"""``--cpu-durations N``: the N tests that took the most CPU time, the processes they ran included.

``--durations`` gives wall times, and a suite that runs more processes than the machine has cores (workers,
Snakemake, its jobs) measures the waiting as much as the test: the same test took twice as long beside others as
alone.  CPU time says what a test costs the suite.  A test's figure is its worker's CPU time from the start of its
setup to the end of its teardown, with that of every process the worker waited for (its Snakemake and, through
it, the jobs): a fixture built once for many tests counts in the test that built it.  Not counted: processes left running or killed
before their parent waited for them (a killed Snakemake's jobs), and daemons (SLURM's).
"""

from __future__ import annotations

import resource

import pytest

CPU_KEY = "cpu_seconds"
_started = pytest.StashKey[float]()
_measured: list[tuple[float, str]] = []


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="show the N tests that took the most CPU time, the processes they ran included")


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
    count = config.getoption("--cpu-durations")
    if count <= 0 or not _measured:
        return
    terminalreporter.write_sep("=", f"{count} tests that took the most CPU time (their processes included)")
    for seconds, nodeid in sorted(_measured, reverse=True)[:count]:
        terminalreporter.write_line(f"{seconds:8.2f}s cpu  {nodeid}")
    terminalreporter.write_line(f"{sum(seconds for seconds, _ in _measured):8.2f}s cpu  all {len(_measured)} tests")
