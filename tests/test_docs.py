"""The user's documents: a short README without the lab notebook, docs pages that exist, links that resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
         ROOT / "experiments" / "README.md", ROOT / "config" / "README.md"]
# The lab notebook stays out of the repository: no commit hash, measurement round or issue number, no path of one
# machine, and nothing of how a machine was obtained or which call of it measured what (the history of measurements is
# git's and the notes').
HISTORY = re.compile(r"\b[0-9a-f]{7,40}\b|\bround\b|\bround\d+|\brounds\b|issue[ _]?#?\d+|\bissues #?\d+"
                     r"|(?<![\w.])/(?:work|tmp|home|root|scratch|opt|mnt)/[\w.-]+|\bleased?\b|\blent\b|\bsessions?\b"
                     r"|\bCI machines?\b|\b(?:1st|2nd|first|second) calls?\b", re.I)
# In code these are the language's or a library's words: ``round`` is a function, a pytest or HTTP session is not a
# working session, a function's first call is not a measurement's, and a quoted path is the program's own data.
CODE_WORDS = re.compile(r"round|(?:first|second) call", re.I)
CODE_SESSION = re.compile(r"scope=[\"']session|(?:pytest|test|HTTP|requests|database|SQLite|db) sessions?"
                          r"|sessions?-(?:wide|scoped)|\bSession\b")
# the code, its build and CI files, the workflow and the profiles; test_docs.py holds the samples of each kind
CODE = [ROOT / "Makefile", ROOT / "Snakefile", *sorted((ROOT / ".ci").glob("*")), *sorted((ROOT / "scripts").rglob("*")),
        *sorted((ROOT / "workflow").rglob("Snakefile")), *sorted((ROOT / "workflow").rglob("*.smk")),
        *sorted((ROOT / "workflow").rglob("*.py")), *sorted((ROOT / "profiles").rglob("*")),
        *sorted((ROOT / "slurm").rglob("*")), *sorted((ROOT / "src").rglob("*.py")),
        *(path for pattern in ("*.py", "*.sh") for path in sorted((ROOT / "tests").rglob(pattern))
          if path.name != "test_docs.py")]
USER_DOCUMENTS = [*PAGES, *sorted((ROOT / "config").rglob("*.yaml")), *sorted((ROOT / "benchmarks").glob("*")),
                  *sorted((ROOT / "experiments").glob("*")), *CODE]


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", target)]


def history_in(text: str, code: bool = False) -> list[str]:
    """Commit hashes, rounds, issue numbers, machine-local paths, machine loans and calls in a document's text (in
    code, all but the code's own words: ``round``, a function's first call, a pytest or HTTP session)."""
    own = [m.span() for m in CODE_SESSION.finditer(text)] if code else []
    return [m.group(0) for m in HISTORY.finditer(text)
            if not m.group(0).isdigit()
            and not (code and (CODE_WORDS.match(m.group(0)) or any(a <= m.start() < b for a, b in own)
                               or (m.group(0)[0] == "/" and text[m.start() - 1:m.start()] in ("'", '"'))))]


def is_code(path: Path) -> bool:
    return path.suffix in (".py", ".sh", ".smk") or path.name in ("Makefile", "Snakefile") or path.parent.name == ".ci"


def notebook_lines(path: Path) -> list[str]:
    """Each line of a document that carries the lab notebook: 'LINE: what was found | the line'."""
    if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".png", ".h5", ".pt", ".npz"):
        return []
    code = is_code(path)
    return [f"{number}: {', '.join(found)} | {line.strip()[:160]}"
            for number, line in enumerate(path.read_text().splitlines(), 1) if (found := history_in(line, code))]


def test_the_readme_is_a_users_document():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350


def test_no_users_document_carries_the_lab_notebook():
    # the check itself finds each kind
    sample = ("In the third round (c4b1642, issue 27) the GPU lent to this session ran it under /tmp/x; "
              "see /work/dpsad and the rounds of the lease. The CI machines ran /opt/dpsad and /mnt/data/x; "
              "the 1st call gave 2,514 images/s, the second call 2,400, on a CI machine.")
    assert [m.lower() for m in history_in(sample)] == [
        "round", "c4b1642", "issue 27", "lent", "session", "/tmp/x", "/work/dpsad", "rounds", "lease", "ci machines",
        "/opt/dpsad", "/mnt/data", "1st call", "second call", "ci machine"]
    assert history_in(sample, code=True) == [m for m in history_in(sample) if m.lower() not in
                                             ("round", "rounds", "second call")]
    # ordinary words and the code's own words do not count
    ordinary = ("a release of 2,000 images (src/dpsad/privacy/books/ledger.py, results/tmp/a) releases; it calls a "
                "function, whose call costs one step; recall 0.41; please; this machine's cores; a called-back "
                "option; /proc/self and results/mnt/x")
    assert history_in(ordinary) == [] and history_in(ordinary, code=True) == []
    code = ('@pytest.fixture(scope="session")\nsession-wide fixtures, one pytest session, a requests.Session() or an '
            "HTTP session; torch.round(x); rounds the sum; the first call is checked, the second call is cached")
    assert history_in(code, code=True) == []
    assert history_in('network_file_system("/home/alice/.local", mounts) or "/tmp/x"', code=True) == []
    assert history_in("measured in this session under /work/main, the lease of one GPU", code=True) == [
        "session", "/work/main", "lease"]
    found = {str(path.relative_to(ROOT)): lines for path in USER_DOCUMENTS if (lines := notebook_lines(path))}
    assert not found, "lab-notebook lines (they belong in git's history and the closing notes):\n" + "\n".join(
        f"{name}:{line}" for name, lines in found.items() for line in lines)


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


@pytest.mark.e2e  # starts a Python process
def test_the_budget_page_is_written_from_its_csv_and_a_changed_cell_is_caught(tmp_path):
    script = [sys.executable, str(ROOT / "experiments" / "n_epsilon_curve.py")]
    assert subprocess.run([*script, "--check"], capture_output=True, text=True).returncode == 0
    changed = tmp_path / "n_epsilon.csv"
    changed.write_text((ROOT / "experiments" / "n_epsilon.csv").read_text().replace(",0.47,", ",0.57,", 1))
    result = subprocess.run([*script, "--check", "--csv", str(changed)], capture_output=True, text=True)
    assert result.returncode == 1 and "differs" in result.stderr
    page, plot = tmp_path / "budget.md", tmp_path / "n_epsilon.png"
    page.write_text("<!-- table: n_epsilon -->\n<!-- end table -->\n")
    assert subprocess.run([*script, "--csv", str(changed), "--page", str(page), "--plot", str(plot)]).returncode == 0
    assert "| 20,000 | `mnist2k` (2,000) | 10 | DP-SAD (default) | 0.57 +- 0.00 | 2 |" in page.read_text()
    assert plot.stat().st_size > 10_000
