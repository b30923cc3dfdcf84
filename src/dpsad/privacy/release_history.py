"""The curator's record of every release, keyed by the private records it was computed from.

It lives in the curator's folder (config ``curator_dir``, default ``curator/``), never in ``release/``:
the folder that is shared, and that may be deleted, holds no history.  Deleting the curator's folder
(and the workspace's ``.dpsad/curator.json``, which remembers it) is the one way to lose it, and every
budget then starts again from zero.

Layout::

    curator/released.jsonl            one row per released run, append-only:
        {recorded_utc, dataset, run, private_records, public_records, entries}
        (entries: the run's private ledger entries; none for a run that read no private record)
    curator/declared.jsonl            one row per declared earlier use of a private set, append-only:
        {recorded_utc, dataset, private_records, declared}
    curator/record_sets/<sha256>.npy  the record digests (uint8 N x 16) of every set a row names
    curator/ID                        this history's identity (random, kept when the folder is copied)
    curator/.lock                     held while a budget is composed and its rows are written

A declared earlier use (``data.<name>.earlier_use``) belongs to the records, not to the dataset's name:
every later budget over any of those records composes it, once however many datasets declared it.

A workspace remembers the history its releases were recorded in (:func:`check_workspace_history`):
pointing ``curator_dir`` at another folder is refused until the history is carried over (the folder
copied whole, ID included) or the configuration says the workspace starts a new one.

Assumptions: a record is one image (:mod:`dpsad.privacy.records`); add/remove adjacency of one record.
A record in several released private sets is protected only by the composition of every release
from any of them, so a budget composes every release whose private set shares a record with its
own, whatever the dataset was called.  A record released without noise (in a public split) has no
guarantee left: no set that holds it may be released as private, and no record released as
private may later be released as public data.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files.atomic import atomic_path
from .records import as_set, set_fingerprint
from ..errors import DpsadError, PrivacyError

LOG = "released.jsonl"
DECLARED = "declared.jsonl"
RECORD_SETS = "record_sets"
IDENTITY = "ID"
README = "README.txt"
README_TEXT = (
    "The curator's record of every dataset release built by dpsad, keyed by the private records themselves.\n"
    "Every later privacy budget reads it: deleting release/ does not reset a budget, deleting this folder does.\n"
    "It identifies the private records (one digest per image): keep it with the private data, never share it.\n"
)


@dataclass
class RecordSets:
    """The private and public record digests of one prepared dataset (uint8 N x 16 each)."""

    dataset: str
    private: np.ndarray
    public: np.ndarray
    private_fingerprint: str = field(init=False)
    public_fingerprint: str = field(init=False)

    def __post_init__(self):
        self.private_fingerprint = set_fingerprint(self.private)
        self.public_fingerprint = set_fingerprint(self.public)


class CuratorRecord:
    """The append-only release record under ``root`` (see the module docstring)."""

    def __init__(self, root):
        self.root = Path(root)
        self._sets: dict[str, set[bytes]] = {}

    def identity(self) -> str:
        """This history's identity, made when the folder is first used (call under :meth:`locked`)."""
        path = self.root / IDENTITY
        if not path.is_file():
            path.write_text(uuid.uuid4().hex + "\n")
        return path.read_text().strip()

    @contextlib.contextmanager
    def locked(self):
        """Hold the record's lock: budgets of datasets that share records are composed one at a time."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if not (self.root / README).exists():
                (self.root / README).write_text(README_TEXT)
            handle = open(self.root / ".lock", "a+")
        except NotADirectoryError as err:
            raise DpsadError(f"curator_dir '{self.root}' is not a folder, expected a folder for the release record") from err
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield self

    def rows(self) -> list[dict]:
        def check(row):
            row["private_records"], row["public_records"], row["run"], row["dataset"]
            if not isinstance(row["entries"], list):
                raise TypeError("'entries' is not a list")

        return _jsonl_rows(self.root / LOG, check, "a release record", "dataset, run, private_records, "
                                                                        "public_records and entries")

    def digests(self, fingerprint: str) -> set[bytes]:
        if fingerprint not in self._sets:
            path = self.root / RECORD_SETS / f"{fingerprint}.npy"
            try:
                self._sets[fingerprint] = as_set(np.load(path))
            except (OSError, ValueError) as err:
                raise DpsadError(f"{path}: the record set of an earlier release cannot be read ({err}), expected "
                                 "the file the release record names (restore it from a backup of the curator folder)") from err
        return self._sets[fingerprint]

    def _save_set(self, digests: np.ndarray) -> str:
        fingerprint = set_fingerprint(digests)
        path = self.root / RECORD_SETS / f"{fingerprint}.npy"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp:
                with open(tmp, "wb") as handle:
                    np.save(handle, np.asarray(digests, dtype=np.uint8))
        self._sets[fingerprint] = as_set(digests)
        return fingerprint

    def releases_sharing_records(self, records: RecordSets) -> list[dict]:
        """The rows whose private set shares at least one record with ``records.private``."""
        mine = as_set(records.private)
        return [row for row in self.rows()
                if row["private_records"] == records.private_fingerprint or self.digests(row["private_records"]) & mine]

    def conflicts(self, records: RecordSets) -> list[str]:
        """One line per earlier release that makes ``records`` unreleasable: a private record of ``records``
        was released without noise as public data, or a public record of ``records`` was released as private."""
        private, public = as_set(records.private), as_set(records.public)
        found = []
        for row in self.rows():
            leaked = len(self.digests(row["public_records"]) & private) if private else 0
            if leaked:
                found.append(f"{leaked} private record(s) of {records.dataset} were released without noise as public "
                             f"data of run '{row['run']}' of {row['dataset']} ({self.root / LOG}), expected a private split "
                             "disjoint from every public split released before (keep the split's seed and fractions)")
            if row["entries"] and public:
                exposed = len(self.digests(row["private_records"]) & public)
                if exposed:
                    found.append(f"{exposed} public record(s) of {records.dataset} were private records of the released "
                                 f"run '{row['run']}' of {row['dataset']} ({self.root / LOG}), expected a public split "
                                 "disjoint from every private split released before (keep the split's seed and fractions)")
        return found

    def _declared_rows(self) -> list[dict]:
        def check(row):
            row["private_records"], row["dataset"], row["declared"]["description"]

        return _jsonl_rows(self.root / DECLARED, check, "a declared earlier use",
                           "dataset, private_records and declared")

    def declare(self, records: RecordSets, declared: dict) -> None:
        """Keep ``declared`` (``{description, epsilon, delta}``) as a use of ``records.private``, once."""
        declared = _declaration(declared)
        for row in self._declared_rows():
            if (row["private_records"], row["dataset"], _declaration(row["declared"])) == (
                    records.private_fingerprint, records.dataset, declared):
                return
        self._save_set(records.private)
        row = {"recorded_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "dataset": records.dataset, "private_records": records.private_fingerprint, "declared": declared}
        with open(self.root / DECLARED, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()

    def declared_for(self, records: RecordSets) -> list[dict]:
        """Every earlier use declared for a set that shares a record with ``records.private``, each once
        (the same description, epsilon and delta is one use), with the dataset names that declared it."""
        mine = as_set(records.private)
        found: dict[str, dict] = {}
        for row in self._declared_rows():
            if row["private_records"] == records.private_fingerprint or self.digests(row["private_records"]) & mine:
                declared = _declaration(row["declared"])
                key = json.dumps(declared, sort_keys=True)
                found.setdefault(key, {**declared, "declared_by": []})
                if row["dataset"] not in found[key]["declared_by"]:
                    found[key]["declared_by"].append(row["dataset"])
        return list(found.values())

    def record(self, records: RecordSets, run: str, entries: list[dict]) -> bool:
        """Append a row for the release of ``run`` (its private ``entries``); False when the same row exists."""
        private_entries = [e for e in entries if e.get("private")]
        uids = sorted(e.get("uid") or "" for e in private_entries)
        for row in self.rows():
            if (row["private_records"], row["public_records"], row["run"], row["dataset"]) == (
                    records.private_fingerprint, records.public_fingerprint, run, records.dataset) and \
                    sorted(e.get("uid") or "" for e in row["entries"]) == uids:
                return False
        self._save_set(records.private)
        self._save_set(records.public)
        row = {"recorded_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "dataset": records.dataset, "run": run, "private_records": records.private_fingerprint,
               "public_records": records.public_fingerprint, "entries": private_entries}
        with open(self.root / LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
        return True


def _jsonl_rows(path: Path, check, what: str, keys: str) -> list[dict]:
    """The rows of an append-only JSON-lines file of the record (none when it is absent); ``check(row)``
    raises KeyError or TypeError for a row that is not ``what``."""
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            check(row)
        except (ValueError, KeyError, TypeError) as err:
            raise DpsadError(f"{path}: line {number} is not {what} ({err}), expected JSON with {keys}") from err
        rows.append(row)
    return rows


def _declaration(declared: dict) -> dict:
    """The identity of a declared use: its description and cost, nothing else."""
    return {"description": str(declared["description"]).strip(), "epsilon": declared.get("epsilon"),
            "delta": declared.get("delta")}


NEW_HISTORY_KEY = "curator_new_history"


def check_workspace_history(curator: CuratorRecord, marker, *, new_history: bool) -> None:
    """Refuse a curator folder other than the one this workspace's releases were recorded in.

    ``marker`` (a JSON file of the workspace, outside ``results/`` and ``release/``) names the history
    the workspace used, by the identity of its folder: a copy of the old folder carries it.  ``new_history``
    (config ``curator_new_history``) says the workspace's records were never released through the old one.
    Then (and on first use) the marker is written for the folder now in use.  Call under ``curator.locked()``.
    """
    marker = Path(marker)
    identity = curator.identity()
    if marker.is_file():
        try:
            before = json.loads(marker.read_text())
            old_identity, old_dir = before["curator_id"], before["curator_dir"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DpsadError(f"{marker}: not a readable record of this workspace's curator folder ({err}), expected "
                             "JSON with curator_id and curator_dir") from err
        if old_identity == identity:
            return
        if not new_history:
            raise PrivacyError(f"this workspace's releases were recorded in the curator folder '{old_dir}', but "
                               f"curator_dir is now '{curator.root.resolve()}', another history: copy the old folder "
                               f"over it whole (cp -a '{old_dir}/.' '{curator.root}/') to carry the history, or set "
                               f"{NEW_HISTORY_KEY}: true if this workspace's records were never released through it")
    marker.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(marker) as tmp:
        Path(tmp).write_text(json.dumps({"curator_id": identity, "curator_dir": str(curator.root.resolve()),
                                         "recorded_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}))


def refuse_conflicts(curator: CuratorRecord, records: RecordSets) -> None:
    """Raise PrivacyError with the first conflict :meth:`CuratorRecord.conflicts` finds."""
    found = curator.conflicts(records)
    if found:
        raise PrivacyError(found[0])
