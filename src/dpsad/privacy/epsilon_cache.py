"""Compositions kept on disk, so that the jobs that check a stated epsilon do not compose it again.

The account, sample, release and release-budget jobs each compose the same ledger entries (a run's verdict, then
the checks that the stated epsilon is still the ledger's): PLD takes about a second each, plus half a second to
import dp-accounting.  :class:`FileEpsilonCache` is an :class:`~dpsad.privacy.accounting.EpsilonCache` with a file
per composition in a folder; :func:`dpsad.privacy.accounting.cached_accountant` gives the verdict side's
accountant with the cache that ``DPSAD_EPSILON_CACHE`` names (the Snakefile sets it to ``.snakemake/dpsad-epsilons``
in the workflow's directory), or none.  The noise calibration composes afresh:
:func:`dpsad.privacy.accounting.calibration_accountant` reads a cache only where ``DPSAD_CALIBRATION_CACHE`` names
one, which the workflow never sets (the test suite does, so that its processes share their plans' compositions).
This module imports nothing of the package, so the accounting module can keep its accountants' caches here.

Assumptions: a composition is a pure function of its key, the code of :mod:`dpsad.privacy.accounting`, Python's
version and the versions of the accountants' libraries and their numerics (numpy, scipy), which are all in the
file's key.  A file whose key is not the composition
asked for, whose checksum of key and value does not match (edited as a ledger is, see ``entries_sha256``), or that
cannot be read, is composed again and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path

CACHE_ENV = "DPSAD_EPSILON_CACHE"
CALIBRATION_CACHE_ENV = "DPSAD_CALIBRATION_CACHE"


@lru_cache(maxsize=1)
def _code_key() -> str:
    """What else a composition depends on: the accounting module's source and the accountants' versions."""
    digest = hashlib.sha256((Path(__file__).parent / "accounting.py").read_bytes())
    digest.update(sys.version.encode())
    for package in ("dp-accounting", "opacus", "numpy", "scipy"):
        try:
            digest.update(f"{package}=={metadata.version(package)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package} missing".encode())
    return digest.hexdigest()


def _checksum(key: dict, value: float) -> str:
    return hashlib.sha256(json.dumps([key, repr(value)], sort_keys=True).encode()).hexdigest()


class FileEpsilonCache:
    """One JSON file per composition under ``folder``, written atomically (two jobs may write the same one).
    ``code``: what else the compositions depend on (default: the accounting code and libraries of this process)."""

    def __init__(self, folder: str | os.PathLike, code: str | None = None):
        self.folder = Path(folder)
        self.code = code or _code_key()

    def _path(self, key: dict) -> Path:
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return self.folder / name[:2] / f"{name}.json"

    def get(self, key: dict) -> float | None:
        key = {**key, "code": self.code}
        try:
            stored = json.loads(self._path(key).read_text())
            value = float(stored["epsilon"])
            sound = stored["key"] == key and stored["sha256"] == _checksum(key, value)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return value if sound and math.isfinite(value) and value >= 0 else None

    def put(self, key: dict, value: float) -> None:
        key = {**key, "code": self.code}
        path, tmp = self._path(key), None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w") as handle:
                json.dump({"key": key, "epsilon": value, "sha256": _checksum(key, value)}, handle)
            os.replace(tmp, path)
        except OSError:  # a composition that cannot be kept costs a recomputation next time, nothing else
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)


def cache_named_by(variable: str) -> FileEpsilonCache | None:
    """The cache in the folder the environment variable ``variable`` names, or None where it names none."""
    folder = os.environ.get(variable)
    return FileEpsilonCache(folder) if folder else None
