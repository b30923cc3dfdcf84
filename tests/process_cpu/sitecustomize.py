"""Loaded by every Python process started under ``pytest --cpu-by-process`` (tests/cpu_durations.py puts this
folder first on PYTHONPATH): at exit, the process's own CPU time and its command line, one JSON line in the file
that DPSAD_PROCESS_CPU_LOG names.  A process killed before its exit writes nothing."""

from __future__ import annotations

import atexit
import json
import os
import sys

LOG_ENV = "DPSAD_PROCESS_CPU_LOG"


def write_own_cpu(path: str) -> None:
    """Append {"cpu": user + system seconds of this process alone, "argv": its command line} to ``path``."""
    times = os.times()
    line = json.dumps({"cpu": round(times.user + times.system, 3), "argv": [sys.executable, *sys.argv]})
    with open(path, "a") as handle:  # one short write per process: lines from processes ending together stay whole
        handle.write(line + "\n")


if os.environ.get(LOG_ENV):
    atexit.register(write_own_cpu, os.environ[LOG_ENV])
