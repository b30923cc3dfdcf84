"""Keep the outputs of a job that read private records until Snakemake has taken them (no retraining twice).

When Snakemake dies in the instant between a job's last write and its own
record of the job's end, its next run deletes the complete outputs as
"incomplete" and runs the job again: a second training on the private
records, a second entry in the spending log, for one released model.  So a
job with a ``ledger`` output, once it has succeeded, keeps hard links to its
outputs under ``.snakemake/dpsad-finished/`` (no extra disk while the outputs
exist), with the identity of the job (rule, outputs, params, content of every
input).  The same job started again with the same identity gets those very
files back instead of training again: its ledger keeps its entries' ``uid``s,
so the spending log counts the training once.

A kept copy is dropped as soon as a job that reads one of its outputs starts
(by then Snakemake has recorded the job complete), or when the job runs again
under another identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

FINISHED_FOLDER = Path(".snakemake") / "dpsad-finished"  # in Snakemake's working directory, beside its metadata


def _key(output: str | os.PathLike) -> str:
    return hashlib.sha256(str(Path(output).resolve()).encode()).hexdigest()[:20]


def folder_of(outputs: list[str]) -> Path:
    """Where the finished outputs of the job writing ``outputs`` are kept."""
    return FINISHED_FOLDER / f"{Path(outputs[0]).name}.{_key(outputs[0])}"


def job_identity(rule: str, outputs: list[str], params: dict, inputs_digest: str) -> str:
    """sha256 of what makes a run of a job the same run: rule, outputs, params and the inputs' content."""
    text = json.dumps({"rule": rule, "outputs": [str(o) for o in outputs], "params": params, "inputs": inputs_digest},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def keeps_outputs(outputs: list[str]) -> bool:
    """Only plain-file outputs are kept (hard links; folders are never a ledger job's output)."""
    return bool(outputs) and all(Path(o).is_file() for o in outputs)


def keep(outputs: list[str], identity: str) -> bool:
    """Hard-link the finished ``outputs`` under :func:`folder_of`; False (nothing kept) when links cannot be made."""
    if not keeps_outputs(outputs):
        return False
    folder = folder_of(outputs)
    shutil.rmtree(folder, ignore_errors=True)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for number, output in enumerate(outputs):
            os.link(output, staging / str(number))
    except OSError:  # another file system, or links not supported: nothing is kept
        shutil.rmtree(staging, ignore_errors=True)
        return False
    manifest = {"identity": identity, "outputs": [str(Path(o).resolve()) for o in outputs]}
    (staging / "manifest.json").write_text(json.dumps(manifest))
    staging.rename(folder)  # the manifest and every link appear at once
    return True


def restore(outputs: list[str], identity: str) -> bool:
    """Put back the outputs kept by an earlier run of the same identity; True when they were put back.

    A kept copy of another identity is dropped (that job runs again, under other settings or inputs)."""
    if not outputs:
        return False
    folder = folder_of(outputs)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return False
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError:
        manifest = {}
    kept = [folder / str(number) for number in range(len(outputs))]
    if (manifest.get("identity") != identity
            or manifest.get("outputs") != [str(Path(o).resolve()) for o in outputs]
            or not all(path.is_file() for path in kept)):
        shutil.rmtree(folder, ignore_errors=True)
        return False
    for source, output in zip(kept, outputs):
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).unlink(missing_ok=True)
        os.link(source, output)
        os.utime(output)  # newer than its inputs, as a freshly written output is
    return True


def forget_taken(inputs: list[str]) -> int:
    """Drop every kept copy one of whose outputs is among ``inputs`` (a job reads them: Snakemake took them)."""
    if not FINISHED_FOLDER.is_dir():
        return 0
    wanted = {str(Path(i).resolve()) for i in inputs}
    dropped = 0
    for manifest_path in FINISHED_FOLDER.glob("*/manifest.json"):
        try:
            outputs = json.loads(manifest_path.read_text()).get("outputs", [])
        except (OSError, ValueError):
            outputs = []
        if wanted.intersection(outputs):
            shutil.rmtree(manifest_path.parent, ignore_errors=True)
            dropped += 1
    return dropped
