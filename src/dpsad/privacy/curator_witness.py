"""Where curators' records have been seen: so that none can silently go back, fork or be left out.

Every use of a record (:mod:`dpsad.privacy.curator_record`) leaves its head (history, sequence number of the
last row, that row's digest, location) in three kinds of witness:

- the workspace's marker ``.dpsad/curator.json``;
- every ``BUDGET.json`` it writes (key ``curator_record``; each release folder's ``privacy.json`` copies it);
- this machine's register of records, ``$XDG_STATE_HOME/dpsad/curator-heads.json`` (by default
  ``~/.local/state/dpsad``): for each history this user has used here, where it is, the furthest head seen,
  and one line per row written from here (sequence, digest, dataset, fingerprint of the private records, and
  the total the budget stated after it).  Curator-only: it names record sets by fingerprint.

Before a budget is composed, :func:`consult` compares them with the records:

- the record in use: a witness of its history that names a row it lacks (*behind*: a restored backup, a copy
  taken before later releases) or holds otherwise (*forked*: two copies used apart) is refused;
- every other history a witness names: its record is opened read-only where it was last seen, checked the same
  way, and its releases and declared uses are composed with the one in use.  Another folder, a fresh database
  or a forgotten ``DPSAD_CURATOR_DIR`` is therefore no way to start a budget from zero on this machine.  A
  record that cannot be read where it was seen (deleted, replaced, moved) is refused.

The way back is the newer database put back (a moved one: used once from its new folder), or, when it is lost,
its rows declared with what they spent (``python -m dpsad.curator declare-lost``, :func:`lost_rows`): the
declaration counts against every later budget of those records and names the heads it stands for, which then
pass.  What no witness saw cannot be detected: a record restored over the database and over every workspace and
state folder that used it, or another user's releases from another machine (each user's register is their own).
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
from .release_budget import stated_total

MARKER = Path(".dpsad") / "curator.json"
MACHINE_FILE = "curator-heads.json"
DECLARE_LOST = "python -m dpsad.curator declare-lost --data results/<dataset>/data.h5 --description '...'"


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


@dataclass(frozen=True)
class LostRow:
    """A row that a witness saw and no readable record holds: whose records, and the total stated after it."""

    history: str
    sequence: int
    digest: str
    dataset: str | None
    private_records: str | None  # the fingerprint of its private record set, where the register kept it
    total: tuple[float, float] | None


def machine_witness_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "dpsad" / MACHINE_FILE


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


def workspace_witnesses(workspace) -> list[Witness]:
    """The heads a workspace's files name: its marker and every ``release/<dataset>/BUDGET.json`` (files written
    before the record was a database name none, and are passed over)."""
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
    return [_witness({**entry, "history": history}, str(path)) for history, entry in machine_register(path).items()]


def _disagreement(record: CuratorRecord, w: Witness, acknowledged) -> str | None:
    """Why ``record`` (of ``w``'s history) is not what ``w`` saw, or None."""
    if (w.history, w.sequence, w.digest) in acknowledged:
        return None
    here, head = shown(record.path), record.head()
    if w.sequence > head.sequence:
        return (f"the curator's record {here} ends at release sequence {head.sequence}, but {w.where} names sequence "
                f"{w.sequence} of the same history: the record was restored from an older backup or copied before "
                f"later releases; put the newer database back, or if it is lost declare what it held: {DECLARE_LOST}")
    mine = record.digest_at(w.sequence) if w.sequence else head.digest
    if w.sequence and mine != w.digest:
        return (f"row {w.sequence} of the curator's record {here} is not the one {w.where} saw (head {w.digest[:12]}, "
                f"the record has {mine[:12]}): two copies of this history were used apart; use the copy that holds "
                f"every release, or declare what the other held: {DECLARE_LOST}")
    return None


def _witnesses(workspace) -> list[Witness]:
    return (workspace_witnesses(workspace) if workspace is not None else []) + machine_witnesses()


def _open_other(history: str, seen: list[Witness], stack: contextlib.ExitStack):
    """The other history's record, opened read-only where it was seen furthest on, or (None, why)."""
    furthest = max(seen, key=lambda w: w.sequence)
    record = CuratorRecord(Path(furthest.location).parent)
    try:
        stack.enter_context(record.read_only())
    except DpsadError as err:
        return None, str(err)
    if record.head().history != history:
        return None, f"the database there now holds history {record.head().history[:12]}"
    return record, None


def consult(curator: CuratorRecord, workspace, stack: contextlib.ExitStack,
            problems: list | None = None) -> list[CuratorRecord]:
    """Check ``curator`` (inside its transaction) against every witness of ``workspace`` and of this machine, and
    open every other history they name, read-only, in ``stack``; returns those records, whose releases count too.
    Raises PrivacyError with the first disagreement, unless ``problems`` is given: then each (witness, line) is
    appended to it instead (what a declaration of lost rows must stand for)."""
    found = []
    acknowledged = curator.acknowledged()
    current = curator.head().history
    by_history: dict[str, list[Witness]] = {}
    for w in _witnesses(workspace):
        by_history.setdefault(w.history, []).append(w)
    others = []
    for w in by_history.pop(current, []):
        if why := _disagreement(curator, w, acknowledged):
            found.append((w, why))
    for history, seen in sorted(by_history.items()):
        if all((w.history, w.sequence, w.digest) in acknowledged for w in seen):
            continue
        record, why = _open_other(history, seen, stack)
        if record is None:
            w = max(seen, key=lambda w: w.sequence)
            found.append((w, f"the curator's record of history {history[:12]} ({w.sequence} row(s), seen at "
                             f"{shown(w.location)} by {w.where}) cannot be read there ({why}): the releases made through "
                             "it count toward every budget of their records; put it back (a moved record: use it once "
                             f"from its new folder, or `python -m dpsad.curator show --curator-dir <folder>`), or "
                             f"declare what it held: {DECLARE_LOST}"))
            continue
        for w in seen:
            if why := _disagreement(record, w, acknowledged):
                found.append((w, why))
        others.append(record)
    if problems is not None:
        problems.extend(found)
    elif found:
        raise PrivacyError(found[0][1])
    return others


def lost_rows(curator: CuratorRecord, workspace) -> tuple[list[tuple[str, int, str]], list[LostRow]]:
    """What a declaration of lost rows must stand for: the (history, sequence, head) of every witness that
    :func:`consult` finds wanting, and every row behind them that no readable record holds (from this machine's
    register, and from the BUDGET.json files that name a lost head)."""
    problems: list = []
    with contextlib.ExitStack() as stack:
        readable = {record.head().history: record for record in consult(curator, workspace, stack, problems)}
        readable[curator.head().history] = curator
        heads = sorted({(w.history, w.sequence, w.digest) for w, _ in problems})
        acknowledged = curator.acknowledged()
        rows: list[LostRow] = []
        register = machine_register()
        for history in sorted({h for h, _, _ in heads}):
            record = readable.get(history)
            for sequence, digest, dataset, fingerprint, epsilon, delta in register.get(history, {}).get("rows", []):
                if (history, int(sequence), digest) not in acknowledged and (
                        record is None or record.digest_at(int(sequence)) != digest):
                    rows.append(LostRow(history, int(sequence), digest, dataset, fingerprint,
                                        (float(epsilon), float(delta))))
        for w, _ in problems:
            if w.dataset is not None:
                rows.append(LostRow(w.history, w.sequence, w.digest, w.dataset, None, w.total))
    return heads, rows


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def remember(head: Head, workspace=None, written: list[list] = ()) -> None:
    """Leave ``head`` in the workspace's marker and in this machine's register, with the rows ``written`` from
    here ([sequence, digest, dataset, private fingerprint, epsilon, delta] each)."""
    entry = {**head.as_dict(), "location": str(Path(head.location).resolve()), "recorded_utc": now_utc()}
    if workspace is not None:
        marker = Path(workspace) / MARKER
        marker.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(marker) as tmp:
            Path(tmp).write_text(json.dumps(entry, indent=1))
    path = machine_witness_path()
    with _locked(path):
        known = machine_register(path)
        before = known.get(head.history, {})
        rows = {int(r[0]): r for r in before.get("rows", [])}
        rows.update({int(r[0]): list(r) for r in written})
        update = {k: v for k, v in entry.items() if k != "history"}
        if int(before.get("sequence", 0)) > head.sequence:  # a register ahead of this record keeps its head
            update.update({k: before[k] for k in ("sequence", "head", "location") if k in before})
        known[head.history] = {**update, "rows": [rows[k] for k in sorted(rows)]}
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(known, indent=1, sort_keys=True))
