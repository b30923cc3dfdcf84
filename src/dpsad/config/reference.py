"""The key tables of ``docs/configuration.md``, written from the configuration schema.

The schema (``workflow/schemas/config.schema.yaml``) is the one description of the configuration: each key's
type, allowed values, default and one-line help (``description``).  Validation reads it
(:mod:`dpsad.config.schema`), the typed settings are checked equal to it (``tests/test_settings.py``), and the
documentation's tables are written from it here, between ``<!-- keys: NAME -->`` and ``<!-- end keys -->``, so
that a key added, renamed or re-defaulted in the schema cannot leave the documentation behind
(``tests/test_configuration_reference.py`` fails until this is run)::

    python -m dpsad.config.reference docs/configuration.md           # rewrite the tables
    python -m dpsad.config.reference --check docs/configuration.md   # exit 1 when they differ
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..errors import DpsadError
from .schema import load_schema

# Each table: the schema object whose keys it lists ("" is the top level).
TABLES = {
    "top": "", "data": "$defs/dataset", "public": "$defs/public_source", "model": "$defs/model",
    "diffusion": "properties/diffusion", "teacher": "$defs/teacher", "student": "$defs/student",
    "dp_sizing": "properties/dp_sizing", "dp": "$defs/dp_training", "dpgan": "$defs/dpgan", "pe": "$defs/pe",
    "sample": "$defs/sample", "evaluate": "$defs/evaluate", "run": "$defs/run", "central": "properties/central",
    "moco": "properties/moco", "kmeans": "properties/kmeans", "distributed": "properties/distributed",
    "audit": "properties/audit", "sweep": "properties/sweep", "release": "properties/release",
}
BLOCK = re.compile(r"(<!-- keys: (\w+) -->\n)(.*?)(<!-- end keys -->)", re.S)


def _node(schema: dict, pointer: str) -> dict:
    node = schema
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return node


def _properties(schema: dict, node: dict) -> dict:
    while "$ref" in node and "properties" not in node:
        node = _node(schema, node["$ref"].lstrip("#/"))
    return node.get("properties", {})


def format_default(value) -> str:
    """A default as the YAML a user would write: null, true, `text`, 1e-5, [1, 2]; an empty section blank."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, float) and value != 0 and abs(value) < 1e-3:
        mantissa, exponent = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_default(v).strip("`") for v in value) + "]"
    if isinstance(value, dict):
        return "" if not value else "{" + ", ".join(f"{k}: {format_default(v).strip('`')}" for k, v in value.items()) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def key_rows(schema: dict, pointer: str) -> list[tuple[str, str, str]]:
    """(keys, defaults, meaning) of each row of a table; nested objects of a section as ``parent.key`` rows, and
    neighbouring keys with the same help in one row.  A key without help is an error."""
    node = _node(schema, pointer)
    rows: list[tuple[list[str], list[str], str]] = []

    def add(name: str, prop: dict, required: bool) -> None:
        help_text = " ".join(str(prop.get("description", "")).split())
        if not help_text:
            raise DpsadError(f"the schema's key {pointer or 'top'}: {name} has no description, expected one line of help")
        default = "required" if required else format_default(prop["default"]) if "default" in prop else ""
        if rows and rows[-1][2] == help_text:
            rows[-1][0].append(name)
            rows[-1][1].append(default)
        else:
            rows.append(([name], [default], help_text))

    for name, prop in _properties(schema, node).items():
        add(name, prop, name in node.get("required", ()))
        if pointer and "properties" in prop and "$ref" not in prop:  # a nested object of a section: its keys too
            for child, child_prop in prop["properties"].items():
                add(f"{name}.{child}", child_prop, child in prop.get("required", ()))
    table = []
    for names, defaults, help_text in rows:
        shown = ", ".join(defaults) if any(defaults) else ""
        table.append((", ".join(f"`{n}`" for n in names), shown, help_text))
    return table


def render_table(rows: list[tuple[str, str, str]]) -> str:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    lines += [f"| {keys} | {default} | {meaning.replace('|', '/')} |" for keys, default, meaning in rows]
    return "\n".join(lines) + "\n"


def with_tables(text: str, schema: dict) -> str:
    """``text`` with every marked table written from ``schema``; an unknown table name is an error."""

    def table(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise DpsadError(f"<!-- keys: {name} -->: unknown table, expected one of {', '.join(TABLES)}")
        return match.group(1) + render_table(key_rows(schema, TABLES[name])) + match.group(4)

    return BLOCK.sub(table, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("markdown", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 when the tables differ from the schema")
    args = parser.parse_args(argv)
    text = args.markdown.read_text()
    written = with_tables(text, load_schema())
    if args.check:
        if written != text:
            print(f"error: {args.markdown}'s key tables differ from the schema, expected "
                  f"python -m dpsad.config.reference {args.markdown}", file=sys.stderr)
            return 1
        return 0
    if written != text:
        args.markdown.write_text(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
