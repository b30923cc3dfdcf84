"""A checksum of a dataset's source files by content, not by where they are.

``prepare_data`` has this checksum as a parameter and records it in ``data.h5``: replacing a file under
the same path reruns the stage (and, through it, every stage after it), while moving the data and
pointing ``root`` or ``path`` at the new place reruns nothing.  ``root``/``path`` themselves are kept
out of the stage's parameters (:data:`dpsad.config.LOCATION_KEYS`).

Each file's sha256 is cached under its absolute path, size and modification time, so the workflow
re-reads only the files that are new or changed since it last looked (a moved folder is read once).
Built-in sources that ship inside pinned packages (``mnist5k``, ``font_digits``, ``font_letters``) have no files: their
checksum is ``None``.  A source whose files are missing also gets ``None``; ``prepare_data`` then stops
with the reader's own message.

Privacy: the checksum is computed from the private records without noise, so it identifies them exactly.
It stays with the curator (``data.h5`` and Snakemake's records under ``.snakemake/``); nothing that leaves
``release/`` carries it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..files.atomic import atomic_path
from .sources import IMAGE_SUFFIXES

CHUNK = 1 << 20
CACHE_PATH = Path(".snakemake") / "dpsad-source-checksums.json"  # per-file hashes, in the workflow's directory


def _files_in(folder: Path, suffixes: set[str] | None = None) -> list[Path]:
    """The files directly in ``folder`` (with one of ``suffixes``, when given)."""
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.is_file() and (suffixes is None or p.suffix.lower() in suffixes)]


def source_files(section: dict) -> tuple[Path, list[Path]] | None:
    """(base folder, the files a source section reads) or None for a source without files of its own."""
    source, root = section.get("source"), section.get("root")
    if source in ("npz", "hdf5"):
        path = Path(section.get("path") or "")
        return (path.parent, [path]) if path.is_file() else None
    if not root:
        return None
    root = Path(root)
    if source in ("mnist", "fashion_mnist"):
        return root, _files_in(root / ("MNIST" if source == "mnist" else "FashionMNIST") / "raw")
    if source == "celeba":
        base = root / "celeba" if (root / "celeba").is_dir() else root
        tables = [base / "list_attr_celeba.txt", base / "list_eval_partition.txt"]
        return root, [t for t in tables if t.is_file()] + _files_in(base / "img_align_celeba", IMAGE_SUFFIXES)
    if source == "imagefolder":  # root/<class>/<image>, as the reader sees it
        classes = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        return root, [f for folder in classes for f in _files_in(folder, IMAGE_SUFFIXES)]
    return None


def _file_digest(path: Path, cache: dict) -> str:
    stat = path.stat()
    key = str(path.resolve())
    cached = cache.get(key)
    if cached and cached[0] == stat.st_size and cached[1] == stat.st_mtime_ns:
        return cached[2]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    cache[key] = [stat.st_size, stat.st_mtime_ns, digest.hexdigest()]
    return cache[key][2]


def _load_cache(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a damaged cache only costs a re-read


def _save_cache(path: Path | None, cache: dict) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(cache))
    except OSError:
        pass  # a read-only or full working directory: the checksum is still right, only not cached


def content_checksum(section: dict, cache_path: Path | None = None) -> str | None:
    """sha256 over (path relative to the source's base, sha256 of the content) of every file it reads.

    ``section``: a ``data.<name>`` config section; its ``public`` section, when it is a separate source with
    files, is included.  None when neither has files of its own.
    """
    parts = [("private", section)]
    if isinstance(section.get("public"), dict):
        parts.append(("public", section["public"]))
    cache = _load_cache(cache_path)
    before = dict(cache)
    total = hashlib.sha256()
    any_files = False
    for name, part in parts:
        found = source_files(part)
        if not found:
            continue
        base, files = found
        for path in sorted(files, key=lambda p: os.path.relpath(p, base)):
            any_files = True
            total.update(f"{name}\0{os.path.relpath(path, base)}\0{_file_digest(path, cache)}\n".encode())
    if cache != before:
        _save_cache(cache_path, cache)
    return total.hexdigest() if any_files else None
