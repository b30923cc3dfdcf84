"""The schema is the one description of the configuration: docs/configuration.md's key tables are written from it."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from dpsad.config.reference import TABLES, format_default, key_rows, with_tables
from dpsad.config.schema import load_schema
from dpsad.errors import DpsadError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"


@pytest.mark.e2e  # starts a Python process
def test_the_documented_tables_are_the_schemas_as_a_user_runs_the_check():
    result = subprocess.run([sys.executable, "-m", "dpsad.config.reference", "--check", str(DOC)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert DOC.read_text().count("<!-- keys: ") == len(TABLES)  # every table is in the page


def test_every_section_of_the_schema_has_a_table_and_every_key_its_help():
    schema = load_schema()
    sections = {f"$defs/{name}" for name, node in schema["$defs"].items() if "properties" in node}
    sections |= {f"properties/{name}" for name, node in schema["properties"].items() if "properties" in node}
    assert sections <= set(TABLES.values())
    for pointer in TABLES.values():
        assert all(meaning for _, _, meaning in key_rows(schema, pointer))


def test_a_new_default_or_key_in_the_schema_changes_the_page_and_a_key_without_help_is_refused():
    schema = load_schema()
    text = DOC.read_text()
    changed = copy.deepcopy(schema)
    changed["$defs"]["dp_training"]["properties"]["clip_norm"]["default"] = 2.5
    written = with_tables(text, changed)
    assert written != text and "| `clip_norm` | 2.5 |" in written
    changed["$defs"]["dp_training"]["properties"]["new_key"] = {"type": "integer", "default": 3}
    with pytest.raises(DpsadError, match="new_key has no description"):
        with_tables(text, changed)


def test_defaults_read_as_yaml():
    assert [format_default(v) for v in (None, True, "auto", 1e-5, 2e-4, 0.028, 200, [1, 2, 2], {}, ["dpsad"])] == \
        ["null", "true", "`auto`", "1e-5", "2e-4", "0.028", "200", "[1, 2, 2]", "", "[dpsad]"]
