"""The curator's folder of earlier versions, imported into the curator's record.

Before the record was a database, each workspace kept it in a folder (config ``curator_dir``, by default
``curator/`` in the workspace; ``.dpsad/curator.json`` named it as ``{curator_id, curator_dir}``):

    released.jsonl            {recorded_utc, dataset, run, private_records, public_records, entries} per line
    declared.jsonl            {recorded_utc, dataset, private_records, declared} per line
    record_sets/<sha256>.npy  the record digests (uint8 N x 16) of every set a row names
    ID                        the folder's identity

:func:`import_legacy_folders` copies every row of such a folder into the record, once: each row is known by
a key made of the folder's ``ID`` and the row's text, so a second import (another clone of the workspace, a
row appended later by an older version) adds only what is new.  The folder itself is left as it was.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ...errors import DpsadError
from .curator_record import CuratorRecord, RecordSets
from .records import set_fingerprint

LEGACY_FOLDER = "curator"
LEGACY_MARKER = Path(".dpsad") / "curator.json"


def legacy_folders(workspace) -> list[Path]:
    """The old-style curator folders a workspace used: ``curator/`` and the one its old marker names."""
    workspace = Path(workspace)
    found = [workspace / LEGACY_FOLDER]
    marker = workspace / LEGACY_MARKER
    if marker.is_file():
        try:
            data = json.loads(marker.read_text())
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict) and data.get("curator_dir"):
            named = Path(data["curator_dir"])
            found.append(named if named.is_absolute() else workspace / named)
    unique = []
    for folder in found:
        if folder.is_dir() and any((folder / name).is_file() for name in ("released.jsonl", "declared.jsonl")) \
                and folder.resolve() not in [f.resolve() for f in unique]:
            unique.append(folder)
    return unique


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.is_file() else []


def _record_set(folder: Path, fingerprint: str) -> np.ndarray:
    path = folder / "record_sets" / f"{fingerprint}.npy"
    try:
        digests = np.load(path)
    except (OSError, ValueError) as err:
        raise DpsadError(f"{path}: the record set of an earlier release cannot be read ({err}), expected the file the "
                         f"old curator folder's rows name: restore {folder} from a backup") from err
    if set_fingerprint(digests) != fingerprint:
        raise DpsadError(f"{path}: its digests do not match its name, expected the record set dpsad wrote")
    return digests


def import_legacy_folder(curator: CuratorRecord, folder) -> int:
    """Chain every row of the old-style folder ``folder`` not yet imported; returns how many (call inside
    ``curator.transaction()``)."""
    folder = Path(folder)
    identity = (folder / "ID").read_text().strip() if (folder / "ID").is_file() else str(folder.resolve())
    known = curator.imported_keys()
    added = 0
    for name, kind in (("released.jsonl", "release"), ("declared.jsonl", "declared")):
        for number, line in enumerate(_lines(folder / name), 1):
            key = hashlib.sha256(f"{identity}\n{name}\n{line.strip()}".encode()).hexdigest()
            if key in known:
                continue
            try:
                row = json.loads(line)
                private = _record_set(folder, row["private_records"])
                public = _record_set(folder, row["public_records"]) if kind == "release" else private[:0]
                records = RecordSets(str(row["dataset"]), private, public)
                source = {"key": key, "folder": str(folder.resolve()), "line": number,
                          "recorded_utc": row.get("recorded_utc")}
                if kind == "release":
                    curator.record(records, str(row["run"]), list(row["entries"]), imported_from=source)
                else:
                    curator.declare(records, row["declared"], imported_from=source)
            except (ValueError, KeyError, TypeError) as err:
                raise DpsadError(f"{folder / name}: line {number} is not a row of an old curator folder ({err}), "
                                 "expected the JSON dpsad wrote") from err
            known.add(key)
            added += 1
    return added


def import_legacy_folders(curator: CuratorRecord, workspace=None) -> int:
    """:func:`import_legacy_folder` for each of :func:`legacy_folders` of ``workspace`` and for the record's own
    folder (an old absolute ``curator_dir``, shared by workspaces, now holds the database beside the old files);
    returns how many rows were added."""
    folders = legacy_folders(workspace) if workspace is not None else []
    if any((curator.folder / name).is_file() for name in ("released.jsonl", "declared.jsonl")):
        folders.append(curator.folder)
    return sum(import_legacy_folder(curator, folder) for folder in folders)
