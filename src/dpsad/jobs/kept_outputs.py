"""Keep a finished DP job's outputs until Snakemake has taken them: no second training, no second spending entry.

Failure prevented: Snakemake dies between a job's last write and its own record of the job's end; its next run
deletes the complete outputs as incomplete and trains again on the private records, and the spending log counts
one released model twice.  A job with a ``ledger`` output keeps hard links to its outputs (no extra disk) under
``.snakemake/dpsad-finished/`` with its identity (rule, outputs, params, content of every input): the same job
started again gets those very files back, and its ledger's entries (their ``uid``s) count once.  A kept copy
goes when a job reading one of its outputs starts (Snakemake has recorded them by then) or the job runs under
another identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from .one_running_copy import keyed_path

FINISHED_FOLDER = Path(".snakemake") / "dpsad-finished"  # in Snakemake's working directory, beside its metadata


def reads_private_records(snakemake) -> bool:
    """Jobs with a ``ledger`` output: those whose outputs are kept."""
    return bool(getattr(snakemake.output, "ledger", None))


def job_identity(snakemake, inputs_digest: str) -> str:
    """sha256 of what makes a run of a job the same run: rule, outputs, params and the inputs' content."""
    params = dict(snakemake.params.items()) if hasattr(snakemake.params, "items") else list(snakemake.params)
    text = json.dumps({"rule": snakemake.rule, "outputs": [str(o) for o in snakemake.output], "params": params,
                       "inputs": inputs_digest}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _resolved(outputs) -> list[str]:
    return [str(Path(o).resolve()) for o in outputs]


def keep(outputs: list[str], identity: str, log) -> None:
    """Hard-link the finished ``outputs``; the manifest, written last, makes the kept copy whole."""
    folder = keyed_path(FINISHED_FOLDER, outputs[0])
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.mkdir(parents=True)
        for number, output in enumerate(outputs):
            os.link(output, folder / str(number))
    except OSError:  # an output folder (never a ledger job's), another file system, no links: nothing is kept
        shutil.rmtree(folder, ignore_errors=True)
        log.info("could not keep links to the outputs under %s (another file system?): a rerun after a kill of "
                 "Snakemake at this very moment would train again", FINISHED_FOLDER)
        return
    (folder / "manifest.json").write_text(json.dumps({"identity": identity, "outputs": _resolved(outputs)}))


def restore(outputs: list[str], identity: str, log) -> bool:
    """Put back the outputs an earlier run of this identity kept; True when put back.  A kept copy of another
    identity is dropped (the job runs again, under other settings or inputs)."""
    folder = keyed_path(FINISHED_FOLDER, outputs[0])
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    kept = [folder / str(number) for number in range(len(outputs))]
    if manifest != {"identity": identity, "outputs": _resolved(outputs)} or not all(p.is_file() for p in kept):
        shutil.rmtree(folder, ignore_errors=True)
        return False
    for source, output in zip(kept, outputs):
        Path(output).unlink(missing_ok=True)
        os.link(source, output)
        os.utime(output)  # newer than its inputs, as a freshly written output is
    log.info("put back the outputs of the run of this job that finished after its Snakemake had ended (same "
             "settings and inputs): nothing is trained again, and its use of the records counts once")
    return True


def forget_taken(inputs: list[str]) -> None:
    """Drop every kept copy one of whose outputs is among ``inputs`` (a job reads them: Snakemake took them)."""
    wanted = set(_resolved(inputs))
    for manifest in FINISHED_FOLDER.glob("*/manifest.json"):
        try:
            outputs = json.loads(manifest.read_text()).get("outputs", [])
        except (OSError, ValueError):
            outputs = []
        if wanted.intersection(outputs):
            shutil.rmtree(manifest.parent, ignore_errors=True)
