"""Where curators' records have been seen: so that none can silently go back, fork or be left out.

Every use of a record (:mod:`dpsad.privacy.books.curator_record`) leaves its head (history, sequence number of the
last row, that row's digest, location) in three kinds of witness:

- the workspace's marker ``.dpsad/curator.json``, with one line per row written from that workspace;
- every ``BUDGET.json`` it writes (key ``curator_record``; each release folder's ``privacy.json`` copies it);
- this user's register of records on this machine, ``$XDG_STATE_HOME/dpsad/curator-heads.json`` (by default
  ``~/.local/state/dpsad``): every history used here, where it is, the furthest head seen, and one line per row
  written from here.

A row's line holds its sequence, digest, dataset, the fingerprint of its private records and the total the
budget stated after it; marker and register are the curator's (they name record sets by fingerprint).

Before a budget is composed, :func:`consult` compares them with the records, each held locked:

- a record that is not empty and that this machine's register does not know (its state folder lost, another
  machine, another user) is refused until the curator says it holds every release (``python -m dpsad.curator
  adopt``): nothing else would notice that it went back;
- a witness of the record in use, or of another readable record, that names a row the record lacks (*behind*:
  a restored backup, a copy taken before later releases) or holds otherwise (*forked*) is refused;
- every other history a witness names is opened where it was last seen and its releases and declared uses are
  composed with the one in use: another folder, a fresh database or a forgotten ``DPSAD_CURATOR_DIR`` is no way
  to start a budget from zero.  One that cannot be read there (deleted, replaced, moved) is refused, unless no
  witness saw it hold a row.

The way back is the newer database put back (a moved one: used once from its new folder), or, when it is lost,
what it held declared (``python -m dpsad.curator declare-lost``, :func:`lost_rows`): the declaration counts
against every later budget of those records and names the rows it covers and the heads it answers.  A witness
passes only when its head is answered and every row this machine knows of, up to it, is held or covered.
What no witness saw cannot be detected: a record restored over the database, the workspaces and the state
folder that used it, or another user's releases from another machine (each user's register is their own).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import DpsadError, PrivacyError
from ...files.atomic import atomic_path
from .curator_record import FILE, CuratorRecord, Head, RecordUnreadable, now_utc, shown, user_data_folder
from .release_budget import stated_total

MARKER = Path(".dpsad") / "curator.json"
MACHINE_FILE = "curator-heads.json"
DECLARE_LOST = "python -m dpsad.curator declare-lost --data results/<dataset>/data.h5 --description '...'"
Key = tuple[str, int, str]  # (history, sequence, digest)


@dataclass(frozen=True)
class Witness:
    """A head of a curator's record as some file saw it; a BUDGET.json also says whose records and what total."""

    where: str  # the file that names it
    history: str
    sequence: int
    digest: str
    location: str
    dataset: str | None = None
    total: tuple[float, float] | None = None  # (epsilon, delta) the BUDGET.json stated
    machine: bool = False

    @property
    def key(self) -> Key:
        return self.history, self.sequence, self.digest


@dataclass(frozen=True)
class KnownRow:
    """A row written from this workspace or machine, as its marker or register keeps it."""

    history: str
    sequence: int
    digest: str
    dataset: str | None
    private_records: str | None  # the fingerprint of its private record set
    total: tuple[float, float] | None

    @property
    def key(self) -> Key:
        return self.history, self.sequence, self.digest


def state_folder() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "dpsad"


def machine_witness_path() -> Path:
    return state_folder() / MACHINE_FILE


@contextlib.contextmanager
def release_lock():
    """Hold this user's release lock: releases through different records on this machine compose one at a time,
    so that none reads another's record before that one's rows are in."""
    with _locked(state_folder() / "release"):
        yield


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DpsadError(f"{path}: not readable JSON ({err}), expected the file dpsad wrote") from err


def _witness(data: dict, where: str, **extra) -> Witness:
    try:
        return Witness(where, str(data["history"]), int(data["sequence"]), str(data["head"]),
                       str(Path(str(data["location"])).expanduser()), **extra)
    except (KeyError, TypeError, ValueError) as err:
        raise DpsadError(f"{where}: names no readable head of a curator's record ({err!r} missing or wrong), expected "
                         "history, sequence, head and location as dpsad writes them") from err


def _known_rows(history: str, lines) -> list[KnownRow]:
    return [KnownRow(history, int(q), str(d), dataset, fingerprint, (float(e), float(delta)))
            for q, d, dataset, fingerprint, e, delta in lines or []]


def _marker(workspace) -> dict[str, dict]:
    """The workspace marker's entries by history (``{}`` without one, or for an older version's marker)."""
    marker = Path(workspace) / MARKER
    data = _read_json(marker) if marker.is_file() else None
    if not isinstance(data, dict):
        return {}
    if isinstance(data.get("histories"), dict):
        return data["histories"]
    return {data["history"]: data} if "history" in data else {}


def workspace_witnesses(workspace) -> list[Witness]:
    """The heads a workspace's files name: its marker (every record the workspace used) and every
    ``release/<dataset>/BUDGET.json`` (files written before the record was a database name none, and are passed
    over)."""
    workspace = Path(workspace)
    found = [_witness({**entry, "history": history}, str(workspace / MARKER))
             for history, entry in _marker(workspace).items()]
    for budget in sorted(workspace.glob("release/*/BUDGET.json")):
        data = _read_json(budget)
        if isinstance(data, dict) and isinstance(data.get("curator_record"), dict):
            try:
                total = stated_total(data)
            except (KeyError, TypeError, ValueError):
                total = None
            found.append(_witness(data["curator_record"], str(budget), dataset=data.get("dataset"), total=total))
    return found


def machine_register(path: Path | None = None) -> dict:
    path = path or machine_witness_path()
    data = _read_json(path) if path.is_file() else {}
    if not isinstance(data, dict):
        raise DpsadError(f"{path}: not this machine's register of curators' records, expected a JSON object")
    return data


def machine_witnesses() -> list[Witness]:
    path = machine_witness_path()
    return [_witness({**entry, "history": history}, str(path), machine=True)
            for history, entry in machine_register(path).items()]


def known_rows(workspace) -> list[KnownRow]:
    """Every row this machine's register and the workspace's marker keep a line of."""
    entries = list(machine_register().items()) + (list(_marker(workspace).items()) if workspace is not None else [])
    rows = [row for history, entry in entries for row in _known_rows(history, entry.get("rows"))]
    return list({row.key: row for row in rows}.values())


def _disagreement(record: CuratorRecord, w: Witness) -> str | None:
    """Why ``record`` (of ``w``'s history) is not what ``w`` saw, or None."""
    here, head = shown(record.path), record.head()
    if w.sequence > head.sequence:
        return (f"the curator's record {here} ends at release sequence {head.sequence}, but {w.where} names sequence "
                f"{w.sequence} of the same history: the record was restored from an older backup or copied before "
                f"later releases; put the newer database back, or if it is lost declare what it held: {DECLARE_LOST}")
    mine = record.digest_at(w.sequence) if w.sequence else head.digest
    if w.sequence and mine != w.digest:
        return (f"row {w.sequence} of the curator's record {here} is not the one {w.where} saw (head {w.digest[:12]}, "
                f"the record has {mine[:12]}): it was restored from a backup and has taken releases since, or two "
                f"copies of it were used apart; put back the copy that holds every release, or declare what the "
                f"other held: {DECLARE_LOST}")
    return None


def _witnesses(workspace) -> list[Witness]:
    return (workspace_witnesses(workspace) if workspace is not None else []) + machine_witnesses()


def _hold(folder: Path, stack: contextlib.ExitStack, held: dict[Path, str], wanted: set[str] | None = None):
    """The record in ``folder``, held locked in ``stack`` and noted in ``held`` (path -> history) when its history
    is one of ``wanted`` (None: any history not held yet); else (None, why).  A database is never opened twice.
    Raises RecordBusy: a record locked too long, or not writable here, is no lost record."""
    record = CuratorRecord(folder)
    path = record.path.resolve() if record.path.exists() else record.path
    if path in held:
        return None, f"the database there now holds history {held[path][:12]}"
    local = contextlib.ExitStack()
    try:
        local.enter_context(record.transaction(create=False))
    except RecordUnreadable as err:
        return None, str(err)
    history = record.head().history
    if (wanted is not None and history not in wanted) or (wanted is None and history in held.values()):
        local.close()
        return None, f"the database there now holds history {history[:12]}"
    stack.enter_context(local.pop_all())
    held[path] = history
    return record, None


def consult(curator: CuratorRecord, workspace, stack: contextlib.ExitStack, problems: list | None = None, *,
            was_empty: bool = False) -> list[CuratorRecord]:
    """Check ``curator`` (inside its transaction) against every witness of ``workspace`` and of this machine, and
    hold every other history they name, locked, in ``stack``; returns those records, whose releases count too.
    ``was_empty``: the record held no row when it was opened (a new one is no record that went back).
    Raises PrivacyError with the first disagreement, unless ``problems`` is given: then each (witness, line) is
    appended to it instead (what a declaration of lost rows must answer)."""
    found = []
    current = curator.head().history
    witnesses = _witnesses(workspace)
    by_history: dict[str, list[Witness]] = {}
    for w in witnesses:
        by_history.setdefault(w.history, []).append(w)
    registered = {w.history for w in witnesses if w.machine}
    if not was_empty and current not in registered:
        found.append((Witness("this machine's register", current, 0, "", str(curator.path), machine=True),
                      f"the curator's record {shown(curator.path)} holds {curator.head().sequence} row(s) but this "
                      f"machine's register ({machine_witness_path()}) does not know it: its state folder was lost, or "
                      "the record is used here for the first time, and nothing here can tell whether it went back; if "
                      "it holds every release, say so: python -m dpsad.curator adopt --curator-dir "
                      f"{shown(curator.folder)}"))
    readable = {current: curator}
    unreadable: dict[str, str] = {}
    held = {curator.path.resolve(): current}
    for history, seen in sorted(by_history.items()):
        if history == current:
            continue
        if all(w.sequence == 0 for w in seen):
            continue  # no witness saw it hold a row: nothing to lose with it
        furthest = max(seen, key=lambda w: (w.sequence, w.machine))  # held where it was seen furthest on
        record, why = _hold(Path(furthest.location).parent, stack, held, {history})
        if record is None:
            unreadable[history] = why
        else:
            readable[history] = record
    # the user's own record counts whatever is in use (one unreadable: a witness of its history refuses it below)
    if (user_data_folder() / FILE).is_file():
        record, _ = _hold(user_data_folder(), stack, held)
        if record is not None:
            readable[record.head().history] = record
    lost_rows, lost_heads = set(), set()
    for record in readable.values():
        rows, heads = record.acknowledged()
        lost_rows |= rows
        lost_heads |= heads
    rows_by_history: dict[str, list[KnownRow]] = {}
    for row in known_rows(workspace):
        rows_by_history.setdefault(row.history, []).append(row)

    def answered(w: Witness) -> bool:
        """The witness's head is answered by a declaration, and so is every row known up to it that no readable
        record holds."""
        if w.key not in lost_heads and w.key not in lost_rows:  # a covered row is a head its chain once had
            return False
        record = readable.get(w.history)
        return all(row.key in lost_rows for row in rows_by_history.get(w.history, [])
                   if row.sequence <= w.sequence and (record is None or record.digest_at(row.sequence) != row.digest))

    for history, seen in sorted(by_history.items()):
        for w in seen:
            if w.sequence == 0 or answered(w):
                continue
            if history in unreadable:
                why = (f"the curator's record of history {history[:12]} ({w.sequence} row(s), seen at "
                       f"{shown(w.location)} by {w.where}) cannot be read there ({unreadable[history]}): the releases "
                       "made through it count toward every budget of their records; put it back (a moved record: use "
                       "it once from its new folder), or declare what it held: " + DECLARE_LOST)
            elif history in readable:
                why = _disagreement(readable[history], w)
            else:
                continue
            if why:
                found.append((w, why))
    if problems is not None:
        problems.extend(found)
    elif found:
        raise PrivacyError(found[0][1])
    return [record for history, record in readable.items() if history != current]


def lost_rows(curator: CuratorRecord, workspace) -> tuple[list[Key], list[KnownRow], list[tuple[float, float]]]:
    """What a declaration of lost rows must answer: the heads of the witnesses :func:`consult` finds wanting, the
    rows behind them that the marker or the register kept a line of and no readable record holds, and the totals
    the BUDGET.json files among those witnesses stated (lower bounds of what was spent)."""
    problems: list = []
    with contextlib.ExitStack() as stack:
        readable = {record.head().history: record for record in consult(curator, workspace, stack, problems)}
        readable[curator.head().history] = curator
        covered = set().union(*(record.acknowledged()[0] for record in readable.values()))
        heads = sorted({w.key for w, _ in problems if w.sequence})
        furthest: dict[str, int] = {}
        for history, sequence, _ in heads:
            furthest[history] = max(furthest.get(history, 0), sequence)
        rows = [row for row in known_rows(workspace) if row.sequence <= furthest.get(row.history, 0)
                and row.key not in covered and (row.history not in readable
                                                or readable[row.history].digest_at(row.sequence) != row.digest)]
        totals = [w.total for w, _ in problems if w.total is not None]
    return heads, sorted(rows, key=lambda row: row.key), totals


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def remember(head: Head, workspace=None, written: list[list] = ()) -> None:
    """Leave ``head`` in the workspace's marker and in this machine's register, with the rows ``written`` from
    here ([sequence, digest, dataset, private fingerprint, epsilon, delta] each).  The record's location is always
    the one it was used at; a sequence further on than ``head`` (a record that went back, answered by a
    declaration) is kept.  The marker keeps every record the workspace used."""
    entry = {**head.as_dict(), "location": str(Path(head.location).resolve()), "recorded_utc": now_utc()}
    entry.pop("history")

    def merged(before: dict | None) -> dict:
        """``entry`` with the rows of ``before`` (the same history's earlier entry, or None) and ``written``."""
        rows = {int(r[0]): list(r) for r in (before or {}).get("rows", [])}
        rows.update({int(r[0]): list(r) for r in written})
        update = {**entry, "rows": [rows[k] for k in sorted(rows)]}
        if before and int(before.get("sequence", 0)) > head.sequence:
            update.update({k: before[k] for k in ("sequence", "head") if k in before})
        return update

    if workspace is not None:
        marker = Path(workspace) / MARKER
        histories = _marker(workspace)
        histories = {h: {k: v for k, v in e.items() if k != "history"} for h, e in histories.items()}
        histories[head.history] = merged(histories.get(head.history))
        marker.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(marker) as tmp:
            Path(tmp).write_text(json.dumps({"in_use": head.history, "histories": histories}, indent=1,
                                            sort_keys=True))
    path = machine_witness_path()
    with _locked(path):
        known = machine_register(path)
        known[head.history] = merged(known.get(head.history))
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(known, indent=1, sort_keys=True))
