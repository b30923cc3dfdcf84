"""Checks before Snakemake touches a working folder, each one line where Snakemake would stop with a traceback.

- :func:`folder_problem`: a file where a folder goes, or a folder the jobs cannot write (a read-only file system).
- :func:`clear_stale_lock`: a killed run (Ctrl-C twice, an OOM kill, a closed laptop) leaves Snakemake's lock,
  and the README's command would stop on "Directory cannot be locked"; removed when no Snakemake runs in the
  folder (this machine's /proc: on a cluster, where the head job may run elsewhere, ``snakemake --unlock``).

``make demo`` runs ``python -m dpsad.jobs.preflight`` (both, on the working folder) before Snakemake.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WORK_FOLDERS = (".snakemake", "results", "logs", "release")  # what Snakemake and the stages write


def folder_problem(folders, writable: bool = True) -> str | None:
    """One line for the first of ``folders`` (relative to the working folder) that is a file or lies under one,
    or with ``writable``, that this user cannot write in or create; else None."""
    for name in folders:
        folder = Path.cwd() / name
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            return f"{folder} is a file, expected a folder (or nothing) there: move the file away"
        if writable and not os.access(folder, os.W_OK | os.X_OK):
            why = "a read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "no permission"
            return f"cannot write in {folder} ({why}), expected a folder this user can write to"
    return None


def stage_folders(datasets, runs) -> list[str]:
    """The folders the stages write to, for every dataset and run (checked before Snakemake builds its plan)."""
    return [*WORK_FOLDERS, *(f"{top}/{dataset}" for top in ("logs", "release") for dataset in datasets),
            *(f"results/{dataset}/{sub}" for dataset in datasets for sub in ("teacher", "moco", *runs))]


def is_snakemake(argv: list[str]) -> bool:
    """A Snakemake command line: ``snakemake ...``, ``python .../snakemake ...`` or ``python -m snakemake ...``."""
    head = [Path(arg).name for arg in argv[:3]]
    return "snakemake" in head or ("-m" in argv[:3] and "snakemake" in argv[:4])


def live_snakemake_pids(workdir: Path, proc: Path = Path("/proc")) -> list[int] | None:
    """PIDs of Snakemake processes whose working directory is ``workdir``; ``None`` when /proc is unavailable."""
    if not proc.is_dir():
        return None
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = Path(os.readlink(entry / "cwd")).resolve()
        except OSError:  # gone, or another user's process
            continue
        if cwd == workdir.resolve() and is_snakemake(argv):
            pids.append(int(entry.name))
    return pids


def clear_stale_lock(workdir: Path) -> str:
    """Remove ``.snakemake/locks/*`` unless a Snakemake process runs in ``workdir``; returns what was done."""
    locks = sorted((workdir / ".snakemake" / "locks").glob("*.lock"))
    if not locks:
        return "no lock"
    pids = live_snakemake_pids(workdir)
    if pids is None:
        return "lock kept: cannot see running processes here; if no run is active, run `snakemake --unlock`"
    if pids:
        return f"lock kept: Snakemake is running in this directory (pid {', '.join(map(str, pids))})"
    for lock in locks:
        lock.unlink(missing_ok=True)
    return "removed the lock of an interrupted run (no Snakemake process is running here)"


def main() -> None:
    if problem := folder_problem(WORK_FOLDERS):
        sys.exit(f"error: {problem}")
    if (message := clear_stale_lock(Path.cwd())) != "no lock":
        print(f"dpsad: {message}", file=sys.stderr)


if __name__ == "__main__":
    main()
