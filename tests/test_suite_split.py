"""The split between `pytest` alone (the unit tests) and `make test` (every test), tests/conftest.py."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_unit_test_that_starts_python_is_told_to_be_marked_e2e():
    with pytest.raises(AssertionError, match="mark the test e2e"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert subprocess.run(["true"], check=True).returncode == 0  # other programs start as usual


@pytest.mark.e2e
def test_an_e2e_test_starts_python_as_usual():
    done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "42"
