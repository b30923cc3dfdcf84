"""The user's documents: a short README without the lab notebook, docs pages that exist, links that resolve."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
         ROOT / "config" / "README.md"]
HISTORY = re.compile(r"\b[0-9a-f]{7,40}\b|\bround\b|\bissue \d+|\bissues? #?\d+", re.I)


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", target)]


def test_the_readme_is_a_users_document():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 350
    found = [m.group(0) for m in HISTORY.finditer(re.sub(r"```.*?```", "", text, flags=re.S))
             if not m.group(0).isdigit()]
    assert not found, f"commit hashes, rounds or issue numbers in the README: {found}"


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
