"""Where the curator's record has been seen, so that it cannot silently go back or fork.

Every use of the record (:mod:`dpsad.privacy.curator_record`) leaves its head (history, sequence number of the
last row, that row's digest, location) in three kinds of witness:

- the workspace's marker ``.dpsad/curator.json``;
- every ``BUDGET.json`` it writes (key ``curator_record``; each release folder's ``privacy.json`` copies it);
- the machine's witness ``$XDG_STATE_HOME/dpsad/curator-heads.json`` (by default ``~/.local/state/dpsad``):
  per history, the furthest head this machine has seen, and where.

Before the record is read, :func:`check_witnesses` compares them with it.  Refused, each with one line that
says what happened and how to recover:

- *behind*: a witness of the same history names a row the record does not have (a restored backup, a copy
  taken before later releases);
- *forked*: a witness names a row the record has with another digest (two copies of one history used apart);
- *another history*: the workspace's releases were recorded in another record (``curator_dir`` changed,
  another machine), unless config ``curator_new_history`` says the records are new to this one;
- *replaced*: this machine saw another history at this very location (the database was deleted or swapped),
  unless ``curator_new_history``.

A database that lost releases is recovered by restoring the newer copy, or by declaring what it held
(``python -m dpsad.curator declare-lost``): the declaration counts against every later budget and names the
heads it stands for, which then pass.  What no witness saw cannot be detected (a backup restored over the
database and every workspace and state folder that used it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DpsadError, PrivacyError
from ..files.atomic import atomic_path
from .curator_record import CuratorRecord, Head, now_utc, shown

MARKER = Path(".dpsad") / "curator.json"
MACHINE_FILE = "curator-heads.json"
NEW_HISTORY_KEY = "curator_new_history"
DECLARE_LOST = ("python -m dpsad.curator declare-lost --data results/<dataset>/data.h5 --epsilon E --delta D "
                "--description '...'")


@dataclass(frozen=True)
class Witness:
    """A head of the curator's record as some file saw it."""

    where: str  # the file that names it
    history: str
    sequence: int
    digest: str
    location: str
    machine: bool = False  # the machine's witness, not one of the workspace's files


def machine_witness_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "dpsad" / MACHINE_FILE


def _witness(data: dict, where: str, machine: bool = False) -> Witness:
    try:
        return Witness(where, str(data["history"]), int(data["sequence"]), str(data["head"]), str(data["location"]),
                       machine)
    except (KeyError, TypeError, ValueError) as err:
        raise DpsadError(f"{where}: names no readable head of a curator's record ({err!r} missing or wrong), expected "
                         "history, sequence, head and location as dpsad writes them") from err


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DpsadError(f"{path}: not readable JSON ({err}), expected the file dpsad wrote") from err


def workspace_witnesses(workspace) -> list[Witness]:
    """The heads a workspace's files name: its marker and every ``release/<dataset>/BUDGET.json``
    (files written before the record was a database name none, and are passed over)."""
    workspace = Path(workspace)
    found = []
    marker = workspace / MARKER
    if marker.is_file():
        data = _read_json(marker)
        if isinstance(data, dict) and "history" in data:
            found.append(_witness(data, str(marker)))
    for budget in sorted(workspace.glob("release/*/BUDGET.json")):
        data = _read_json(budget)
        if isinstance(data, dict) and isinstance(data.get("curator_record"), dict):
            found.append(_witness(data["curator_record"], str(budget)))
    return found


def machine_witnesses(path: Path | None = None) -> list[Witness]:
    path = path or machine_witness_path()
    if not path.is_file():
        return []
    data = _read_json(path)
    if not isinstance(data, dict):
        raise DpsadError(f"{path}: not the machine's record of curator heads, expected a JSON object")
    return [_witness({**head, "history": history}, str(path), machine=True) for history, head in data.items()]


def problems(curator: CuratorRecord, witnesses: list[Witness], *, new_history: bool) -> list[tuple[Witness, str]]:
    """(witness, one line) for every witness the record disagrees with (see the module docstring)."""
    head = curator.head()
    acknowledged = curator.acknowledged()
    here = shown(curator.path)
    found = []
    for w in witnesses:
        if w.history != head.history:
            if new_history:
                continue
            if not w.machine:
                found.append((w, f"this workspace's releases were recorded in another curator's record (history "
                                 f"{w.history[:12]} at {shown(w.location)}, as {w.where} says), not in {here} (history "
                                 f"{head.history[:12]}): point curator_dir or DPSAD_CURATOR_DIR at that record, or set "
                                 f"{NEW_HISTORY_KEY}: true if these records were never released through it"))
            elif Path(w.location) == curator.path:
                found.append((w, f"the curator's record {here} is not the one this machine used there (history "
                                 f"{w.history[:12]} up to release sequence {w.sequence}, now history {head.history[:12]}, "
                                 f"as {w.where} says): it was deleted or replaced; put that database back, or set "
                                 f"{NEW_HISTORY_KEY}: true to start a new history on purpose"))
            continue
        if (w.sequence, w.digest) in acknowledged:
            continue
        mine = curator.digest_at(w.sequence) if w.sequence else head.digest
        if w.sequence > head.sequence:
            found.append((w, f"the curator's record {here} ends at release sequence {head.sequence}, but {w.where} names "
                             f"sequence {w.sequence} of the same history: the record was restored from an older backup "
                             "or copied before later releases; restore the newer database, or if it is lost declare "
                             f"what it held: {DECLARE_LOST}"))
        elif w.sequence and mine != w.digest:
            found.append((w, f"row {w.sequence} of the curator's record {here} is not the one {w.where} saw (head "
                             f"{w.digest[:12]}, the record has {mine[:12]}): two copies of this history were used apart; "
                             f"use the copy that holds every release, or declare what the other held: {DECLARE_LOST}"))
    return found


def check_witnesses(curator: CuratorRecord, workspace=None, *, new_history: bool = False) -> None:
    """Refuse a record that a witness of ``workspace`` or of this machine shows to have gone back, forked or
    been replaced (call inside ``curator.transaction()``)."""
    witnesses = (workspace_witnesses(workspace) if workspace is not None else []) + machine_witnesses()
    found = problems(curator, witnesses, new_history=new_history)
    if found:
        raise PrivacyError(found[0][1])


def lost_heads(curator: CuratorRecord, workspace=None) -> list[tuple[int, str]]:
    """The (sequence, head) pairs that witnesses of ``workspace`` and this machine name and the record lacks or
    holds otherwise: what a declaration of lost releases stands for."""
    witnesses = (workspace_witnesses(workspace) if workspace is not None else []) + machine_witnesses()
    history = curator.head().history
    return sorted({(w.sequence, w.digest) for w, _ in problems(curator, witnesses, new_history=True)
                   if w.history == history})


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def remember(head: Head, workspace=None, *, new_history: bool = False) -> None:
    """Leave ``head`` in the workspace's marker and the machine's witness (the furthest head of each history);
    with ``new_history``, forget the other histories this machine saw at the same location."""
    entry = {**head.as_dict(), "recorded_utc": now_utc()}
    if workspace is not None:
        marker = Path(workspace) / MARKER
        marker.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(marker) as tmp:
            Path(tmp).write_text(json.dumps(entry, indent=1))
    path = machine_witness_path()
    with _locked(path):
        known = _read_json(path) if path.is_file() else {}
        if new_history:
            known = {h: e for h, e in known.items() if h == head.history or e.get("location") != head.location}
        before = known.get(head.history)
        if before is None or int(before.get("sequence", 0)) <= head.sequence:
            known[head.history] = {k: v for k, v in entry.items() if k != "history"}
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(known, indent=1, sort_keys=True))
