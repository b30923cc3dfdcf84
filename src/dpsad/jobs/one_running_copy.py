"""One running copy per stage, and no job outliving its Snakemake.

Failure prevented: ``snakemake`` is killed (SIGKILL, a closed terminal) while a job runs; the job lives on, and
a rerun starts a second copy beside it: both train on the private records and write the same files.

- :func:`watch_snakemake` ends the job within a second of the death of the Snakemake the Snakefile named to its
  jobs (:func:`export_snakemake_identity`; where the environment lost it, the outermost Snakemake among the job's
  ancestors), also when it died before the job started; a job whose outputs are all
  written is left to finish its books (:data:`BOOKKEEPING`), so they are kept rather than trained again.
- :func:`hold_outputs` holds an exclusive lock keyed by the stage's first output for the whole job (the kernel
  drops it however the job ends): a second copy stops at once, naming the holder.

The training processes a job starts end with it (:func:`dpsad.runtime.distributed.die_with_parent`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import sys
import threading
import time
from pathlib import Path

from ..errors import DpsadError

LOCK_FOLDER = Path(".snakemake") / "dpsad-locks"  # in Snakemake's working directory, never under results/
SNAKEMAKE_ENV = "DPSAD_SNAKEMAKE"  # host:pid:start:SLURM job of the Snakemake that started the job
BOOKKEEPING = threading.Lock()  # held while a job writes its books; the watcher stops a job only outside it


def keyed_path(folder: Path, output, suffix: str = "") -> Path:
    """``folder/<name>.<digest of the absolute path><suffix>``: the same file for every copy of a stage."""
    key = hashlib.sha256(str(Path(output).resolve()).encode()).hexdigest()[:20]
    return folder / f"{Path(output).name}.{key}{suffix}"


def lock_path(output) -> Path:
    return keyed_path(LOCK_FOLDER, output, ".lock")


@contextlib.contextmanager
def hold_outputs(outputs: list[str]):
    """Hold the lock of the stage writing ``outputs``; DpsadError naming the holder when another process holds it."""
    if not outputs:
        yield
        return
    path = lock_path(outputs[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + 2.0
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "?"
            # a holder that has just exited frees its lock a moment after its files are closed
            if alive(holder) or time.monotonic() > deadline:
                raise DpsadError(f"another process (pid {holder}) is running this stage (writing {outputs[0]}), "
                                 "expected one copy: it stops within a second once its Snakemake is gone; "
                                 "rerun after it has ended")
            time.sleep(0.05)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def _stat(pid) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first, start time at 19), or None when gone."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def alive(pid, start: str | None = None) -> bool:
    """Whether ``pid`` runs, not as a zombie (killed, never collected: a container's init may not), and when
    ``start`` is given, started then (a reused pid has another start time)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and start in (None, fields[19])


def exported_snakemake(environ=os.environ) -> tuple[int, str] | None:
    """(pid, start time) of the Snakemake named in ``environ``, when named on this host and in this SLURM job (a
    cluster job's submitter may end while the job runs on; the job's own Snakemake runs inside it), else None."""
    parts = environ.get(SNAKEMAKE_ENV, "").rsplit(":", 3)
    if len(parts) != 4 or (parts[0], parts[3]) != (socket.gethostname(), environ.get("SLURM_JOB_ID", "")):
        return None
    return (int(parts[1]), parts[2]) if parts[1].isdigit() else None


def snakemake_ancestor(pid: int | None = None) -> tuple[int, str] | None:
    """(pid, start time) of the outermost Snakemake among this process's ancestors, or None.  Failure prevented: a
    job whose environment lost the exported identity (a launcher that clears it: ``env -i``, ``su -``, a container's
    clean environment) would run on unwatched after a kill of its Snakemake."""
    found, pid = None, os.getppid() if pid is None else pid
    while pid > 1 and (fields := _stat(pid)) is not None:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
        except OSError:
            break
        if any(part.rsplit(b"/", 1)[-1].startswith(b"snakemake") for part in command):
            found = (pid, fields[19])
        pid = int(fields[1])
    return found


def export_snakemake_identity(environ=os.environ) -> None:
    """Called by the Snakefile: name this Snakemake to the jobs, unless an outer one of this host and SLURM job (a
    local run's, whose Snakemake children start the jobs) has named itself already."""
    fields = _stat(os.getpid())  # None without /proc: no watching there
    if exported_snakemake(environ) is None and fields is not None:
        environ[SNAKEMAKE_ENV] = f"{socket.gethostname()}:{os.getpid()}:{fields[19]}:{environ.get('SLURM_JOB_ID', '')}"


def watch_snakemake(outputs: list[str] = (), log=None, poll: float = 0.5) -> tuple[int, str] | None:
    """End this job (exit code 1, one line in its log) within ``poll`` s of its Snakemake's death; returns the
    (pid, start) watched, None outside a workflow run."""
    watched = exported_snakemake() or snakemake_ancestor()
    if watched is not None:
        if not alive(*watched):
            _stop_when_gone(watched, [], log, poll)  # gone before this job could start watching it
        threading.Thread(target=_stop_when_gone, args=(watched, list(outputs), log, poll), daemon=True).start()
    return watched


def _stop_when_gone(watched: tuple[int, str], outputs: list[str], log, poll: float) -> None:
    while alive(*watched):
        time.sleep(poll)
    BOOKKEEPING.acquire()  # released only when the job is left to finish
    if outputs and all(Path(output).exists() for output in outputs):
        BOOKKEEPING.release()
        return
    message = (f"the Snakemake process that started this job (pid {watched[0]}) has ended, expected a live "
               "Snakemake: job stopped; a rerun resumes from its last checkpoint")
    try:
        if log is not None:
            log.error(message)
        print(f"error: {message}", file=sys.stderr, flush=True)
    finally:
        os._exit(1)
