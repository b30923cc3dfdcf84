"""Shared fixtures: tiny files of every supported source format, made on the fly."""

from __future__ import annotations

import atexit
import gc
import gzip
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# The suite runs more processes than this machine has cores (its workers, their jobs), and a thread that waits for
# work spins.  OpenMP's (torch's): two copies of a two-thread stage run at once took 32.2 s, one alone 10.8 s, and
# 11.8 s for both with a passive wait.  OpenBLAS's (numpy's, read when numpy is first imported, below): the whole
# suite's user CPU time is 960 s with one BLAS thread a process, 1,010 s with two.  Every process the tests
# start inherits both: jobs, SLURM's jobs, the benchmarks (tests/test_suite_split.py checks them).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["OPENBLAS_NUM_THREADS"] = "1"

# Where PYTHONDONTWRITEBYTECODE is set, each worker of each run would rewrite every test module's assertions again
# (about 3 s of a worker's start) and compile the package's modules again: the suite keeps its own tree's bytecode,
# as `make test` does with compileall.  The processes the tests start read it.
sys.dont_write_bytecode = False

import h5py
import numpy as np
import pytest
from PIL import Image
from workflow_helpers import E2E_ENV, WORKFLOW_CALIBRATIONS_ENV

from dpsad.privacy.books.curator_record import LEAVE_OUT_BUNDLED_ENV, TEST_HOME_ENV

pytest_plugins = ["cpu_durations"]  # --cpu-durations N: the tests that cost the most CPU, their processes included

ROOT = Path(__file__).resolve().parents[1]
E2E_FIXTURES = ("tiny_run", "prepared", "distributed_runs", "cluster")

# The curator's record lives under the home folder the user database names, which no environment variable moves
# but the suite's own stand-in (TEST_HOME_ENV): the suite's processes get a home of their own, removed at the end,
# so that no test reads or writes the user's record.  Each workflow test's workspace gets a home of its own on top
# (workflow_helpers.record_env).
_TEST_HOME = tempfile.mkdtemp(prefix="dpsad-test-home-")
atexit.register(shutil.rmtree, _TEST_HOME, ignore_errors=True)
os.environ[TEST_HOME_ENV] = _TEST_HOME
# An earlier version's register, where $HOME or $XDG_STATE_HOME put it, is read as witnesses: the user's own must not be.
os.environ["HOME"] = _TEST_HOME
os.environ.pop("XDG_STATE_HOME", None)
# The tiny runs release with a guarantee from the bundled MNIST-5k digits beside a stand-in use of known cost
# (tests/data/tiny.yaml): the package's own use of those digits (dpsad.data.bundled_uses) is left out, and every
# statement says so; tests/test_bundled_uses.py checks it with that use in.
os.environ[LEAVE_OUT_BUNDLED_ENV] = "1"
# ... while the caches stay shared: matplotlib's font list, built in a new HOME, took seconds in every job
_CACHES = os.path.join(tempfile.gettempdir(), "dpsad-test-caches")
os.environ["MPLCONFIGDIR"] = os.path.join(_CACHES, "matplotlib")
os.environ["XDG_CACHE_HOME"] = _CACHES


# Tests run in pytest-xdist workers (pyproject's addopts: -n, --dist loadgroup, in the order collected).  The tiny
# end-to-end run is built once for all workers (``tiny_run``), and the tests that read it run on any worker: none
# writes in it (those that run Snakemake there make dry runs without locks, test_workflow.dry_run_in_place).  Tests
# that share an expensive fixture form one group, which runs on one worker, so the fixture is built once: the
# prepared workspace, the distributed launches, and each module's copies of the tiny run.
FIXTURE_GROUPS = {"prepared": "prepared", "distributed_runs": "distributed"}


def _fixtures(item) -> tuple[str, ...]:
    return tuple(getattr(item, "fixturenames", ()))


def _copies_the_tiny_run(item) -> bool:
    """Whether a fixture of the test, other than ``tiny_run`` itself, is built from the tiny run."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(name != "tiny_run" and "tiny_run" in defs[-1].argnames for name, defs in definitions.items())


def pytest_collection_finish():
    """Once the test modules and torch are imported, their objects leave the cyclic collector's scans: each of its
    full runs traced them all again (5% of the CPU of three unit-test files, 45.3 s against 43.1 s).  A module's
    object is then never finalised, as in a job (dpsad.jobs.stage.resume_the_collector); the suite's own
    clean-up runs from exit handlers and fixtures, not finalisers."""
    import torch  # noqa: F401  here, not at the top: xdist's controller runs no test

    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Group the tests of each shared fixture, and order them so that the longest chains start first.

    xdist hands out the groups and single tests in this order (``--no-loadscope-reorder``).  The real SLURM test
    comes first: it builds the tiny run, then mostly waits on the scheduler while the other workers' tests run.
    Then the other end-to-end tests, then the tests that read the tiny run (built by then), then the unit tests,
    short ones that even out the workers' ends.  A test built on a workflow run (:data:`E2E_FIXTURES`) is marked
    e2e.  One group for every reader of the tiny run would make that group the suite's longest chain.

    ``tests/slurm/cluster.sh stop`` removes the SLURM config when the test ends: with the config written and
    the daemons down, every Snakemake start would wait about 9 s for the SLURM plugin's probe."""

    def position(item) -> int:
        if "cluster" in _fixtures(item):
            return 0
        if "tiny_run" in _fixtures(item):
            return 2
        return 1 if item.get_closest_marker("e2e") else 3

    for item in items:
        if any(name in _fixtures(item) for name in E2E_FIXTURES):
            item.add_marker(pytest.mark.e2e)
        group = next((g for f, g in FIXTURE_GROUPS.items() if f in _fixtures(item)), None)
        if group is None and _copies_the_tiny_run(item):
            group = f"tiny_run:{item.path.name}"
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=position)


@pytest.fixture(scope="session", autouse=True)
def _one_cache_of_compositions(request, tmp_path_factory, worker_id):
    """The unit tests keep each composition once (the product's own cache, :mod:`dpsad.privacy.epsilon_cache`, for
    the verdicts and the calibrations): their plans, calibrations and budgets ask for the same ones again, within a
    run and from one run to the next.  The folder is pytest's cache (``.pytest_cache``, emptied by
    ``--cache-clear``), else this run's; a composition is kept under its key, which holds the accounting code and the
    accountants' versions, so a changed accountant composes afresh.  A test that replaced part of the accountant
    would leave its compositions there for later runs too: none may (``--cache-clear`` removes them).  The
    workflows the tests run share a calibration cache of this run beside it, and compose their verdicts as a user's
    run does, with the workspace's own cache (workflow_helpers.run_snakemake)."""
    from dpsad.privacy.epsilon_cache import CACHE_ENV, CALIBRATION_CACHE_ENV

    base = tmp_path_factory.getbasetemp()
    this_run = base.parent if worker_id != "master" else base  # every worker's
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    folder = cache.mkdir("dpsad-compositions") if cache is not None else this_run / "compositions"
    os.environ[CACHE_ENV] = os.environ[CALIBRATION_CACHE_ENV] = str(folder)
    os.environ[WORKFLOW_CALIBRATIONS_ENV] = str(this_run / "workflow-calibrations")
    yield
    for variable in (CACHE_ENV, CALIBRATION_CACHE_ENV, WORKFLOW_CALIBRATIONS_ENV):
        os.environ.pop(variable, None)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures, session-wide ones such as tiny_run included
def pytest_runtest_setup(item):
    """A test that runs the workflow (workflow_helpers.run_snakemake), or a fixture of it that does, carries the e2e
    marker: the unit tests stay fast and ``pytest -m "not e2e"`` selects them all."""
    if item.get_closest_marker("e2e"):
        os.environ[E2E_ENV] = "1"
    else:
        os.environ.pop(E2E_ENV, None)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    os.environ.pop(E2E_ENV, None)


@pytest.fixture(autouse=True)
def _own_user_folders(monkeypatch, tmp_path_factory):
    """Each test's curator's record (under the stand-in for the user's home, $HOME too) is its own."""
    home = str(tmp_path_factory.mktemp("home"))
    monkeypatch.setenv(TEST_HOME_ENV, home)
    monkeypatch.setenv("HOME", home)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_python(request, monkeypatch):
    """`pytest` alone, the unit tests, stays a loop of a minute or two: a test that starts a Python process (a job,
    a script, Snakemake: a second or more of imports each) is marked e2e and runs with `make test`."""
    if request.node.get_closest_marker("e2e"):
        return
    start = subprocess.Popen.__init__

    def refuse_python(self, args, *rest, **kwargs):
        program = str(kwargs.get("executable") or (args if isinstance(args, (str, os.PathLike)) else args[0]))
        if Path(program.split()[0]).name.startswith("python"):
            raise AssertionError(f"a unit test started a Python process ({program!r}): mark the test e2e")
        start(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_python)


@pytest.fixture(autouse=True)
def _few_threads():
    import torch  # here, not at the top: xdist's controller runs no test and starts its workers after loading this

    torch.set_num_threads(1)


@pytest.fixture
def log():
    return logging.getLogger("dpsad-test")


def indexed_images(n: int, size: int = 28, channels: int = 1, seed: int = 0) -> np.ndarray:
    """Distinct uint8 images whose first two pixels encode the index (so splits can be traced)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, size, size, channels), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(n) % 256
    images[:, 0, 1, 0] = np.arange(n) // 256
    return images


def image_ids(images: np.ndarray) -> set[int]:
    return set((images[:, 0, 0, 0].astype(int) + 256 * images[:, 0, 1, 0].astype(int)).tolist())


def write_idx_images(path: Path, images: np.ndarray, compress: bool = False) -> None:
    n, h, w = images.shape
    payload = struct.pack(">IIII", 0x00000803, n, h, w) + images.astype(np.uint8).tobytes()
    opener = gzip.open if compress else open
    with opener(str(path) + (".gz" if compress else ""), "wb") as handle:
        handle.write(payload)


def write_idx_labels(path: Path, labels: np.ndarray, compress: bool = False) -> None:
    payload = struct.pack(">II", 0x00000801, len(labels)) + labels.astype(np.uint8).tobytes()
    opener = gzip.open if compress else open
    with opener(str(path) + (".gz" if compress else ""), "wb") as handle:
        handle.write(payload)


@pytest.fixture
def mnist_root(tmp_path) -> Path:
    """A torchvision-style MNIST folder with 60 train and 20 test images in IDX format."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    train = indexed_images(60)[..., 0]
    test = indexed_images(20, seed=1)[..., 0]
    write_idx_images(raw / "train-images-idx3-ubyte", train)
    write_idx_labels(raw / "train-labels-idx1-ubyte", np.arange(60) % 10)
    write_idx_images(raw / "t10k-images-idx3-ubyte", test)
    write_idx_labels(raw / "t10k-labels-idx1-ubyte", np.arange(20) % 10)
    return tmp_path


@pytest.fixture
def celeba_root(tmp_path) -> Path:
    """A CelebA-like folder: 12 JPEGs, an attribute file and the partition file.

    Hair attributes: rows cycle through black, blond, brown, none, black+brown.
    """
    base = tmp_path / "celeba"
    (base / "img_align_celeba").mkdir(parents=True)
    names = [f"{i:06d}.jpg" for i in range(1, 13)]
    attrs = ["Black_Hair", "Blond_Hair", "Brown_Hair", "Male", "Smiling"]
    patterns = [(1, -1, -1), (-1, 1, -1), (-1, -1, 1), (-1, -1, -1), (1, -1, 1)]
    lines = [str(len(names)), " ".join(attrs)]
    rng = np.random.default_rng(0)
    for i, name in enumerate(names):
        Image.fromarray(rng.integers(0, 256, size=(218, 178, 3), dtype=np.uint8)).save(base / "img_align_celeba" / name)
        hair = patterns[i % len(patterns)]
        male = 1 if i % 2 else -1
        lines.append(name + " " + " ".join(str(v) for v in (*hair, male, -1)))
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    partition = [f"{name} {0 if i < 9 else 2}" for i, name in enumerate(names)]
    (base / "list_eval_partition.txt").write_text("\n".join(partition) + "\n")
    return tmp_path


@pytest.fixture
def npz_file(tmp_path) -> Path:
    path = tmp_path / "data.npz"
    np.savez(path, images=indexed_images(200), labels=np.arange(200) % 4)
    return path


@pytest.fixture
def hdf5_file(tmp_path) -> Path:
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as handle:
        handle["images"] = indexed_images(100, size=32, channels=3)
        handle["labels"] = np.arange(100) % 2
    return path


@pytest.fixture
def imagefolder_root(tmp_path) -> Path:
    root = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, size=(20, 20, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
    return root


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, worker_id):
    """The whole default DAG on tiny settings (tests/data/tiny.yaml), run once for every test that reads it, on
    any worker: the first to need it builds it under a lock, the others wait for it.  Read-only: a test that
    runs the workflow on it works on a copy."""
    import fcntl

    from workflow_helpers import snakemake, workdir

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base  # this test run's, every worker's
    cwd, built = shared / "tiny-run", shared / "tiny-run.built"
    with open(shared / "tiny-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            if cwd.exists():
                shutil.rmtree(cwd)  # a build that failed on another worker
            cwd.mkdir()
            snakemake(workdir(cwd), "--cores", "2", "--configfile", "config/config.yaml", "tests/data/tiny.yaml", "all")
            built.touch()
    return cwd
