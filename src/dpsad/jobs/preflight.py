"""Clear the Snakemake lock a killed run left in a working directory, when no live run owns it.

``make demo`` calls ``python -m dpsad.jobs.preflight`` before Snakemake: it checks that the
working folders can be written (:func:`work_folder_problem`), and after a
kill (Ctrl-C twice, an OOM kill, a closed laptop) the README's own command
resumes instead of stopping on "Directory cannot be locked". It only looks at
processes on this machine (``/proc``): on a cluster, where the head job may run
elsewhere, use ``snakemake --unlock`` by hand as the README says.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def is_snakemake(argv: list[str]) -> bool:
    """A Snakemake command line: ``snakemake ...``, ``python .../snakemake ...`` or ``python -m snakemake ...``."""
    head = [Path(arg).name for arg in argv[:3]]
    return "snakemake" in head or ("-m" in argv[:3] and "snakemake" in argv[:4])


def live_snakemake_pids(workdir: Path, proc: Path = Path("/proc")) -> list[int] | None:
    """PIDs of Snakemake processes whose working directory is ``workdir``; ``None`` when /proc is unavailable."""
    if not proc.is_dir():
        return None
    workdir = workdir.resolve()
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = Path(os.readlink(entry / "cwd")).resolve()
        except OSError:  # gone, or another user's process
            continue
        if cwd == workdir and is_snakemake(argv):
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


WORK_FOLDERS = (".snakemake", "results", "logs", "release")  # what Snakemake and the stages write


def work_folder_problem(workdir: Path, folders=(), writable: bool = True) -> str | None:
    """What stops Snakemake from writing its folders in ``workdir`` as one line, or None.

    Checks :data:`WORK_FOLDERS` and ``folders`` (relative paths, e.g. results/<dataset>/<run>): a file where
    one of them or a folder above it should be; with ``writable``, also a folder this user cannot write to
    (a read-only file system).  Checked before Snakemake touches them, whose own errors for these are
    tracebacks."""
    if writable and not os.access(workdir, os.W_OK | os.X_OK):
        return f"cannot write in {workdir}, expected a working folder this user can write to (or a read-only file system?)"
    for name in (*WORK_FOLDERS, *folders):
        path = workdir / name
        for step in (*reversed(Path(name).parents[:-1]), Path(name)):
            if (workdir / step).exists() and not (workdir / step).is_dir():
                return f"{workdir / step} is a file, expected a folder (or nothing) there: move the file away"
        if writable and path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            return f"cannot write in {path}, expected a folder this user can write to (or a read-only file system?)"
    return None


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def output_folder_problem(paths, workdir: Path | None = None) -> str | None:
    """What stops the jobs about to run from writing ``paths`` (their outputs, logs and benchmarks), as one line,
    or None: a folder on a read-only file system or one this user cannot write to, where the file goes or where
    its folder would be created.  Snakemake's own answer to both, when it removes an old output or creates a
    folder before the job starts, is a traceback."""
    workdir = Path(workdir or Path.cwd())
    checked: set[Path] = set()
    for name in paths:
        folder = _nearest_existing((workdir / str(name)).parent)
        if folder in checked:
            continue
        checked.add(folder)
        if not folder.is_dir():
            return f"{folder} is a file, expected a folder (or nothing) there: move the file away"
        if not os.access(folder, os.W_OK | os.X_OK):
            try:
                read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
            except OSError:
                read_only = False
            why = "it is on a read-only file system" if read_only else "this user may not write in it"
            return (f"cannot write in {folder} ({why}), expected a folder this user can write to: the jobs about to "
                    f"run write {name} there")
    return None


def stage_folders(datasets, runs) -> list[str]:
    """The folders the workflow writes its stages' outputs to, for every dataset and run."""
    folders = []
    for dataset in datasets:
        folders += [f"results/{dataset}", f"results/{dataset}/teacher", f"results/{dataset}/moco", f"logs/{dataset}",
                    f"release/{dataset}"]
        folders += [f"results/{dataset}/{run}" for run in runs]
    return folders


def main() -> None:
    problem = work_folder_problem(Path.cwd())
    if problem:
        sys.exit(f"error: {problem}")
    message = clear_stale_lock(Path.cwd())
    if message != "no lock":
        print(f"dpsad: {message}", file=sys.stderr)


if __name__ == "__main__":
    main()
