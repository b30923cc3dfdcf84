"""Check that every config file on a Snakemake command line is readable YAML, naming the file when it is not.

Snakemake reads ``--configfile`` files before the workflow's own checks run,
and its message for a broken one ("Config file is not valid JSON or YAML")
does not say which file.  ``make demo`` runs ``python -m dpsad.jobs.configfiles
$(ARGS)`` first, so a typo there is one line with the file, line and column.
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
        if arg.startswith("-"):
            taking = arg in CONFIG_OPTIONS
            if "=" in arg and arg.split("=", 1)[0] in CONFIG_OPTIONS:
                files.append(arg.split("=", 1)[1])
                taking = False
        elif taking:
            files.append(arg)
    return files


def check(path: str) -> str | None:
    """None when ``path`` is a readable YAML mapping, else the one-line message."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        return f"config file {path}: cannot be read ({err.strerror}), expected a YAML file"
    try:
        loaded = yaml.safe_load(text)
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
