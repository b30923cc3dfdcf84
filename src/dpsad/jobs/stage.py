"""Run a workflow stage from a Snakemake script: logging, threads, one-line errors, exit codes.

No torch import (3 s on a small machine): a bookkeeping stage (account, compare, release) never loads it.

Each guard here prevents one failure: a second copy of a running stage, and a job outliving its killed Snakemake
(:mod:`.one_running_copy`); a finished DP job trained and counted twice (:mod:`.kept_outputs`); a truncated
temporary a killed write left, read back later (:func:`sweep_killed_writes`); a ledger stage whose use of the
private records goes unrecorded (no books); an artifact it builds on composed with another's ledger (the
books' ``before``, :class:`dpsad.job_spending.StageBooks`); a traceback where the user needs one line (:func:`fail`)."""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

from .. import __version__
from ..files.atomic import sweep_temporaries
from ..errors import DpsadError
from . import kept_outputs
from .one_running_copy import BOOKKEEPING, hold_outputs, watch_snakemake
from ..runtime.threads import job_threads

# dpsad.runtime.distributed.WORKER_ENV, read here without importing torch (a test checks that they are the same)
TRAINING_WORKER_ENV = "DPSAD_TRAINING_WORKER"


def run_stage(snakemake, body, books=None) -> None:
    """Call ``body(snakemake, log)``; bad input ends the job with its one-line message and exit code 1.

    ``books(snakemake, log)`` records a stage's use of the private records once its outputs are written
    (:data:`dpsad.job_spending.record_stage_spending`), under :data:`BOOKKEEPING`, and its ``books.before(snakemake,
    log)`` checks the inputs before ``body`` reads a record; a stage with a ``ledger``
    output and no books stops before reading anything, since that use would go unrecorded.  A training process
    of torch's launcher (:mod:`dpsad.runtime.distributed`) only trains, and ends with the job's process, which
    holds the lock and keeps the books."""
    resume_the_collector()
    if os.environ.get(TRAINING_WORKER_ENV):
        from ..runtime.distributed import die_with_parent

        die_with_parent()
        _run_body(snakemake, body, books, worker=True)
        return
    with contextlib.ExitStack() as held:
        # the lock first: a second copy must not truncate the running one's log, sweep its temporaries or write
        try:
            held.enter_context(hold_outputs(list(snakemake.output)))
        except DpsadError as err:
            fail(snakemake, None, str(err))  # no log yet: it is the running copy's
        _run_body(snakemake, body, books)


def resume_the_collector() -> None:
    """Start the cyclic collector that :mod:`dpsad.jobs.paused_collector` paused while the job's script imported its
    libraries, with every object alive now frozen out of its scans: each scan traced torch's objects again, and so
    did the interpreter's teardown (``benchmarks/job_start.py``).  The cost, in a job only: an object alive now is
    never collected (its memory kept, its finaliser not run), nor the garbage the imports left, and a file held by
    a module's or the script's global would lose what it buffered at exit: a stage closes every file it writes.
    A process that runs stages with the collector on (a test) is left as it is."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _run_body(snakemake, body, books, worker: bool = False) -> None:
    first = not worker or os.environ.get("RANK", "0") == "0"
    log = setup_logging(snakemake.log[0] if snakemake.log and first else None, append=worker)
    threads = int(os.environ["OMP_NUM_THREADS"]) if worker else job_threads(snakemake)
    if (torch := sys.modules.get("torch")) is not None:  # bookkeeping stages never load it
        torch.set_num_threads(threads)
    else:  # read by torch where the stage imports it later (prepare_data's loaders)
        os.environ["OMP_NUM_THREADS"] = str(threads)
    log.info("%s: dpsad %s from %s%s", snakemake.rule, code_version(), Path(__file__).resolve().parents[1],
             f" (training process {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')})" if worker else "")
    outputs, private, identity = list(snakemake.output), kept_outputs.reads_private_records(snakemake), None
    if not worker:
        watch_snakemake(outputs, log)
    if private and books is None:
        fail(snakemake, log, f"{snakemake.rule} writes a ledger but keeps no books: its use of the private records "
             "would go unrecorded, expected run_stage(snakemake, main, books=record_stage_spending)")
    try:
        if not worker:
            if private:
                identity = kept_outputs.job_identity(snakemake, inputs_sha256(list(snakemake.input)))
            sweep_killed_writes(outputs, log)
            kept_outputs.forget_taken(list(getattr(snakemake, "input", [])))
            if identity and kept_outputs.restore(outputs, identity, log):
                with BOOKKEEPING:
                    books(snakemake, log)
                return
            if private:
                books.before(snakemake, log)
        body(snakemake, log)
        if not worker:
            with BOOKKEEPING:
                if identity:
                    kept_outputs.keep(outputs, identity, log)
                if books is not None:
                    books(snakemake, log)
    except (DpsadError, FloatingPointError) as err:
        fail(snakemake, log, str(err))
    except OSError as err:
        message = file_system_message(err, outputs)
        if message is None:
            log.exception("%s failed with %s", snakemake.rule, type(err).__name__)
            raise
        fail(snakemake, log, message)
    except BaseException as err:
        # Anything else (CUDA out of memory, a bug, a kill) goes to the rule's log with its traceback,
        # where Snakemake's --show-failed-logs and the SLURM job's log point, and still fails the job.
        if not isinstance(err, SystemExit) or err.code not in (0, None):
            log.exception("%s failed with %s", snakemake.rule, type(err).__name__)
        raise


def setup_logging(log_path: str | None = None, append: bool = False) -> logging.Logger:
    """Log to stderr and ``log_path`` (the rule's log, emptied first unless ``append``), in append mode: the lines
    of the training processes that log to it while the job waits for them stay in it."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        if not append:
            open(log_path, "w").close()
        handlers.append(logging.FileHandler(log_path, mode="a"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", handlers=handlers, force=True)
    return logging.getLogger("dpsad")


def fail(snakemake, log, message: str) -> None:
    """End the job with ``error: <message>`` on one line and exit code 1 (and in the rule's log, when open)."""
    if log is not None:
        log.error("%s failed: %s", snakemake.rule, message)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


# File-system faults the user fixes outside the workflow: said in one line, not as a traceback.
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def file_system_message(err: OSError, outputs=()) -> str | None:
    """One line for a full disk, a file-size limit, a read-only or refused folder, or a file where a folder
    should be; None for any other OSError.  Without a file name in the error, the job's outputs are named."""
    where = err.filename or (", ".join(str(o) for o in outputs) if outputs else "?")
    if err.errno in DISK_FULL:
        return f"disk full at {where} ({os.strerror(err.errno)}), expected free space (or a larger file-size limit) there"
    if err.errno == errno.EROFS:
        return f"read-only file system at {where}, expected a folder this job can write to"
    if isinstance(err, PermissionError):
        return f"permission denied at {where}, expected a file or folder this user can read and write"
    if isinstance(err, NotADirectoryError) or err.errno == errno.ENOTDIR:
        return f"a file stands where a folder is needed in {where}, expected folders on that path (move the file away)"
    return None


def sweep_killed_writes(outputs, log) -> None:
    """Delete temporaries that a killed earlier run of this job left beside its outputs (and resume files)."""
    for output in outputs:
        for path in (output, f"{output}.resume"):
            for tmp in sweep_temporaries(path):
                log.info("removed %s, left by an interrupted run", tmp)


def code_version() -> str:
    """Package version plus the git commit of the checkout, when there is one."""
    root = Path(__file__).resolve().parents[3]  # src/dpsad/jobs/stage.py -> the checkout
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


def optional_input(value) -> str | None:
    """The single path of an optional named input (an empty list when absent, a path or a one-element list)."""
    return None if not value else value if isinstance(value, str) else str(list(value)[0])


def stage_settings(snakemake):
    """The typed settings of a training job (:mod:`dpsad.config.settings`), execution-only fields included, built
    from the config by the function that gives the rule's params.

    A job whose ``params.settings`` (what Snakemake decided to run on) differ stops before reading anything.
    ``inputs_sha256`` joins them: a resume checkpoint stores the settings' digest, so a model is never resumed
    with steps taken on data, labels or weights that have changed since."""
    from ..config import settings_for_job, with_inputs

    settings = settings_for_job(snakemake.config, snakemake.rule, snakemake.wildcards)
    if settings.result_view() != snakemake.params.settings:
        raise DpsadError(f"{snakemake.rule}: the settings in its params differ from those the configuration gives "
                         f"({type(settings).__name__}), expected the same configuration for the rule and its script")
    return with_inputs(settings, inputs_sha256(list(snakemake.input)))


def inputs_sha256(paths) -> str:
    """sha256 over (position, sha256 of the content) of each file in ``paths``, in order; folders by their files."""
    total = hashlib.sha256()
    for number, path in enumerate(paths):
        path = Path(path)
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for file in files:
            stat = file.stat()
            name = file.relative_to(path).as_posix() if path.is_dir() else ""
            total.update(f"{number}\0{name}\0{_file_sha256(str(file.resolve()), stat.st_size, stat.st_mtime_ns)}\n".encode())
    return total.hexdigest()


@functools.lru_cache(maxsize=256)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """The content digest of a file, computed once per job for a given size and modification time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
