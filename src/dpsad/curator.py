"""The curator's record from the command line: what it holds, old folders, and releases it lost.

    python -m dpsad.curator show [--curator-dir DIR]
    python -m dpsad.curator adopt [--curator-dir DIR]
    python -m dpsad.curator import-folder PATH [--curator-dir DIR]
    python -m dpsad.curator declare-lost --data results/<dataset>/data.h5 [--data ...] --description TEXT
                                         [--epsilon E --delta D] [--curator-dir DIR] [--workspace .]

``show`` lists every row.  ``adopt`` tells this machine's register that the record holds every release: for a
record used here for the first time (a team's, another machine's) or after the state folder was lost, since then
nothing here can tell whether it went back; it is the curator's word.  ``import-folder`` imports the curator
folder of an older version (``released.jsonl``, ``record_sets/``).

``declare-lost`` is the way back when a record was restored from an older backup, two copies of it went
separate ways, or a record this machine used is gone, and the newer database cannot be put back.  It finds the
rows the witnesses saw and no readable record holds (:func:`dpsad.privacy.books.curator_witness.lost_rows`), refuses
unless a ``--data`` holds the private records of each row this machine kept a line of, and declares, for each
``--data``, the largest total the witnesses stated (or ``--epsilon``/``--delta`` where they stated none; never
less) as an earlier use of those records.  Every later budget over any of those records counts it by basic
composition.  Run it in the workspace whose files name the lost rows.  Errors are one ``error:`` line, exit 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .data.datafile import read_attrs
from .errors import DpsadError
from .privacy.books.curator_legacy import import_legacy_folder
from .privacy.books.curator_record import CuratorRecord, curator_folder, shown
from .privacy.books.curator_witness import lost_rows, release_lock, remember
from .release import record_sets


def show(curator: CuratorRecord) -> str:
    head = curator.head()
    lines = [f"curator's record {shown(curator.path)}: history {head.history}, {head.sequence} row(s), head "
             f"{head.digest}"]
    for row in curator.rows():
        body = row.body
        what = (f"release of {body['dataset']}/{body['run']} ({len(body['entries'])} private ledger entries)"
                if row.kind == "release" else
                f"declared use of {body['dataset']}'s records: {body['declared']['description']} (epsilon "
                f"{body['declared'].get('epsilon')}, delta {body['declared'].get('delta')})")
        imported = " [imported from an old curator folder]" if "imported_from" in body else ""
        lines.append(f"{row.sequence:5d}  {body.get('recorded_utc')}  {what}{imported}")
    return "\n".join(lines)


def declare_lost(curator: CuratorRecord, *, data: list[Path], epsilon: float | None, delta: float | None,
                 description: str, workspace) -> str:
    heads, rows, totals = lost_rows(curator, workspace)
    if not heads:
        raise DpsadError(f"no witness in {workspace} or on this machine names a row that the curator's records lack, "
                         f"expected a record that went back, forked or is gone (the record in use: "
                         f"{shown(curator.path)}): nothing to declare")
    sets = [(path, record_sets(str(read_attrs(path)["dataset"]), path)) for path in data]
    coverage = [(path, records, [row for row in rows if row.private_records == records.private_fingerprint])
                for path, records in sets]
    uncovered = [row for row in rows if not any(row in covered for _, _, covered in coverage)]
    if uncovered:
        named = ", ".join(f"row {row.sequence} ({row.dataset})" for row in uncovered)
        raise DpsadError(f"the lost {named} released records that no --data holds, expected a --data "
                         "results/<dataset>/data.h5 for the records of each lost row, prepared as it was then (the same "
                         "source and split settings)")
    if not rows and (epsilon is None or delta is None):
        raise DpsadError("no witness here kept a line of the lost rows (their records and totals), expected --epsilon "
                         "and --delta: what they spent, in the curator's own word, for the records of each --data")
    lines = []
    for path, records, covered in coverage:
        if rows and not covered:
            raise DpsadError(f"--data {path} holds none of the records the lost rows released, expected only the data "
                             "of lost rows")
        # what the witnesses stated after the lost rows bounds what they spent from below: never declare less
        stated = [row.total for row in covered if row.total is not None] + totals
        spent_epsilon = max([t[0] for t in stated] + ([epsilon] if epsilon is not None else []), default=None)
        spent_delta = max([t[1] for t in stated] + ([delta] if delta is not None else []), default=None)
        if spent_epsilon is None or spent_delta is None:
            raise DpsadError(f"no witness states what the lost rows spent on the records of {path}, expected "
                             "--epsilon and --delta for them")
        sequence = curator.declare(records, {"description": description, "epsilon": spent_epsilon,
                                             "delta": spent_delta}, lost_rows=[row.key for row in covered],
                                   lost_heads=heads, with_public=True)
        lines.append(f"declared as row {sequence}: {description} (epsilon {spent_epsilon:g}, delta {spent_delta:g}) for "
                     f"the records of {path}, standing for {len(covered)} lost row(s) this machine knew of")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpsad.curator", description=__doc__.splitlines()[0])
    parser.add_argument("--curator-dir", help="the record's folder (default: config curator_dir's default)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("show", help="every row of the record")
    commands.add_parser("adopt", help="say that the record holds every release (a record new to this machine)")
    old = commands.add_parser("import-folder", help="import an old-style curator folder")
    old.add_argument("folder", type=Path)
    lost = commands.add_parser("declare-lost", help="declare the releases a restored, forked or lost record lacks")
    lost.add_argument("--data", required=True, action="append", type=Path,
                      help="results/<dataset>/data.h5 of records the lost rows released (once per set)")
    lost.add_argument("--epsilon", type=float, help="what the lost rows spent, where no witness states it")
    lost.add_argument("--delta", type=float)
    lost.add_argument("--description", required=True)
    lost.add_argument("--workspace", type=Path, default=Path("."), help="the workspace whose files name the lost rows")
    args = parser.parse_args(argv)
    try:
        curator = CuratorRecord(curator_folder(args.curator_dir))
        if args.command == "show" and not curator.path.is_file():
            print(f"no curator's record at {shown(curator.path)} yet")
            return 0
        with release_lock():  # as a release holds it: the records this reads are written by no release meanwhile
            with curator.transaction():
                if args.command == "show":
                    print(show(curator))
                elif args.command == "adopt":
                    print(f"this machine's register now knows {shown(curator.path)} at row {curator.head().sequence}")
                elif args.command == "import-folder":
                    print(f"imported {import_legacy_folder(curator, args.folder)} row(s) of {args.folder}")
                else:
                    print(declare_lost(curator, data=args.data, epsilon=args.epsilon, delta=args.delta,
                                       description=args.description, workspace=args.workspace))
                head = curator.head()
            if args.command != "show":  # show only reads: a record new here is adopted on purpose
                remember(head, args.workspace if args.command == "declare-lost" else None)
    except DpsadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
