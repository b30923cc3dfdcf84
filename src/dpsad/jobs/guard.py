"""One running copy per stage: an exclusive lock on the stage's outputs, and a stop when Snakemake is gone.

When the ``snakemake`` process is killed, a job it started can live on; a
rerun would then start a second copy of the same job beside that orphan, and
both would train on the private records and write the same files.  Two guards:

- :func:`hold_outputs` takes an exclusive ``fcntl`` lock keyed by the stage's
  first output for the whole job, before anything is swept or written.  A
  second copy stops at once with "another process (pid N) is running this
  stage"; the kernel drops the lock when the holder exits, however it exits.
- :func:`watch_snakemake` starts a thread that polls the Snakemake which
  started the job (twice a second) and ends the job within a second of its
  death, in every stage (the Snakefile exports that Snakemake's identity to
  its jobs, :func:`export_snakemake_identity`, so a job whose Snakemake died
  before the job reached its watcher stops at once): a rerun resumes from the last resume checkpoint, and
  every step is trained (and counted) once.  The thread waits for
  :data:`BOOKKEEPING` so that no job dies half-way through its books (the
  spending log).  Under a cluster executor the job's own Snakemake runs
  inside the cluster job, so jobs there stop when the cluster stops them.
- The training processes a job starts through torch's launcher end with their
  parent (:func:`dpsad.runtime.distributed.die_with_parent`), and hold no lock: the job holds it for them.
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
from typing import Iterator

from ..errors import DpsadError
from .preflight import is_snakemake

LOCK_FOLDER = Path(".snakemake") / "dpsad-locks"  # in Snakemake's working directory, never under results/
def lock_path(output: str | os.PathLike) -> Path:
    """The lock file of a stage, named after its first output (absolute, so every copy finds the same file)."""
    key = hashlib.sha256(str(Path(output).resolve()).encode()).hexdigest()[:20]
    return LOCK_FOLDER / f"{Path(output).name}.{key}.lock"


@contextlib.contextmanager
def hold_outputs(outputs: list[str]) -> Iterator[Path | None]:
    """Hold the exclusive lock of the stage writing ``outputs`` (no outputs: no lock).

    Raises DpsadError naming the holder's pid when another process holds it.
    """
    if not outputs:
        yield None
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
                if time.monotonic() < deadline and not _process_runs(holder):
                    time.sleep(0.05)
                    continue
            raise DpsadError(f"another process (pid {holder}) is running this stage (writing {outputs[0]}), "
                             "expected one copy: it stops within a second once its Snakemake is gone; "
                             "rerun after it has ended")
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield path


def _stat_fields(pid, proc: Path) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, parent, ...), or None when it is gone."""
    try:
        stat = (proc / str(int(pid)) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def _process_runs(pid: str, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` (text, as a lock file holds it) is a live process: not gone, not a zombie."""
    fields = _stat_fields(pid, proc)
    return fields is not None and fields[0] != "Z"


def _parent_and_start(pid: int, proc: Path) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks) of ``pid`` from /proc, or None when it is gone."""
    fields = _stat_fields(pid, proc)
    return None if fields is None else (int(fields[1]), fields[19])


def _runs_snakemake(pid: int, proc: Path) -> bool:
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return is_snakemake(argv)


def outermost_snakemake(pid: int | None = None, proc: Path = Path("/proc")) -> tuple[int, str] | None:
    """(pid, start time) of the outermost Snakemake among the ancestors of ``pid`` (default: this process).

    Snakemake runs a local job through a Snakemake child of its own, which a
    kill of the parent leaves running: the outermost one is the user's.
    """
    found = None
    current = os.getpid() if pid is None else pid
    for _ in range(64):
        info = _parent_and_start(current, proc)
        if info is None or info[0] <= 1:
            break
        parent = info[0]
        if _runs_snakemake(parent, proc):
            parent_info = _parent_and_start(parent, proc)
            if parent_info is not None:
                found = (parent, parent_info[1])
        current = parent
    return found


SNAKEMAKE_ENV = "DPSAD_SNAKEMAKE"  # host:pid:start:SLURM job of the Snakemake that started the job (the Snakefile sets it)


def _context(environ) -> tuple[str, str]:
    """(host, SLURM job id or ''): where an exported identity may be trusted.  A cluster job runs on another host
    or in another SLURM job than the Snakemake that submitted it: that one may end while the job runs on."""
    return socket.gethostname(), environ.get("SLURM_JOB_ID", "")


def exported_snakemake(environ=os.environ) -> tuple[int, str] | None:
    """(pid, start time) of the Snakemake the Snakefile exported in ``environ``, when it is of this host and
    SLURM job; else None."""
    value = environ.get(SNAKEMAKE_ENV, "")
    parts = value.rsplit(":", 3)
    if len(parts) != 4 or (parts[0], parts[3]) != _context(environ) or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2]


def export_snakemake_identity(environ=os.environ, proc: Path = Path("/proc")) -> None:
    """Called by the Snakefile: give every job the identity of the user's Snakemake, so that a job reparented
    before it could walk its ancestors (Snakemake killed in the job's first seconds) still finds it gone.
    An outer Snakemake of the same host and SLURM job (the one that starts local jobs through Snakemake
    children of its own) has exported it already and is kept."""
    if exported_snakemake(environ) is not None:
        return
    info = _parent_and_start(os.getpid(), proc)
    if info is not None:
        host, job = _context(environ)
        environ[SNAKEMAKE_ENV] = f"{host}:{os.getpid()}:{info[1]}:{job}"


_WATCHED: tuple[int, str] | None = None
BOOKKEEPING = threading.Lock()  # held while a job writes its books; the watcher stops the job only outside it
POLL_SECONDS = 0.5


def snakemake_alive(watched: tuple[int, str], proc: Path = Path("/proc")) -> bool:
    """Whether the process (pid, start time) still runs: a reused pid has another start time, and a killed
    process whose parent has not collected it (a container's init may never) is a zombie, state Z."""
    fields = _stat_fields(watched[0], proc)
    return fields is not None and fields[0] != "Z" and fields[19] == watched[1]


def watch_snakemake(outputs: list[str] = (), log=None, poll: float = POLL_SECONDS) -> tuple[int, str] | None:
    """Remember the Snakemake that started this job and end the job within ``poll`` s of its death.

    Called once per job by :func:`dpsad.jobs.stage.run_stage`.  The job ends with exit code 1 after one line
    in its log; the training processes it started end with it (:func:`die_with_parent`).  A job whose
    ``outputs`` all exist by then has finished its work: it is left to finish its books (a second or so), so
    that its complete outputs are kept (:mod:`dpsad.jobs.finished`) rather than trained again."""
    global _WATCHED
    exported = exported_snakemake()
    _WATCHED = exported if exported is not None else outermost_snakemake()
    if exported is not None and not snakemake_alive(exported):
        _stop_when_gone(exported, [], log, poll)  # gone before this job could start watching it
    if _WATCHED is not None:
        threading.Thread(target=_stop_when_gone, args=(_WATCHED, list(outputs), log, poll),
                         name="dpsad-snakemake-watch", daemon=True).start()
    return _WATCHED


def _stop_when_gone(watched: tuple[int, str], outputs: list[str], log, poll: float) -> None:
    while snakemake_alive(watched):
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
