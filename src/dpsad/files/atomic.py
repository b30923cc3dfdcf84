"""Write files atomically: to a temporary sibling first, then rename.

A killed or failing stage therefore never leaves a partial artifact that
Snakemake (or a downstream user) could mistake for a finished one.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def readable_per_umask(path: str | os.PathLike) -> None:
    """Give a file written through a temporary (mode 0600), or a folder made by mkdtemp (0700), the mode a plain
    write would have had (0666 or 0777 minus the umask): released files are for the group or the world, as the
    curator's umask says."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~umask)


def temporaries_of(path: str | os.PathLike) -> list[Path]:
    """The temporary siblings :func:`atomic_path` creates for ``path`` (``.<name>.<random>.tmp``)."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    return [p for p in path.parent.glob(f".{glob.escape(path.name)}.*.tmp") if p.name.count(".") == path.name.count(".") + 3]


def sweep_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove temporaries of ``path`` left by a killed writer; returns what was removed.

    Only the one job that writes ``path`` calls this, so no live writer owns them:
    a SIGKILL during a write is the only way they outlive their ``atomic_path``.
    """
    removed = []
    for tmp in temporaries_of(path):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")
