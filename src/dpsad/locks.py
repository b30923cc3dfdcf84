"""Clear the Snakemake lock a killed run left in a working directory, when no live run owns it.

``make demo`` calls ``python -m dpsad.locks`` before Snakemake, so that after a
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


def main() -> None:
    message = clear_stale_lock(Path.cwd())
    if message != "no lock":
        print(f"dpsad: {message}", file=sys.stderr)


if __name__ == "__main__":
    main()
