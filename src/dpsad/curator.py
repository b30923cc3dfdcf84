"""The curator's record from the command line: what it holds, a record new to this user, releases it lost.

    python -m dpsad.curator show [--curator-dir DIR]
    python -m dpsad.curator adopt --curator-dir DIR
    python -m dpsad.curator declare-lost --data results/<dataset>/data.h5 [--data ...] --epsilon E --delta D
                                         --description TEXT [--curator-dir DIR] [--workspace .]

``show`` lists every row, read-only.  ``adopt`` is the curator's word that a record this user never used (a
team's, another machine's) holds every release: it joins the user's register, unless it is behind what the
register saw.  ``declare-lost`` answers a record that went back, forked or is gone when the newer database cannot
be put back: for each ``--data`` it declares a use of those records of at least what any witness stated after the
lost rows.  Errors are one ``error:`` line and exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

from .data.datafile import read_attrs
from .errors import DpsadError
from .privacy.books.curator_record import (CuratorRecord, checked_cost, curator_folder, disagreement, home_folder,
                                          open_books, read_heads, remember_heads, shown)
from .release_folder import record_sets


def show(curator: CuratorRecord) -> str:
    head = curator.head()
    lines = [f"curator's record {shown(curator.path)}: history {head.history}, {head.sequence} row(s), head {head.digest}"]
    for row in curator.rows():
        body, declared = row.body, row.body.get("declared", {})
        lines.append(f"{row.sequence:5d}  {body.get('recorded_utc')}  " + (
            f"release of {body['dataset']}/{body['run']} ({len(body['entries'])} private ledger entries)"
            if row.kind == "release" else f"declared use of {body['dataset']}'s records: {declared['description']} "
                                          f"(epsilon {declared.get('epsilon')}, delta {declared.get('delta')})"))
    return "\n".join(lines)


def adopt(folder: Path) -> str:
    with contextlib.ExitStack() as stack:
        home, record = CuratorRecord(home_folder()), CuratorRecord(folder)
        stack.enter_context(home.transaction())
        if record.path.resolve() == home.path.resolve():
            return f"{shown(home.path)} is this user's own record: nothing to adopt"
        stack.enter_context(record.transaction(create=False))
        if record.history == home.history:
            raise DpsadError(f"the curator's record {shown(record.path)} is a copy of this user's own record, expected "
                             "another history: two copies used apart would each miss the other's releases")
        answered = home.answered() | record.answered()
        for witness in home.seen() + read_heads():  # adopting never overrules what was seen of it
            if witness.history == record.history and (witness.history, witness.sequence, witness.digest) not in \
                    answered and (why := disagreement(record, witness)):
                raise DpsadError(f"adopt: {why}")
        home.note_seen(record.head(), None, record.released_sets(), answered)
        heads = [home.head(), dataclasses.replace(record.head(), fingerprints=tuple(record.released_sets()))]
    remember_heads(heads, answered)
    return (f"this user's register ({shown(home.path)}) now knows {shown(record.path)} at row {heads[1].sequence}")


def declare_lost(folder: Path, *, data: list[Path], epsilon: float, delta: float, description: str,
                 workspace: Path) -> str:
    epsilon, delta = checked_cost(epsilon, delta, "declare-lost")
    if not description.strip():
        raise DpsadError("declare-lost: --description is empty, expected what the lost releases were")
    with contextlib.ExitStack() as stack:
        books = open_books(folder, workspace, stack, collect=True)
        if not books.problems:
            raise DpsadError(f"no witness in {workspace} or in this user's register names a row that the curator's "
                             "records lack, expected a record that went back, forked or is gone: nothing to declare")
        lost = sorted({(w.history, w.sequence, w.digest) for w, _ in books.problems})
        stated = [w.total for w, _ in books.problems if w.total] or [(0.0, 0.0)]
        floor = (max(t[0] for t in stated), max(t[1] for t in stated))
        if epsilon < floor[0] or delta < floor[1]:
            raise DpsadError(f"declare-lost: epsilon {epsilon:g}, delta {delta:g}, expected at least epsilon "
                             f"{floor[0]:g} and delta {floor[1]:g}: what the witnesses of the lost rows stated")
        sets = [(path, record_sets(str(read_attrs(path)["dataset"]), path)) for path in data]
        if missing := {f for w, _ in books.problems for f in w.fingerprints} - {r.private_fingerprint for _, r in sets}:
            raise DpsadError(f"the lost rows released {len(missing)} record set(s) that no --data holds, expected a "
                             "--data results/<dataset>/data.h5 for the records of each, prepared as it was then")
        lines = []
        for path, records in sets:
            row = books.in_use.declare(records, {"description": description, "epsilon": epsilon, "delta": delta},
                                       lost=lost, with_public=True)
            lines.append(f"declared as row {row} of {shown(books.in_use.path)}: {description} (epsilon {epsilon:g}, "
                         f"delta {delta:g}) for the records of {path}")
        heads, answered = [book.head() for book in books.all], books.answered()  # the new declaration's too
    remember_heads(heads, answered)
    return "\n".join(lines + ["every later budget of these records counts it; a budget whose delta it fills needs a "
                              f"larger delta than {delta:g} (data.<dataset>.privacy_budget.delta)"])


def main(argv=None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--curator-dir", type=Path, help="the record's folder (default: the user's own record)")
    parser = argparse.ArgumentParser(prog="python -m dpsad.curator", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("show", parents=[common], help="every row of the record")
    commands.add_parser("adopt", parents=[common], help="say that a record new to this user holds every release")
    lost = commands.add_parser("declare-lost", parents=[common], help="declare what a record that went back lost")
    lost.add_argument("--data", required=True, action="append", type=Path, help="results/<dataset>/data.h5, once a set")
    lost.add_argument("--epsilon", required=True, type=float, help="what the lost releases spent, at least")
    lost.add_argument("--delta", required=True, type=float)
    lost.add_argument("--description", required=True)
    lost.add_argument("--workspace", type=Path, default=Path("."), help="the workspace whose files name the lost rows")
    args = parser.parse_args(argv)
    try:
        folder = curator_folder(str(args.curator_dir) if args.curator_dir else None)
        if args.command == "show":
            curator = CuratorRecord(folder)
            if folder.exists() and not folder.is_dir():
                raise DpsadError(f"{folder} is a file, expected the folder of a curator's record")
            if not curator.path.exists() or curator.path.stat().st_size == 0:  # empty: a refused first release's
                print(f"no curator's record at {shown(curator.path)} yet")
                return 0
            with curator.transaction(create=False, readonly=True):
                print(show(curator))
        elif args.command == "adopt":
            if args.curator_dir is None:
                raise DpsadError("adopt: --curator-dir is missing, expected the folder of the record to adopt")
            print(adopt(folder))
        else:
            print(declare_lost(folder, data=args.data, epsilon=args.epsilon, delta=args.delta,
                               description=args.description, workspace=args.workspace))
    except DpsadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
