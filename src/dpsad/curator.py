"""The curator's record from the command line: what it holds, and how to declare releases it lost.

    python -m dpsad.curator show [--curator-dir DIR]
    python -m dpsad.curator declare-lost --data results/<dataset>/data.h5 --epsilon E --delta D --description TEXT
                                         [--curator-dir DIR] [--workspace .]

``declare-lost`` is the way back when the record was restored from an older backup, or two copies of it went
separate ways, and the newer database is gone: it declares what the lost rows spent (their total is in the
``BUDGET.json`` of the release that names them) as an earlier use of the records of ``--data``, and names the
heads the witnesses saw (:mod:`dpsad.privacy.curator_witness`), which then pass.  Every later budget over any
of those records counts the declared epsilon by basic composition.  Run it in the workspace whose files name
the lost rows.  Errors are one ``error:`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .data.datafile import read_attrs
from .errors import DpsadError
from .privacy.curator_record import CuratorRecord, curator_folder, shown
from .release import record_sets
from .privacy.curator_witness import lost_heads, remember


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


def declare_lost(curator: CuratorRecord, *, data, epsilon: float, delta: float, description: str, workspace) -> str:
    heads = lost_heads(curator, workspace)
    if not heads:
        raise DpsadError(f"no witness in {workspace} or on this machine names a row that the curator's record "
                         f"{shown(curator.path)} lacks, expected a record that went back: nothing to declare")
    records = record_sets(str(read_attrs(data)["dataset"]), data)
    sequence = curator.declare(records, {"description": description, "epsilon": epsilon, "delta": delta},
                               acknowledges=heads)
    return (f"declared as row {sequence}: {description} (epsilon {epsilon:g}, delta {delta:g}) for the records of "
            f"{data}, standing for the lost rows {', '.join(str(s) for s, _ in heads)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpsad.curator", description=__doc__.splitlines()[0])
    parser.add_argument("--curator-dir", help="the record's folder (default: config curator_dir's default)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("show", help="every row of the record")
    lost = commands.add_parser("declare-lost", help="declare the releases a restored or forked record lacks")
    lost.add_argument("--data", required=True, help="results/<dataset>/data.h5 of the records the lost rows released")
    lost.add_argument("--epsilon", type=float, required=True, help="what the lost rows spent (their BUDGET.json total)")
    lost.add_argument("--delta", type=float, required=True)
    lost.add_argument("--description", required=True)
    lost.add_argument("--workspace", default=".", help="the workspace whose files name the lost rows")
    args = parser.parse_args(argv)
    try:
        curator = CuratorRecord(curator_folder(args.curator_dir))
        if args.command == "show" and not curator.path.is_file():
            print(f"no curator's record at {shown(curator.path)} yet")
            return 0
        with curator.transaction():
            if args.command == "show":
                print(show(curator))
                return 0
            print(declare_lost(curator, data=Path(args.data), epsilon=args.epsilon, delta=args.delta,
                               description=args.description, workspace=Path(args.workspace)))
            head = curator.head()
        remember(head, Path(args.workspace))
    except DpsadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
