"""The curator's record: every release and declared use of private records, one SQLite database per curator.

    <home>/.local/share/dpsad/curator.sqlite   the user's own record.  <home> is the home folder the system's user
                                               database gives this user (``pwd``), never $HOME or $XDG_*: a batch
                                               job, a container's fresh $HOME or another shell reads the same
                                               history, so no change of environment starts one from zero
    <curator_dir>/curator.sqlite               config ``curator_dir`` (absolute): a team's shared record

Tables: ``meta`` (the history's random identity), ``record_sets`` (the digests of every record set a row names),
``rows`` (append-only, each row chained to the one before by sha256 and holding a secret nonce, so that the head
released files carry says nothing of the records) and, in the user's own record, ``seen`` (the register: every
record the user released through, where, the furthest row seen and the largest total stated after it).

Every release holds the user's own record and the one in use (``BEGIN IMMEDIATE``: releases compose one after
the other) and composes every history it can see: those two, each one ``seen`` names and each one a
``BUDGET.json`` of the workspace names.  Each guard, and the hole it closes:

- a witness (``seen``, a ``BUDGET.json``) naming a row its record lacks or holds otherwise is refused: a record
  restored from an older backup, or two copies used apart, would forget releases;
- a history a witness saw with rows that cannot be read where it was seen is refused: a deleted record, or
  ``curator_dir`` pointed elsewhere, would forget releases;
- a record with rows that this user never used (a team's, another machine's) is refused until the curator adopts
  it (``python -m dpsad.curator adopt --curator-dir DIR``): nothing could tell whether it went back.  Adopting
  only adds to the register, and refuses a record behind what the register saw.

A refusal is answered by putting the newer record back, or by declaring what was lost (``python -m dpsad.curator
declare-lost``): a use of those records that every later budget composes.

Assumptions: a record is one image (:mod:`dpsad.privacy.books.image_digests`); add/remove adjacency of one record.  A
release composes every release whose private set shares a record with its own, whatever the dataset is called.
A record released without noise (public data) is never released as private, nor the reverse.  The curator does
not forge the record on purpose.  What no design on one machine can see is :data:`NOT_SEEN`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import math
import os
import pwd
import secrets
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import DpsadError, PrivacyError
from .image_digests import DIGEST_BYTES, RecordSets, as_set, records_among, set_fingerprint

FILE = "curator.sqlite"
HEADS = "curator-heads.json"
FORMAT = "1"
BUSY_SECONDS = 600.0  # a second release waits while the first one composes (seconds of PLD accounting)
TEST_HOME_ENV = "DPSAD_USER_HOME_FOR_TESTS"  # the test suite's stand-in for the user's home; stated when set
# the test suite's: the bundled MNIST-5k's use is not composed (dpsad.data.bundled_uses); stated when set
LEAVE_OUT_BUNDLED_ENV = "DPSAD_LEAVE_OUT_BUNDLED_USE_FOR_TESTS"
LEFT_OUT_BUNDLED = (f"The use dpsad's developers made of the MNIST-5k digits it bundles was left out by "
                    f"{LEAVE_OUT_BUNDLED_ENV} (a test setting): it is not composed here, even where these records "
                    "include those digits.")


def bundled_use_left_out() -> bool:
    """The test setting of :mod:`dpsad.data.bundled_uses`: :data:`LEAVE_OUT_BUNDLED_ENV` is 1 and the user's home is
    the suite's stand-in (a stray variable in a user's shell leaves nothing out; where it does, statements say so)."""
    return os.environ.get(LEAVE_OUT_BUNDLED_ENV) == "1" and bool(os.environ.get(TEST_HOME_ENV))


REPLACED_HOME = (f"The user's home was replaced by {TEST_HOME_ENV} (a test setting): releases in the record of the "
                 "user's real home are not composed in the totals here.")


TEST_SETTINGS = (REPLACED_HOME, LEFT_OUT_BUNDLED)


def active_test_settings() -> list[str]:
    """One sentence for each test setting in effect, for every statement a release makes (privacy.json, the
    ``guarantee_notes`` of synthetic.h5, BUDGET.json, the card, NOT_RELEASED.txt).  Failure prevented: a shell
    that kept a test setting states a total without the releases of the real record, or a guarantee for the
    bundled digits, with nothing in the shared files to say so."""
    settings = [REPLACED_HOME] if os.environ.get(TEST_HOME_ENV) else []
    return settings + ([LEFT_OUT_BUNDLED] if bundled_use_left_out() else [])


def refuse_other_test_settings(stated: list[str], path) -> None:
    """Refuse a file of a release (a verdict, samples, BUDGET.json) made under other test settings than those in
    effect now: a variable set in one shell and not in another would leave a statement without the sentence that
    qualifies it, or with one that no longer holds, and record a release in the record that shell sees."""
    if stated != (settings := active_test_settings()):
        raise DpsadError(f"{path} was made under the test settings {stated}, but this release runs under {settings}, "
                         "expected the same: unset or set the variables as before, or make it again under these "
                         f"(the same snakemake command again, with --forcerun {path})")


NOT_SEEN = ("The curator's record cannot see releases of these records made on another machine or by another user, "
            "nor, once the curator's ~/.local folder was deleted or restored from a backup, the releases it lost, "
            "unless the release is made in a workspace that still holds the BUDGET.json of one of them (it keeps the "
            "record's later state): such releases are not in any total stated here.")
DECLARE_LOST = ("python -m dpsad.curator declare-lost --data results/<dataset>/data.h5 --epsilon E --delta D "
                "--description '...'")


class RecordUnreadable(DpsadError):
    """The database is absent, damaged or no curator's record."""


def user_home() -> Path:
    """The user's home by the system's user database, whatever $HOME says (:data:`TEST_HOME_ENV` when set)."""
    return Path(os.environ.get(TEST_HOME_ENV) or pwd.getpwuid(os.geteuid()).pw_dir)


def home_folder() -> Path:
    return user_home() / ".local" / "share" / "dpsad"


def heads_files() -> list[Path]:
    """Where the heads of every record used are kept outside the records (the first, written), so that the
    user's own record deleted, or restored alone, is seen; the others (read only) are where an earlier version kept
    its register ($XDG_STATE_HOME, or ~/.local/state by $HOME), which names the records it used."""
    files = [user_home() / ".local" / "state" / "dpsad" / HEADS]
    if os.environ.get("XDG_STATE_HOME"):
        files.append(Path(os.environ["XDG_STATE_HOME"]) / "dpsad" / HEADS)
    if os.environ.get("HOME"):
        files.append(Path(os.environ["HOME"]) / ".local" / "state" / "dpsad" / HEADS)
    return list(dict.fromkeys(files))


def read_heads() -> list["Head"]:
    """Every head the heads files keep, with the largest total stated after it and the record sets released
    through it (an earlier version's register: from its rows)."""
    found = []
    for path in heads_files():
        try:
            for history, entry in (json.loads(path.read_text()) if path.is_file() else {}).items():
                rows = entry.get("rows") or []  # an earlier version's: [sequence, digest, dataset, set, epsilon, delta]
                totals = [tuple(entry["total"])] if entry.get("total") else [(float(r[4]), float(r[5])) for r in rows]
                total = (max(t[0] for t in totals), max(t[1] for t in totals)) if totals else None
                sets = tuple(entry.get("fingerprints") or (str(r[3]) for r in rows))
                found.append(Head(str(history), int(entry["sequence"]), str(entry["head"]), str(entry["location"]),
                                  str(path), total, sets))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
            raise DpsadError(f"{path}: not the heads of curator's records dpsad wrote ({err!r}), expected its JSON: "
                             "put it back, or remove it if every record it named is in use") from err
    return found


def remember_heads(heads: list["Head"], answered: frozenset = frozenset()) -> None:
    """Keep ``heads`` (each with the total stated after it and its record sets) in :func:`heads_files`'s first:
    the furthest row seen of each history, where it is now, the largest total and every set.  Called once the
    witnesses agreed with the records, so a head further on extends the one kept.  A kept head that a declaration
    answers (``answered``: (history, row, digest)) gives way to the record's head even at a lower row: kept, it
    would witness nothing written after the declaration, and a second restore would drop those rows unseen."""
    path = heads_files()[0]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two releases ending at once must not lose one's heads
            known = json.loads(path.read_text()) if path.is_file() else {}
            for head in heads:
                before = known.get(head.history, {})
                entry = {"sequence": head.sequence, "head": head.digest, "location": str(Path(head.location).resolve())}
                if still_ahead(head.history, int(before.get("sequence", 0)), before.get("head"), head, answered):
                    entry.update(sequence=before["sequence"], head=before["head"])
                totals = [tuple(t) for t in (before.get("total"), head.total) if t]
                entry["total"] = [max(t[0] for t in totals), max(t[1] for t in totals)] if totals else None
                entry["fingerprints"] = sorted(set(before.get("fingerprints") or ()) | set(head.fingerprints))
                known[head.history] = entry
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            os.replace(tmp, path)
    except (OSError, ValueError) as err:
        raise DpsadError(f"{path} could not be written ({err}); the release is recorded in the curator's record, "
                         "expected room and permission there: fix it, then run again") from err


def still_ahead(history: str, sequence: int, digest: str, head: "Head", answered) -> bool:
    """Whether a witness's kept row (``sequence``, ``digest``) of ``history`` stays the one kept over ``head``:
    further on, and not answered by a declaration (then the record's head takes its place)."""
    return sequence > head.sequence and (history, sequence, digest) not in answered


def curator_folder(configured: str | None = None) -> Path:
    """Config ``curator_dir`` (absolute, or ~/... from the user's real home), else :func:`home_folder`."""
    if not configured:
        return home_folder()
    text = str(configured)
    path = user_home() / text[2:] if text == "~" or text.startswith("~/") else Path(text)
    if not path.is_absolute():
        raise DpsadError(f"curator_dir '{configured}' is a relative path, expected an absolute one (or ~/...): a "
                         "relative folder gives each workspace a curator's record of its own")
    return path


def shown(path) -> str:
    """A path as cards show it: the user's home as ``~``."""
    try:
        return str(Path("~") / Path(path).relative_to(user_home()))
    except ValueError:
        return str(path)


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def checked_cost(epsilon, delta, where: str) -> tuple[float, float]:
    """(epsilon, delta) a curator typed, or DpsadError: epsilon finite and at least 0, delta in [0, 1)."""
    epsilon, delta = float(epsilon), float(delta)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise DpsadError(f"{where}: epsilon {epsilon!r}, expected a finite number at least 0")
    if not (math.isfinite(delta) and 0 <= delta < 1):
        raise DpsadError(f"{where}: delta {delta!r}, expected a number in [0, 1)")
    return epsilon, delta


@dataclass(frozen=True)
class Head:
    """Where a history stands (its last row and that row's digest), as the record or a witness (``where``) saw it;
    a witness also keeps the largest total stated after it and the private sets released through it."""

    history: str
    sequence: int
    digest: str
    location: str
    where: str = ""
    total: tuple[float, float] | None = None
    fingerprints: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"history": self.history, "sequence": self.sequence, "head": self.digest, "location": self.location}


@dataclass(frozen=True)
class Row:
    sequence: int
    kind: str  # "release" or "declared"
    body: dict
    digest: str


def chained(previous: str, kind: str, text: str) -> str:
    return hashlib.sha256(f"{previous}\n{kind}\n{text}".encode()).hexdigest()


class CuratorRecord:
    """The record in ``folder``; read and written inside :meth:`transaction` only."""

    def __init__(self, folder):
        self.folder, self.path, self.created = Path(folder), Path(folder) / FILE, False
        self._db: sqlite3.Connection | None = None
        self._rows: list[Row] = []
        self._sets: dict[str, set[bytes]] = {}
        self.history = ""

    @contextlib.contextmanager
    def transaction(self, create: bool = True, readonly: bool = False):
        """Hold the record (write-locked unless ``readonly``), made on first use when ``create``; its file and
        chain checked; committed when the block ends, rolled back when it raises.  Every SQLite failure (a full
        disk, a lock held past the wait, no permission, damage) is one DpsadError line."""
        if not create and not self.path.is_file():
            raise RecordUnreadable(f"no curator's record at {self.path}")
        if create and not self.path.exists():
            try:
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as err:
                raise DpsadError(f"cannot make the curator's record folder {self.folder} ({err}), expected a folder "
                                 "this user can write to") from err
        try:
            db = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro" if readonly else self.path, uri=readonly,
                                 timeout=BUSY_SECONDS, isolation_level=None)
            try:
                db.execute("BEGIN" if readonly else "BEGIN IMMEDIATE")
                self._db = db
                # Decided under the lock: a file without the schema is new (SQLite makes the file on connecting, so
                # a refused first release left an empty one, and another release may be making it right now).
                new = not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
                if new and not create:
                    raise RecordUnreadable(f"no curator's record at {self.path}")
                self.created = self.created or new
                if create:
                    self._create()
                self._check()
                yield self
                db.execute("COMMIT")
            finally:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                self._db, self._rows, self._sets = None, [], {}
                db.close()
        except sqlite3.Error as err:
            text = str(err)
            if not any(word in text for word in ("locked", "busy", "full", "readonly", "read-only", "I/O", "open")):
                raise RecordUnreadable(f"the curator's record {self.path} is damaged or no curator's record ({err}), "
                                       "expected the database dpsad wrote: restore it from a backup") from err
            raise DpsadError(f"the curator's record {self.path}: {err}; nothing was recorded, expected a database "
                             "this user can write on a local disk with room (a lock is held while another release "
                             f"composes, {BUSY_SECONDS:g} s at most)") from err

    def _create(self) -> None:
        for table in ("meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
                      "record_sets (fingerprint TEXT PRIMARY KEY, digests BLOB NOT NULL)",
                      "rows (sequence INTEGER PRIMARY KEY, kind TEXT NOT NULL, body TEXT NOT NULL, "
                      "previous TEXT NOT NULL, digest TEXT NOT NULL)",
                      "seen (history TEXT PRIMARY KEY, body TEXT NOT NULL)"):
            self._db.execute(f"CREATE TABLE IF NOT EXISTS {table}")
        self._db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                             [("history", uuid.uuid4().hex), ("format", FORMAT), ("created_utc", now_utc())])

    def _check(self) -> None:
        """Refuse a damaged file or rows that do not chain (edited, removed or reordered)."""
        if (result := self._db.execute("PRAGMA quick_check").fetchone()[0]) != "ok":
            raise RecordUnreadable(f"the curator's record {self.path} is damaged (SQLite: {result}): restore it from a "
                                   "backup")
        meta = dict(self._db.execute("SELECT key, value FROM meta"))
        if meta.get("format") != FORMAT:
            raise RecordUnreadable(f"the curator's record {self.path} has format {meta.get('format')!r}, expected {FORMAT}")
        self.history, self._rows = meta["history"], []
        previous = self.head().digest
        for number, (sequence, kind, text, before, digest) in enumerate(
                self._db.execute("SELECT sequence, kind, body, previous, digest FROM rows ORDER BY sequence"), 1):
            if (sequence, before, digest) != (number, previous, chained(previous, kind, text)):
                raise RecordUnreadable(f"the curator's record {self.path}: row {number} does not chain to the rows "
                                       "before it (edited, removed or reordered): restore the database from a backup")
            self._rows.append(Row(sequence, kind, json.loads(text), digest))
            previous = digest

    # --- reading ------------------------------------------------------------------------------------------

    def head(self) -> Head:
        last = self._rows[-1] if self._rows else None
        genesis = hashlib.sha256(f"dpsad curator record {self.history}".encode()).hexdigest()
        return Head(self.history, last.sequence if last else 0, last.digest if last else genesis, str(self.path))

    def rows(self, kind: str | None = None) -> list[Row]:
        return [row for row in self._rows if kind is None or row.kind == kind]

    def digest_at(self, sequence: int) -> str | None:
        return self._rows[sequence - 1].digest if 1 <= sequence <= len(self._rows) else None

    def answered(self) -> set[tuple[str, int, str]]:
        """The heads (history, row, digest) that declarations of lost releases answer: exactly those, so that a
        row written later at the same number, and lost again, is a new problem."""
        return {(str(h), int(q), str(d)) for row in self.rows("declared") for h, q, d in row.body.get("lost", [])}

    def digests(self, fingerprint: str) -> set[bytes]:
        if fingerprint not in self._sets:
            found = self._db.execute("SELECT digests FROM record_sets WHERE fingerprint = ?", (fingerprint,)).fetchone()
            digests = np.frombuffer(found[0], np.uint8).reshape(-1, DIGEST_BYTES) if found else None
            if digests is None or set_fingerprint(digests) != fingerprint:
                raise RecordUnreadable(f"the curator's record {self.path} lacks the record set {fingerprint[:16]} its "
                                       "rows name, or holds it damaged: restore the database from a backup")
            self._sets[fingerprint] = as_set(digests)
        return self._sets[fingerprint]

    def _sharing(self, records: RecordSets, kind: str) -> list[dict]:
        mine = as_set(records.private)
        return [row.body for row in self.rows(kind) if row.body["private_records"] == records.private_fingerprint
                or self.digests(row.body["private_records"]) & mine]

    def releases_sharing_records(self, records: RecordSets) -> list[dict]:
        return self._sharing(records, "release")

    def declared_for(self, records: RecordSets) -> list[dict]:
        """Every use declared for a set that shares a record with ``records.private``."""
        return [{**body["declared"], "declared_by": [body["dataset"]]} for body in self._sharing(records, "declared")]

    def conflicts(self, records: RecordSets) -> list[str]:
        """One line per earlier use on the other side of the private/public line from ``records``."""
        private, public, found = as_set(records.private), as_set(records.public), []
        for row in self.rows():
            body, where = row.body, f"(the curator's record {shown(self.path)}, row {row.sequence})"
            release = row.kind == "release"
            if body.get("public_records") and private and not private.isdisjoint(known := self.digests(body["public_records"])):
                what = f"run '{body['run']}'" if release else "a release declared lost"
                found.append(f"{records_among(records.private, records.private_rows, known)} private record(s) of "
                             f"{records.dataset} were released without noise as public data of {what} of "
                             f"{body['dataset']} {where}, expected a private split disjoint from every public split "
                             "released before (keep the split's seed and fractions)")
            # a use of unknown cost bounded no total of its records: making them public makes no statement false
            # (the bundled MNIST-5k digits, which dpsad's defaults were chosen on, may be a public split)
            counted = body["entries"] if release else body["declared"].get("epsilon") is not None
            if counted and public and not public.isdisjoint(known := self.digests(body["private_records"])):
                what = f"the released run '{body['run']}' of" if release else "an earlier use declared by"
                found.append(f"{records_among(records.public, records.public_rows, known)} public record(s) of "
                             f"{records.dataset} were private records of {what} {body['dataset']} {where}, expected "
                             "a public split disjoint from every private split used before")
        return found

    def released_sets(self) -> set[str]:
        """The fingerprints of the private record sets of every release row."""
        return {row.body["private_records"] for row in self.rows("release")}

    def seen(self) -> list[Head]:
        """The register (the user's own record only): each record the user released through, as last seen."""
        found = []
        for history, text in self._db.execute("SELECT history, body FROM seen ORDER BY history"):
            body = json.loads(text)
            found.append(Head(history, int(body["sequence"]), body["head"], body["location"],
                              f"the register in {shown(self.path)}", tuple(body["total"]) if body.get("total") else None,
                              tuple(body.get("fingerprints", []))))
        return found

    # --- writing --------------------------------------------------------------------------------------------

    def note_seen(self, head: Head, total: tuple[float, float] | None = None, fingerprints=(),
                  answered: frozenset = frozenset()) -> None:
        """Keep ``head`` in the register, unless what was seen is further on and no declaration answers it
        (``answered``: as :func:`remember_heads`)."""
        before = next((w for w in self.seen() if w.history == head.history), None)
        furthest = before if before and still_ahead(before.history, before.sequence, before.digest, head, answered) \
            else head
        totals = [t for t in (before.total if before else None, total) if t]
        body = {"sequence": furthest.sequence, "head": furthest.digest, "location": str(Path(head.location).resolve()),
                "total": [max(t[0] for t in totals), max(t[1] for t in totals)] if totals else None,
                "fingerprints": sorted(set(before.fingerprints if before else ()) | set(fingerprints))}
        self._db.execute("INSERT OR REPLACE INTO seen VALUES (?, ?)", (head.history, json.dumps(body, sort_keys=True)))

    def append(self, kind: str, body: dict) -> Row:
        previous = self.head().digest
        text = json.dumps({**body, "nonce": secrets.token_hex(16)}, sort_keys=True)
        row = Row(len(self._rows) + 1, kind, json.loads(text), chained(previous, kind, text))
        self._db.execute("INSERT INTO rows VALUES (?, ?, ?, ?, ?)", (row.sequence, kind, text, previous, row.digest))
        self._rows.append(row)
        return row

    def save_set(self, digests: np.ndarray) -> str:
        rows = sorted(bytes(r) for r in np.asarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES))
        fingerprint = hashlib.sha256(b"".join(rows)).hexdigest()
        self._db.execute("INSERT OR IGNORE INTO record_sets VALUES (?, ?)", (fingerprint, b"".join(rows)))
        self._sets[fingerprint] = set(rows)
        return fingerprint

    def declare(self, records: RecordSets, declared: dict, lost=(), with_public: bool = False) -> int:
        """Keep ``declared`` ({description, epsilon, delta}) as a use of ``records.private``, once; a declaration of
        lost releases names the heads (history, row, digest) it answers and keeps ``records.public`` public."""
        body = {"dataset": records.dataset, "private_records": records.private_fingerprint,
                "declared": declaration(declared), "lost": sorted([str(h), int(q), str(d)] for h, q, d in lost)}
        for row in self.rows("declared"):
            if {k: row.body.get(k) for k in body} == body:
                return row.sequence
        self.save_set(records.private)
        if with_public:
            body["public_records"] = self.save_set(records.public)
        return self.append("declared", {**body, "recorded_utc": now_utc()}).sequence

    def record(self, records: RecordSets, run: str, entries: list[dict]) -> int:
        """Chain a row for the release of ``run`` unless the same release (records, run, trainings by ``uid``)
        has one; returns its sequence.  Entries without a uid are always new."""
        private_entries = [e for e in entries if e.get("private")]
        uids = sorted(e.get("uid") or "" for e in private_entries)
        key = (records.private_fingerprint, records.public_fingerprint, run, records.dataset)
        for row in self.rows("release") if all(uids) else ():
            body = row.body
            if (body["private_records"], body["public_records"], body["run"], body["dataset"]) == key and \
                    sorted(e.get("uid") or "" for e in body["entries"]) == uids:
                return row.sequence
        body = {"recorded_utc": now_utc(), "dataset": records.dataset, "run": run, "entries": private_entries,
                "private_records": self.save_set(records.private), "public_records": self.save_set(records.public)}
        return self.append("release", body).sequence


def declaration(declared: dict) -> dict:
    """The identity of a declared use: its description and cost."""
    return {"description": str(declared["description"]).strip(), "epsilon": declared.get("epsilon"),
            "delta": declared.get("delta")}


def workspace_witnesses(workspace) -> list[Head]:
    """The heads the workspace's ``release/*/BUDGET.json`` name, with the totals they stated."""
    found = []
    for path in sorted(Path(workspace).glob("release/*/BUDGET.json")) if workspace is not None else []:
        try:
            data = json.loads(path.read_text())
            head = data["curator_record"]
            total = (float(data.get("epsilon_with_declared_earlier_use", data["epsilon"])),
                     float(data.get("delta_with_declared_earlier_use", data["delta"])))
            found.append(Head(str(head["history"]), int(head["sequence"]), str(head["head"]),
                              str(Path(str(head["location"])).expanduser()), str(path), total))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DpsadError(f"{path}: not a BUDGET.json dpsad wrote ({err!r}), expected its curator_record: put the "
                             "file back as it was") from err
    return found


def disagreement(record: CuratorRecord, w: Head) -> str | None:
    """Why ``record`` is not what the witness ``w`` of its history saw (behind it, or otherwise at its row), or None."""
    if w.sequence > record.head().sequence:
        return (f"the curator's record {shown(record.path)} ends at row {record.head().sequence}, but {w.where} saw "
                f"row {w.sequence} of it: it was restored from an older backup or copied before later releases; put "
                f"the newer database back, or declare what it held: {DECLARE_LOST}")
    if w.sequence and record.digest_at(w.sequence) != w.digest:
        return (f"row {w.sequence} of the curator's record {shown(record.path)} is not the one {w.where} saw: it was "
                "restored and has taken releases since, or two copies of it were used apart; put back the copy that "
                f"holds every release, or declare what the other held: {DECLARE_LOST}")
    return None


@dataclass
class Books:
    """The records a release composes, each held in its transaction: ``home`` (the register), ``in_use`` (where
    the release is written), ``all`` (both and every history a witness names), and the witnesses' ``problems``."""

    home: CuratorRecord
    in_use: CuratorRecord
    all: list[CuratorRecord]
    problems: list[tuple[Head, str]]

    def answered(self) -> frozenset:
        """Every head (history, row, digest) a declaration in one of the records answers."""
        return frozenset().union(*(record.answered() for record in self.all))


def _held(folder: Path, history: str, stack: contextlib.ExitStack, held: set[Path]) -> CuratorRecord | str:
    """The record of ``history`` in ``folder``, held in ``stack``; or why not (absent, damaged, another history)."""
    record, local = CuratorRecord(folder), contextlib.ExitStack()
    if record.path.resolve() in held:
        return "the database there holds another history now"
    try:
        local.enter_context(record.transaction(create=False))
    except RecordUnreadable as err:
        return str(err)
    if record.history != history:
        local.close()
        return f"the database there holds history {record.history[:12]} now"
    stack.enter_context(local.pop_all())
    held.add(record.path.resolve())
    return record


def open_books(folder, workspace, stack: contextlib.ExitStack, *, collect: bool = False) -> Books:
    """Hold the user's own record, the one in ``folder`` and every history a witness names, in ``stack``, and
    refuse (PrivacyError, one line) what the module docstring lists; with ``collect`` the witnesses' problems are
    returned instead (what ``declare-lost`` answers)."""
    home = CuratorRecord(home_folder())
    stack.enter_context(home.transaction())
    in_use = home if Path(folder).resolve() == home.folder.resolve() else CuratorRecord(folder)
    if in_use is not home:
        stack.enter_context(in_use.transaction())
    if in_use is not home and in_use.history == home.history:
        raise PrivacyError(f"the curator's record {shown(in_use.path)} is a copy of this user's own record "
                           f"{shown(home.path)} (the same history), expected one of them: two copies used apart would "
                           "each miss the other's releases")
    registered = home.seen()
    if in_use is not home and in_use.head().sequence and in_use.history not in {w.history for w in registered}:
        raise PrivacyError(f"the curator's record {shown(in_use.path)} holds {in_use.head().sequence} row(s) but "
                           f"this user's record {shown(home.path)} never saw it, so nothing can tell whether it went "
                           f"back; if it holds every release, say so: python -m dpsad.curator adopt --curator-dir "
                           f"{in_use.folder}")
    books = {home.history: home, in_use.history: in_use}
    held, unreadable = {home.path.resolve(), in_use.path.resolve()}, {}
    witnesses = registered + read_heads() + workspace_witnesses(workspace)
    for w in sorted(witnesses, key=lambda w: -w.sequence):
        if w.sequence and w.history not in books and w.history not in unreadable:
            found = _held(Path(w.location).parent, w.history, stack, held)
            (books if isinstance(found, CuratorRecord) else unreadable)[w.history] = found
    answered = frozenset().union(*(book.answered() for book in books.values()))
    problems = []
    for w in witnesses:
        if w.sequence == 0 or (w.history, w.sequence, w.digest) in answered:
            continue
        record = books.get(w.history)
        if record is None:
            why = (f"the curator's record of history {w.history[:12]} ({w.sequence} row(s) seen at {shown(w.location)} "
                   f"by {w.where}) cannot be read there ({unreadable[w.history]}): its releases count toward every "
                   f"budget of their records; put it back, or declare what it held: {DECLARE_LOST}")
        else:
            why = disagreement(record, w)
        if why:
            problems.append((w, why))
    if problems and not collect:
        raise PrivacyError(problems[0][1])
    return Books(home, in_use, list(books.values()), problems)


def refuse_conflicts(books: Books, records: RecordSets) -> None:
    for book in books.all:
        if found := book.conflicts(records):
            raise PrivacyError(found[0])
