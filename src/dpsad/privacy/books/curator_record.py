"""The curator's record: every release and every declared use of private records, one database per curator.

It lives outside any workspace, so that every workspace, clone and copy of one on the machine reads the same
history, and ``git clean``, a deleted ``release/`` or a second ``snakemake -d`` folder cannot reset a budget:

    <folder>/curator.sqlite     folder: config ``curator_dir`` (an absolute path), else $DPSAD_CURATOR_DIR,
                                else the user's data directory ($XDG_DATA_HOME/dpsad, ~/.local/share/dpsad)

A team points ``curator_dir`` or the variable at one shared folder.  A budget composes the releases of every
curator's record this machine or the workspace has used, not only of the one in use
(:mod:`dpsad.privacy.books.curator_witness`): another folder is no way to start from zero.  The record is written by the
``release_budget`` rule, a local rule: on a cluster it runs where Snakemake runs, so the database sits on that
host's disk (SQLite's locks are not to be trusted on network file systems).

Tables (SQLite, Python's standard library):

- ``meta``: this history's identity (``history``, random, made with the database) and format;
- ``record_sets``: the record digests (sorted uint8 N x 16 bytes) of every set a row names, by fingerprint;
- ``rows``: the history, append-only and chained: row ``sequence`` n holds ``kind``, ``body`` (JSON),
  ``previous`` (row n-1's digest; for row 1 a digest of the history's identity) and
  ``digest`` = sha256(previous, kind, body).  Kinds: ``release`` {recorded_utc, dataset, run,
  private_records, public_records, entries} and ``declared`` {recorded_utc, dataset, private_records,
  declared, lost_rows, lost_heads}; rows imported from an older workspace folder also name it (``imported_from``).
  Every body holds a secret random ``nonce``, so that the head, which released files carry, reveals nothing
  of the records.

Every use runs in one transaction (:meth:`CuratorRecord.transaction`): ``BEGIN IMMEDIATE`` takes the write
lock first, so two releases at the same moment are composed one after the other; the file's integrity and the
whole chain are checked before anything is read.  The chain's head (sequence and digest) goes into every
``BUDGET.json``, release folder and workspace marker (:mod:`dpsad.privacy.books.curator_witness`), which is how a
database that went back (a restored backup, an older copy) is recognised and refused.

Assumptions: a record is one image (:mod:`dpsad.privacy.books.records`); add/remove adjacency of one record.  A
record in several released private sets is protected only by the composition of every release from any of
them, so a budget composes every release whose private set shares a record with its own, whatever the
dataset was called.  A record released without noise (in a public split) has no guarantee left: no set that
holds it may be released as private, and no record released as private may later be released as public data.
The curator does not tamper with the record on purpose: the chain catches damage and hand edits, not a
forger who rewrites it whole.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import secrets
import sqlite3
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import DpsadError, PrivacyError
from .records import DIGEST_BYTES, as_set, set_fingerprint

class RecordUnreadable(DpsadError):
    """The database is absent, damaged or no curator's record: what it held is lost until it is put back."""


class RecordBusy(DpsadError):
    """The database is locked past the wait, or this user may not write it: nothing is lost, try again."""


FILE = "curator.sqlite"
FOLDER_ENV = "DPSAD_CURATOR_DIR"
FORMAT = "1"
KINDS = ("release", "declared")
BUSY_SECONDS = 600.0  # a second release waits while the first one composes (seconds of PLD accounting)


def user_data_folder() -> Path:
    """The user's data directory for dpsad ($XDG_DATA_HOME/dpsad, by default ~/.local/share/dpsad)."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "dpsad"


def curator_folder(configured: str | None = None) -> Path:
    """The folder of the curator's record: ``configured`` (config ``curator_dir``), else $DPSAD_CURATOR_DIR, else
    :func:`user_data_folder`.  A relative path is refused: each workspace would read a record of its own."""
    for value, where in ((configured, "curator_dir"), (os.environ.get(FOLDER_ENV), FOLDER_ENV)):
        if value:
            path = Path(str(value)).expanduser()
            if not path.is_absolute():
                raise DpsadError(f"{where} '{value}' is a relative path, expected an absolute one (or ~/...): a "
                                 "relative folder gives each workspace a curator's record of its own")
            return path
    return user_data_folder()


NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "fuse.sshfs",
                        "9p", "afs", "glusterfs", "fuse.glusterfs")


def network_file_system(path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """The type of the network file system ``path`` lies on (by the longest mount point above it), or None."""
    try:
        table = [line.split() for line in mounts.read_text().splitlines()]
    except OSError:
        return None
    path, best = Path(path).resolve(), ("", None)
    for fields in table:
        if len(fields) >= 3 and (path == Path(fields[1]) or Path(fields[1]) in path.parents):
            if len(fields[1]) > len(best[0]):
                best = (fields[1], fields[2])
    return best[1] if best[1] in NETWORK_FILE_SYSTEMS else None


def shown(path) -> str:
    """A path as the documents and cards show it: the home folder as ``~``."""
    path, home = Path(path), Path.home()
    try:
        return str(Path("~") / path.relative_to(home))
    except ValueError:
        return str(path)


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Head:
    """Where a history stands: its identity, the sequence number of its last row (0 when empty) and that row's
    digest (the chain's head), and the database's location."""

    history: str
    sequence: int
    digest: str
    location: str

    def as_dict(self) -> dict:
        return {"history": self.history, "sequence": self.sequence, "head": self.digest, "location": self.location}


@dataclass(frozen=True)
class Row:
    sequence: int
    kind: str
    body: dict
    digest: str


@dataclass
class RecordSets:
    """The private and public record digests of one prepared dataset: every identity digest of each split
    (uint8 M x 16, :func:`dpsad.privacy.books.records.identity_digests`) and, to count records rather than digests,
    each digest kind row by row (a list of uint8 N x 16, one per kind; None: count digests)."""

    dataset: str
    private: np.ndarray
    public: np.ndarray
    private_rows: list[np.ndarray] | None = None
    public_rows: list[np.ndarray] | None = None
    private_fingerprint: str = field(init=False)
    public_fingerprint: str = field(init=False)

    def __post_init__(self):
        self.private_fingerprint = set_fingerprint(self.private)
        self.public_fingerprint = set_fingerprint(self.public)


def records_among(digests: np.ndarray, rows: list[np.ndarray] | None, known: set[bytes]) -> int:
    """How many records of a split are in ``known``: rows any of whose digest kinds is there (digests when
    ``rows`` is None)."""
    if rows is None:
        return len(as_set(digests) & known)
    n = len(rows[0]) if rows else 0
    hit = np.zeros(n, dtype=bool)
    for kind in rows:
        hit |= np.fromiter((bytes(d) in known for d in kind), dtype=bool, count=n)
    return int(hit.sum())


def genesis(history: str) -> str:
    return hashlib.sha256(f"dpsad curator record {history}".encode()).hexdigest()


def chained(previous: str, kind: str, body_text: str) -> str:
    return hashlib.sha256(f"{previous}\n{kind}\n{body_text}".encode()).hexdigest()


class CuratorRecord:
    """The curator's record in ``folder`` (see the module docstring).  Use it inside :meth:`transaction`."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.path = self.folder / FILE
        self._db: sqlite3.Connection | None = None
        self._rows: list[Row] = []
        self._history = ""
        self._sets: dict[str, set[bytes]] = {}

    # --- the transaction ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, create: bool = True):
        """Hold the record's write lock for the block: create the database on first use (``create``; otherwise a
        missing one is a DpsadError), check its integrity and chain, and commit what the block wrote when it ends
        (nothing when it raises).  Another curator's record that a budget composes with is held the same way, so
        that nothing is written to it meanwhile (and a journal a killed release left behind is rolled back)."""
        if not create and not self.path.is_file():
            raise RecordUnreadable(f"no database at {self.path}")
        try:
            if create:
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None)
        except (OSError, sqlite3.Error) as err:
            raise DpsadError(f"the curator's record {self.path} cannot be opened ({err}), expected a folder this user "
                             "can write to on a local disk (config curator_dir or DPSAD_CURATOR_DIR)") from err
        try:
            try:
                db.execute("BEGIN IMMEDIATE")
                self._db = db
                if create:
                    self._create()
                self._check()
            except sqlite3.DatabaseError as err:
                raise self._open_error(err) from err
            yield self
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            self._db, self._rows, self._sets = None, [], {}
            db.close()

    def _open_error(self, err: sqlite3.DatabaseError) -> DpsadError:
        if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
            return RecordBusy(f"the curator's record {self.path} stayed locked by another release for "
                              f"{BUSY_SECONDS:g} s, expected it free: wait for that release to end, then run again")
        if "readonly" in str(err) or "read-only" in str(err):
            return RecordBusy(f"the curator's record {self.path} cannot be written by this user ({err}), expected a "
                              "database and folder this user can write to (each release locks every record it reads)")
        return RecordUnreadable(f"the curator's record {self.path} is damaged ({err}), expected the database dpsad "
                                "wrote: restore it from a backup")

    def _create(self) -> None:
        db = self._db
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS record_sets (fingerprint TEXT PRIMARY KEY, digests BLOB NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS rows (sequence INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
                   "body TEXT NOT NULL, previous TEXT NOT NULL, digest TEXT NOT NULL)")
        db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                       [("history", uuid.uuid4().hex), ("format", FORMAT), ("created_utc", now_utc())])

    def _check(self) -> None:
        """Refuse a damaged file or a history whose rows do not chain (edited, removed or reordered)."""
        db = self._db
        if (result := db.execute("PRAGMA quick_check").fetchone()[0]) != "ok":
            raise DpsadError(f"the curator's record {self.path} is damaged (SQLite: {result}), expected the database "
                             "dpsad wrote: restore it from a backup")
        try:
            meta = dict(db.execute("SELECT key, value FROM meta"))
        except sqlite3.OperationalError as err:
            raise RecordUnreadable(f"{self.path} is not a curator's record ({err})") from err
        if meta.get("format") != FORMAT:
            raise DpsadError(f"the curator's record {self.path} has format {meta.get('format')!r}, expected {FORMAT} "
                             "(written by another version of dpsad)")
        self._history = meta["history"]
        previous, rows = genesis(self._history), []
        for number, (sequence, kind, body_text, before, digest) in enumerate(
                db.execute("SELECT sequence, kind, body, previous, digest FROM rows ORDER BY sequence"), 1):
            if sequence != number or before != previous or kind not in KINDS or \
                    digest != chained(previous, kind, body_text):
                raise DpsadError(f"the curator's record {self.path}: row {number} does not chain to the rows before it "
                                 "(edited, removed or reordered), expected the history dpsad wrote: restore the "
                                 "database from a backup")
            try:
                body = json.loads(body_text)
            except ValueError as err:
                raise DpsadError(f"the curator's record {self.path}: row {number} is not JSON ({err})") from err
            rows.append(Row(sequence, kind, body, digest))
            previous = digest
        self._rows = rows

    # --- reading ----------------------------------------------------------------------------------------

    def head(self) -> Head:
        last = self._rows[-1] if self._rows else None
        return Head(self._history, last.sequence if last else 0, last.digest if last else genesis(self._history),
                    str(self.path))

    def rows(self, kind: str | None = None) -> list[Row]:
        return [row for row in self._rows if kind is None or row.kind == kind]

    def digest_at(self, sequence: int) -> str | None:
        """The digest of row ``sequence``, or None when the history has no such row."""
        return self._rows[sequence - 1].digest if 1 <= sequence <= len(self._rows) else None

    def acknowledged(self) -> tuple[set[tuple[str, int, str]], set[tuple[str, int, str]]]:
        """What declarations of lost releases stand for (:mod:`dpsad.privacy.books.curator_witness`): the rows whose
        records they cover, and the heads of the witnesses that named them; each as (history, sequence, digest)."""
        rows, heads = set(), set()
        for row in self.rows("declared"):
            rows |= {(str(h), int(q), str(d)) for h, q, d in row.body.get("lost_rows", [])}
            heads |= {(str(h), int(q), str(d)) for h, q, d in row.body.get("lost_heads", [])}
        return rows, heads

    def digests(self, fingerprint: str) -> set[bytes]:
        if fingerprint not in self._sets:
            found = self._db.execute("SELECT digests FROM record_sets WHERE fingerprint = ?", (fingerprint,)).fetchone()
            if found is None:
                raise DpsadError(f"the curator's record {self.path} names the record set {fingerprint[:16]} but does "
                                 "not hold it, expected every set its rows name: restore the database from a backup")
            digests = np.frombuffer(found[0], np.uint8).reshape(-1, DIGEST_BYTES)
            if set_fingerprint(digests) != fingerprint:
                raise DpsadError(f"the curator's record {self.path}: the record set {fingerprint[:16]} does not match "
                                 "its fingerprint, expected the database dpsad wrote: restore it from a backup")
            self._sets[fingerprint] = as_set(digests)
        return self._sets[fingerprint]

    def releases_sharing_records(self, records: RecordSets) -> list[dict]:
        """The release rows' bodies whose private set shares at least one record with ``records.private``."""
        mine = as_set(records.private)
        return [row.body for row in self.rows("release")
                if row.body["private_records"] == records.private_fingerprint
                or self.digests(row.body["private_records"]) & mine]

    def conflicts(self, records: RecordSets) -> list[str]:
        """One line per earlier use that makes ``records`` unreleasable: a private record of ``records`` was
        released without noise as public data, or a public record of ``records`` was a private record of a DP
        release or of a declared use."""
        private, public = as_set(records.private), as_set(records.public)
        found = []
        for row in self.rows():
            body = row.body
            where = f"(the curator's record {shown(self.path)}, row {row.sequence})"
            if body.get("public_records") and private and (known := self.digests(body["public_records"])) and \
                    not private.isdisjoint(known):
                leaked = records_among(records.private, records.private_rows, known)
                what = f"run '{body['run']}'" if row.kind == "release" else "a release declared lost"
                found.append(f"{leaked} private record(s) of {records.dataset} were released without noise as public "
                             f"data of {what} of {body['dataset']} {where}, expected a private split disjoint from every "
                             "public split released before (keep the split's seed and fractions)")
            used = row.kind == "declared" or bool(body["entries"])
            if used and public and not public.isdisjoint(known := self.digests(body["private_records"])):
                exposed = records_among(records.public, records.public_rows, known)
                what = (f"the released run '{body['run']}'" if row.kind == "release" else
                        f"an earlier use declared by {body['dataset']}")
                found.append(f"{exposed} public record(s) of {records.dataset} were private records of {what} of "
                             f"{body['dataset']} {where}, expected a public split disjoint from every private split "
                             "used before (keep the split's seed and fractions)")
        return found

    def declared_for(self, records: RecordSets) -> list[dict]:
        """Every earlier use declared for a set that shares a record with ``records.private``, each once
        (the same description, epsilon and delta is one use), with the dataset names that declared it."""
        mine = as_set(records.private)
        return merged_declarations([{**row.body["declared"], "declared_by": [row.body["dataset"]]}]
                                   for row in self.rows("declared")
                                   if row.body["private_records"] == records.private_fingerprint
                                   or self.digests(row.body["private_records"]) & mine)

    def imported_keys(self) -> set[str]:
        return {row.body["imported_from"]["key"] for row in self._rows if "imported_from" in row.body}

    # --- writing ----------------------------------------------------------------------------------------

    def append(self, kind: str, body: dict) -> Row:
        """Chain a new row after the head; returns it."""
        if self._db is None:
            raise RuntimeError("the curator's record is written inside CuratorRecord.transaction() only")
        previous = self.head().digest
        # A secret nonce in every row: the chain's head, which released files carry, is then no function of the
        # private records (a row's body holds the fingerprint of its record set).
        text = json.dumps({**body, "nonce": secrets.token_hex(16)}, sort_keys=True)
        row = Row(len(self._rows) + 1, kind, json.loads(text), chained(previous, kind, text))
        self._db.execute("INSERT INTO rows VALUES (?, ?, ?, ?, ?)", (row.sequence, kind, text, previous, row.digest))
        self._rows.append(row)
        return row

    def save_set(self, digests: np.ndarray) -> str:
        """Keep a record set (uint8 N x 16); returns its fingerprint."""
        rows = sorted(bytes(r) for r in np.asarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES))
        fingerprint = hashlib.sha256(b"".join(rows)).hexdigest()
        self._db.execute("INSERT OR IGNORE INTO record_sets VALUES (?, ?)", (fingerprint, b"".join(rows)))
        self._sets[fingerprint] = set(rows)
        return fingerprint

    def declare(self, records: RecordSets, declared: dict, lost_rows=(), lost_heads=(),
                imported_from: dict | None = None, with_public: bool = False) -> int:
        """Keep ``declared`` (``{description, epsilon, delta}``) as a use of ``records.private``, once; returns
        its row's sequence.  A declaration of lost releases (:mod:`dpsad.privacy.books.curator_witness`) also names the
        rows whose records it covers (``lost_rows``) and the witnesses' heads it answers (``lost_heads``), each
        (history, sequence, digest), and with ``with_public`` keeps ``records.public`` as released without noise
        (the lost releases' public data: never private afterwards)."""
        declared = declaration(declared)
        lost_rows = sorted([str(h), int(q), str(d)] for h, q, d in lost_rows)
        lost_heads = sorted([str(h), int(q), str(d)] for h, q, d in lost_heads)
        for row in self.rows("declared"):
            body = row.body
            if (body["private_records"], body["dataset"], declaration(body["declared"]), body.get("lost_rows", []),
                    body.get("lost_heads", [])) == (records.private_fingerprint, records.dataset, declared, lost_rows,
                                                    lost_heads):
                return row.sequence
        self.save_set(records.private)
        body = {"recorded_utc": now_utc(), "dataset": records.dataset, "private_records": records.private_fingerprint,
                "declared": declared, "lost_rows": lost_rows, "lost_heads": lost_heads}
        if with_public:
            self.save_set(records.public)
            body["public_records"] = records.public_fingerprint
        if imported_from:
            body["imported_from"] = imported_from
        return self.append("declared", body).sequence

    def record(self, records: RecordSets, run: str, entries: list[dict], imported_from: dict | None = None) -> int:
        """Chain a row for the release of ``run`` (its private ``entries``), unless the same release (the same
        records, run and trainings, by ``uid``; entries without one are always new) has one; returns the
        sequence of its row."""
        private_entries = [e for e in entries if e.get("private")]
        uids = sorted(e.get("uid") or "" for e in private_entries)
        for row in self.rows("release") if all(uids) else ():  # an entry without a uid is never merged: a new use
            body = row.body
            if (body["private_records"], body["public_records"], body["run"], body["dataset"]) == (
                    records.private_fingerprint, records.public_fingerprint, run, records.dataset) and \
                    sorted(e.get("uid") or "" for e in body["entries"]) == uids:
                return row.sequence
        self.save_set(records.private)
        self.save_set(records.public)
        body = {"recorded_utc": now_utc(), "dataset": records.dataset, "run": run,
                "private_records": records.private_fingerprint, "public_records": records.public_fingerprint,
                "entries": private_entries}
        if imported_from:
            body["imported_from"] = imported_from
        return self.append("release", body).sequence


def declaration(declared: dict) -> dict:
    """The identity of a declared use: its description and cost, nothing else."""
    return {"description": str(declared["description"]).strip(), "epsilon": declared.get("epsilon"),
            "delta": declared.get("delta")}


def merged_declarations(groups) -> list[dict]:
    """The declared uses of several records (:meth:`CuratorRecord.declared_for` of each), each use once."""
    found: dict[str, dict] = {}
    for group in groups:
        for declared in group:
            key = json.dumps(declaration(declared), sort_keys=True)
            entry = found.setdefault(key, {**declaration(declared), "declared_by": []})
            entry["declared_by"] += [name for name in declared.get("declared_by", []) if name not in entry["declared_by"]]
    return list(found.values())


def refuse_conflicts(curator: CuratorRecord, records: RecordSets) -> None:
    """Raise PrivacyError with the first conflict :meth:`CuratorRecord.conflicts` finds."""
    found = curator.conflicts(records)
    if found:
        raise PrivacyError(found[0])
