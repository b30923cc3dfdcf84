"""Stated epsilons remembered on disk, so that the jobs that check one do not recompute it.

The account, sample, release and release-budget jobs each compose the same ledger entries (a run's verdict,
then the checks that the stated epsilon is still the ledger's): PLD takes about a second each, plus half a
second to import dp-accounting.  :func:`composed_epsilon` is :func:`dpsad.privacy.accounting.compose_epsilon`
with a file per composition in the folder that ``DPSAD_EPSILON_MEMO`` names (the Snakefile sets it to
``.snakemake/dpsad-epsilons`` in the workflow's directory); without it nothing is remembered.  PLD compositions
go through :func:`dpsad.privacy.pld_reuse.pld_epsilon` (the same value, with the process's one-step PLDs reused).

Assumptions: compose_epsilon is a pure function of its arguments, the code of
:mod:`dpsad.privacy.accounting` and :mod:`dpsad.privacy.pld_reuse` and the versions of the accountants'
libraries, which are all in the key.  A file whose key is not the composition asked for, whose checksum of key
and value does not match (edited as a ledger is, see ``entries_sha256``), or that cannot be read, is composed
again and rewritten; failures (AccountantError) are never remembered.  The noise calibration does not go
through here: it stays inside the DP mechanism's own modules.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .accounting import PLD_DISCRETIZATION, SGMComponent, compose_epsilon
from .pld_reuse import pld_epsilon

MEMO_ENV = "DPSAD_EPSILON_MEMO"


@lru_cache(maxsize=1)
def _code_key() -> str:
    """What else the result depends on: the accounting modules' sources and the accountants' versions."""
    digest = hashlib.sha256()
    for module in ("accounting.py", "pld_reuse.py"):
        digest.update((Path(__file__).parent / module).read_bytes())
    for package in ("dp-accounting", "opacus"):
        try:
            digest.update(f"{package}=={metadata.version(package)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package} missing".encode())
    return digest.hexdigest()


def memo_key(components: list[SGMComponent], delta: float, accountant: str, pld_interval: float) -> dict:
    """The composition asked for, exactly (floats as repr: every bit of them counts)."""
    return {"code": _code_key(), "accountant": accountant, "delta": repr(float(delta)),
            "pld_interval": repr(float(pld_interval)),
            "components": [[repr(float(c.noise_multiplier)), repr(float(c.sample_rate)), int(c.steps)]
                           for c in components]}


def _checksum(key: dict, value: float) -> str:
    return hashlib.sha256(json.dumps([key, repr(value)], sort_keys=True).encode()).hexdigest()


def _remembered(path: Path, key: dict) -> float | None:
    try:
        stored = json.loads(path.read_text())
        value = float(stored["epsilon"])
        sound = stored["key"] == key and stored["sha256"] == _checksum(key, value)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if sound and math.isfinite(value) and value >= 0 else None


def _remember(path: Path, key: dict, value: float) -> None:
    """Write atomically under a name of its own: two jobs may remember the same composition at once."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump({"key": key, "epsilon": value, "sha256": _checksum(key, value)}, handle)
        os.replace(tmp, path)
    except OSError:  # a memo that cannot be written costs a recomputation next time, nothing else
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def _compose(components: list[SGMComponent], delta: float, accountant: str, pld_interval: float) -> float:
    if accountant == "pld":  # the same value, with this process's one-step PLDs reused (dpsad.privacy.pld_reuse)
        return pld_epsilon(components, delta, pld_interval)
    return compose_epsilon(components, delta, accountant, pld_interval=pld_interval)


def composed_epsilon(components: list[SGMComponent], delta: float, accountant: str,
                     pld_interval: float = PLD_DISCRETIZATION) -> float:
    """compose_epsilon(components, delta, accountant, pld_interval), remembered where ``DPSAD_EPSILON_MEMO`` says."""
    folder = os.environ.get(MEMO_ENV)
    if not folder or not components:  # nothing to compose: nothing to remember
        return _compose(components, delta, accountant, pld_interval)
    key = memo_key(components, delta, accountant, pld_interval)
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = Path(folder) / name[:2] / f"{name}.json"
    value = _remembered(path, key)
    if value is None:
        value = _compose(components, delta, accountant, pld_interval)
        if math.isfinite(value):
            _remember(path, key, value)
    return value
