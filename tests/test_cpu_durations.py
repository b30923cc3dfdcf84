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
