"""Name a broken ``--configfile`` in one line: ``python -m dpsad.config.files ARGS`` (``make demo`` runs it first).

Failure prevented: Snakemake reads config files before the workflow's own checks, and answers a missing one
with a traceback and a broken one with "Config file is not valid JSON or YAML", naming no file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

CONFIG_OPTIONS = ("--configfile", "--configfiles")


def config_files(argv: list[str]) -> list[str]:
    """The files given to ``--configfile``/``--configfiles`` (each takes every argument up to the next option)."""
    files, taking = [], False
    for arg in argv:
        option, equals, value = arg.partition("=")
        if arg.startswith("-"):
            taking = option in CONFIG_OPTIONS and not equals
            files += [value] if equals and option in CONFIG_OPTIONS else []
        elif taking:
            files.append(arg)
    return files


def check(path: str) -> str | None:
    """None when ``path`` is a readable YAML mapping, else the one-line message."""
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        return f"config file {path}: cannot be read ({err.strerror}), expected a YAML file"
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        return f"config file {path}: {problem}{where}, expected valid YAML (spaces, not tabs, for indentation)"
    if loaded is not None and not isinstance(loaded, dict):
        return f"config file {path}: holds a {type(loaded).__name__}, expected a mapping of keys at the top level"
    return None


def main(argv: list[str] | None = None) -> int:
    errors = [message for path in config_files(sys.argv[1:] if argv is None else argv) if (message := check(path))]
    for message in errors:
        print(f"error: {message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
