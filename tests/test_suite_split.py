"""The split between `pytest` alone (the unit tests) and `make test` (every test), tests/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_unit_test_that_starts_python_is_told_to_be_marked_e2e():
    with pytest.raises(AssertionError, match="mark the test e2e"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert subprocess.run(["true"], check=True).returncode == 0  # other programs start as usual


@pytest.mark.e2e
def test_an_e2e_test_starts_python_as_usual():
    done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "42"


def test_the_unit_tests_compositions_stay_in_pytests_cache_and_the_workflows_get_this_runs_own(
        request, tmp_path_factory, tmp_path, monkeypatch):
    """The unit tests' verdict and calibration cache is pytest's (kept from one run to the next, emptied by
    ``--cache-clear``; this run's own under ``-p no:cacheprovider``); the workflows a test runs get a calibration
    cache of this run, never that one."""
    import workflow_helpers
    from workflow_helpers import E2E_ENV, WORKFLOW_CALIBRATIONS_ENV, run_snakemake

    from dpsad.privacy.epsilon_cache import CACHE_ENV, CALIBRATION_CACHE_ENV

    base = tmp_path_factory.getbasetemp()
    this_run = Path(os.environ[WORKFLOW_CALIBRATIONS_ENV])
    assert this_run.name == "workflow-calibrations" and this_run.parent in (base, base.parent)
    cache = getattr(request.config, "cache", None)
    kept = cache.mkdir("dpsad-compositions") if cache is not None else this_run.with_name("compositions")
    assert os.environ[CACHE_ENV] == os.environ[CALIBRATION_CACHE_ENV] == str(kept)
    seen = {}
    monkeypatch.setenv(E2E_ENV, "1")
    monkeypatch.setattr(workflow_helpers.subprocess, "run", lambda args, **kwargs: seen.update(kwargs["env"]))
    run_snakemake(tmp_path, ["-n"], {**os.environ})
    assert seen[CALIBRATION_CACHE_ENV] == str(this_run) and CACHE_ENV not in seen


def test_the_suites_threads_wait_without_spinning_and_numpys_blas_runs_one_thread_a_process():
    """tests/conftest.py: more processes than cores, so no waiting thread may spin: OpenMP's wait is passive (faiss's
    OpenBLAS is built on OpenMP and follows it), and numpy's and scipy's OpenBLAS, on threads of their own, run one
    thread in each worker and in every process the tests start."""
    import numpy  # noqa: F401  (its OpenBLAS, loaded by now in any case)
    from threadpoolctl import threadpool_info

    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and os.environ["OPENBLAS_NUM_THREADS"] == "1"
    own_threads = [pool for pool in threadpool_info() if pool.get("threading_layer") == "pthreads"]
    assert own_threads and {pool["num_threads"] for pool in own_threads} == {1}, own_threads
