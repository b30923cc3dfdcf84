"""The user's documents: a short README without the lab notebook, docs pages that exist, links that resolve."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
         ROOT / "config" / "README.md"]
HISTORY = re.compile(r"\b[0-9a-f]{7,40}\b|\bround\b|\bround\d+|issue[ _]?#?\d+|\bissues #?\d+", re.I)
# The user's documents: the lab notebook (rounds, commit hashes, issue numbers) lives in benchmarks/rounds.md only.
USER_DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "config" / "README.md",
                  *sorted((ROOT / "config").rglob("*.yaml"))]


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", target)]


def history_in(path: Path) -> list[str]:
    """Commit hashes, rounds and issue numbers in a document (code blocks aside)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m.group(0) for m in HISTORY.finditer(text) if not m.group(0).isdigit()]


def test_the_readme_is_a_users_document():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350


def test_no_users_document_carries_the_lab_notebook():
    found = {str(path.relative_to(ROOT)): history_in(path) for path in USER_DOCUMENTS if history_in(path)}
    assert not found, f"commit hashes, rounds or issue numbers (they belong in benchmarks/rounds.md): {found}"
    # the check itself finds each kind
    sample = ROOT / "benchmarks" / "rounds.md"
    assert {"round", "c4b1642"} <= {m.lower() for m in history_in(sample)} and any(
        m.lower().startswith("issue") for m in history_in(sample))


def test_the_readme_links_at_least_three_docs_pages_and_every_link_resolves():
    linked = {target.split("#")[0] for target in links(ROOT / "README.md")}
    assert len({t for t in linked if t.startswith("docs/") and t.endswith(".md")}) >= 3, linked
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in PAGES for target in links(page)
              if not (page.parent / target.split("#")[0]).exists()]
    assert not broken, broken


def test_the_demo_configuration_carries_no_history():
    text = (ROOT / "config" / "config.yaml").read_text()
    assert not re.search(r"\bissue\b|\bround\b|#\d+", text, re.I)


def test_the_examples_say_what_the_demo_uses():
    """Comments of the form `(the demo uses N)` name the demo's own value of that key."""
    demo = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    checked = 0
    for path in sorted((ROOT / "config").rglob("*.yaml")):
        section = None
        for line in path.read_text().splitlines():
            if re.match(r"^\w", line):
                section = line.split(":")[0]
            said = re.search(r"^\s+(\w+):.*\(the demo uses (\d+)\)", line)
            if said and section in demo:
                assert demo[section][said.group(1)] == int(said.group(2)), (path.name, line)
                checked += 1
    assert checked >= 2
