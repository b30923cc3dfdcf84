"""Loaded by every Python process started under ``pytest --cpu-by-process`` (tests/cpu_durations.py puts this
folder first on PYTHONPATH): at exit, the process's own CPU time, its command line and the test that started it
(pytest's PYTEST_CURRENT_TEST, which the test's processes inherit), one JSON line in the file that
DPSAD_PROCESS_CPU_LOG names.  A process killed before its exit writes nothing."""

from __future__ import annotations

import atexit
import json
import os
import sys

LOG_ENV = "DPSAD_PROCESS_CPU_LOG"


def write_own_cpu(path: str) -> None:
    """Append {"cpu": user + system seconds of this process alone, "argv": its command line, "test": the node id of
    the test that started it, "" outside any test (an xdist worker itself)} to ``path``."""
    times = os.times()
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")[0]  # "path::name (call)"
    line = json.dumps({"cpu": round(times.user + times.system, 3), "argv": [sys.executable, *sys.argv], "test": test})
    with open(path, "a") as handle:  # one short write per process: lines from processes ending together stay whole
        handle.write(line + "\n")


if os.environ.get(LOG_ENV):
    atexit.register(write_own_cpu, os.environ[LOG_ENV])
