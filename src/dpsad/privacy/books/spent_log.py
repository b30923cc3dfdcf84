"""What the curator has spent on a dataset's private records, released or not.

Every finished stage that reads private records appends its own ledger
entries to ``results/<dataset>/spent.jsonl``: an append-only log that a
rerun, a sweep or an audit never overwrites (a rerun adds new entries, with
new ``uid`` s).  :func:`spent_summary` composes everything in it: the noisy
uses by the accountant, the noise-free ones listed by stage (those have no
finite epsilon; they are the curator's own, e.g. the non-private reference).

Assumption: entries compose adaptively over the same private records
(add/remove adjacency of one record).  A stage killed and never resumed, or
started over after an update of dpsad (a training resumes only under the code
that began it), recorded nothing of its interrupted part, although it read
records: the total is a lower figure in that case.

Run ``python -m dpsad.privacy.books.spent_log results/<dataset>`` to print the total.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import math
import sys
from pathlib import Path

from ...files.atomic import write_json
from ...errors import DpsadError
from ..accounting import cached_accountant
from .ledger import components_of, unique_entries

SPENT_LOG = "spent.jsonl"
SPENT_SUMMARY = "spent.json"


def record_spending(dataset_dir, entries: list[dict], *, source: str) -> int:
    """Append the private ``entries`` not yet in ``dataset_dir/spent.jsonl`` (by uid); returns how many."""
    return append_entries(Path(dataset_dir) / SPENT_LOG, entries, source=source)


def append_entries(log_path, entries: list[dict], *, source: str) -> int:
    """Append the private ``entries`` not yet in the JSON-lines log ``log_path`` (by uid; one without a uid always);
    returns how many."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # concurrent jobs of one workflow append to the same log
        handle.seek(0)
        # An entry without a uid (hand-written, or older than uids) cannot be told from another use, so each is
        # kept (ledger._identity never merges them either): over-counting is safe, skipping one after the first is not.
        known = {row["entry"].get("uid") for row in _rows(handle.read(), log_path)} - {None, ""}
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        added = 0
        for entry in entries:
            if entry.get("private") and (not entry.get("uid") or entry["uid"] not in known):
                handle.write(json.dumps({"recorded_utc": stamp, "source": source, "entry": entry}) + "\n")
                known.add(entry.get("uid"))
                added += 1
        handle.flush()
    return added


def _rows(text: str, path) -> list[dict]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            row["entry"]["stage"]
        except (ValueError, KeyError, TypeError) as err:
            raise DpsadError(f"{path}: line {number} is not a spending record ({err}), expected JSON with 'entry'") from err
        rows.append(row)
    return rows


def logged_rows(log_path) -> list[dict]:
    """The rows of a JSON-lines log written by :func:`append_entries` ([] when there is none)."""
    log_path = Path(log_path)
    return _rows(log_path.read_text(encoding="utf-8"), log_path) if log_path.is_file() else []


def spent_summary(dataset_dir, *, delta: float, accountant: str = "pld") -> dict:
    """Compose every recorded use of ``dataset_dir``'s private records at ``delta``."""
    rows = logged_rows(Path(dataset_dir) / SPENT_LOG)
    entries = unique_entries(row["entry"] for row in rows)
    noisy = [e for e in entries if e["mechanism"] in ("sgm", "gaussian") and e.get("sound", True)
             and e.get("noise_seed") == "secret"]
    other = [e for e in entries if e not in noisy]
    epsilon = cached_accountant(accountant).epsilon(components_of(noisy), delta)
    return {
        "scope": "curator only: every recorded use of the private split, released or not (sweeps, audits, reruns)",
        "epsilon_of_dp_uses": epsilon if math.isfinite(epsilon) else "inf",
        "delta": delta,
        "accountant": accountant,
        "dp_uses": len(noisy),
        "uses_without_a_guarantee": sorted({e["stage"] for e in other}),
        "note": ("uses without a guarantee (no noise, a fixed seed or the paper's mechanism) have no finite epsilon: "
                 "whatever they produced must stay in results/" if other else ""),
        "sources": sorted({row["source"] for row in rows}),
    }


def write_spent_summary(dataset_dir, *, delta: float, accountant: str = "pld") -> dict:
    summary = spent_summary(dataset_dir, delta=delta, accountant=accountant)
    write_json(Path(dataset_dir) / SPENT_SUMMARY, summary)
    return summary


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m dpsad.privacy.books.spent_log results/<dataset> [delta]")
    try:
        result = write_spent_summary(sys.argv[1], delta=float(sys.argv[2]) if len(sys.argv) == 3 else 1e-5)
    except DpsadError as err:
        sys.exit(f"error: {err}")
    print(json.dumps(result, indent=2))
