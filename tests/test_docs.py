"""The user's documents: a short README without the lab notebook, docs pages that exist, links that resolve."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
         ROOT / "experiments" / "README.md", ROOT / "config" / "README.md"]
# The lab notebook stays out of the repository: no commit hash, measurement round or issue number, no path of one
# machine, and nothing of how a machine was obtained (the history of measurements is git's and the notes').
HISTORY = re.compile(r"\b[0-9a-f]{7,40}\b|\bround\b|\bround\d+|\brounds\b|issue[ _]?#?\d+|\bissues #?\d+"
                     r"|(?<![\w.])/(?:work|tmp|home|root|scratch)/[\w.-]+|\bleased?\b|\blent\b|\bsessions?\b", re.I)
USER_DOCUMENTS = [*PAGES, *sorted((ROOT / "config").rglob("*.yaml")), *sorted((ROOT / "benchmarks").glob("*")),
                  *sorted((ROOT / "experiments").glob("*"))]


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", target)]


def history_in(text: str, code: bool = False) -> list[str]:
    """Commit hashes, rounds, issue numbers, machine-local paths and machine loans in a document's text (in code,
    where ``round`` is a function, all but rounds)."""
    return [m.group(0) for m in HISTORY.finditer(text)
            if not m.group(0).isdigit() and not (code and m.group(0).lower().startswith("round"))]


def notebook_lines(path: Path) -> list[str]:
    return history_in(path.read_text(), code=path.suffix in (".py", ".sh"))


def test_the_readme_is_a_users_document():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350


def test_no_users_document_carries_the_lab_notebook():
    found = {str(path.relative_to(ROOT)): notebook_lines(path) for path in USER_DOCUMENTS
             if path.is_file() and notebook_lines(path)}
    assert not found, f"lab-notebook lines (they belong in git's history and the closing notes): {found}"
    # the check itself finds each kind
    sample = ("In the third round (c4b1642, issue 27) the GPU lent to this session ran it under /tmp/x; "
              "see /work/dpsad and the rounds of the lease.")
    assert [m.lower() for m in history_in(sample)] == ["round", "c4b1642", "issue 27", "lent", "session", "/tmp/x",
                                                        "/work/dpsad", "rounds", "lease"]
    assert history_in("a release of 2,000 images (src/dpsad/privacy/books/ledger.py, results/tmp/a)") == []


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
