"""The package's shape: no module imports, directly or through others, a module that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dpsad"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules ``path`` imports anywhere in it (inside functions too: a lazy import is still a
    dependency, only hidden)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:  # `from .x import f`: the module is .x, not .x.f
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    return {name: imports_of(path, name, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert "dpsad.training.diffusion_training" in graph["dpsad.moco.teacher_features"]  # the walk sees imports
    assert cycles(graph) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the package's top-level parts (``dpsad.jobs``, ``dpsad.config``, ...)."""
    top = lambda name: ".".join(name.split(".")[:2])  # noqa: E731
    collapsed: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            if top(source) != top(target) and target != "dpsad":
                collapsed.setdefault(top(source), set()).add(top(target))
    return collapsed


# The infrastructure every layer uses; it imports nothing of the privacy layer (nor of anything above it).
INFRASTRUCTURE = ("dpsad.errors", "dpsad.files", "dpsad.config", "dpsad.runtime", "dpsad.jobs")


def arrows_back_up(graph: dict[str, set[str]]) -> list[str]:
    packages = package_graph(graph)
    return sorted(f"{source} -> {target}" for source in INFRASTRUCTURE for target in packages.get(source, ())
                  if target not in INFRASTRUCTURE)


def test_no_part_of_the_package_imports_one_that_imports_it_back_and_the_infrastructure_stays_below():
    graph = import_graph(PACKAGE)
    assert cycles(package_graph(graph)) == []
    assert arrows_back_up(graph) == []


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start``'s modules import, directly or through others."""
    seen, todo = set(), [name for name in graph if name == start or name.startswith(start + ".")]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_privacy_imports_nothing_of_the_jobs_even_through_another_part():
    graph = import_graph(PACKAGE)
    assert "dpsad.runtime.distributed" in reachable(graph, "dpsad.privacy")  # the walk follows the imports
    assert sorted(m for m in reachable(graph, "dpsad.privacy") if m.startswith("dpsad.jobs")) == []


def snakemake_readers(root: Path) -> list[str]:
    """Modules that import Snakemake or name a ``snakemake`` object (a job's parameter, the script global)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.arg):
                names = [node.arg]
            if any(name.split(".")[0] == "snakemake" for name in names):
                found.append(str(path.relative_to(root)))
                break
    return found


def test_no_module_under_privacy_reads_snakemake_objects(tmp_path):
    assert snakemake_readers(PACKAGE / "privacy") == []
    assert "job_spending.py" in snakemake_readers(PACKAGE)  # the check sees a job's books
    (tmp_path / "books.py").write_text("def f(job):\n    from snakemake.io import Namedlist\n")
    (tmp_path / "global.py").write_text("print(snakemake.output)\n")
    assert snakemake_readers(tmp_path) == ["books.py", "global.py"]


def test_the_layer_check_finds_an_arrow_back_up_and_a_package_circle_through_a_lazy_import(tmp_path):
    root = tmp_path / "dpsad"
    for part in ("jobs", "privacy"):
        (root / part).mkdir(parents=True)
        (root / part / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "privacy" / "mechanism.py").write_text("from ..jobs.distributed import SINGLE\n")
    (root / "jobs" / "distributed.py").write_text("SINGLE = 1\n")
    (root / "jobs" / "stage.py").write_text("def books():\n    from ..privacy.books.spent_log import record\n")
    (root / "privacy" / "spending.py").write_text("def record():\n    pass\n")
    graph = import_graph(root)
    assert arrows_back_up(graph) == ["dpsad.jobs -> dpsad.privacy"]
    assert cycles(package_graph(graph)) == [["dpsad.jobs", "dpsad.privacy"]]


def test_the_circle_check_finds_a_circle_through_a_lazy_import(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("from .sub.b import f\n")
    (root / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (root / "c.py").write_text("import pkg.a\n")
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_the_package_root_lists_the_pipelines_ideas_and_little_else():
    """The job machinery lives in dpsad.jobs, file handling in dpsad.files: at most 10 modules at the root."""
    root = Path(__file__).resolve().parents[1] / "src" / "dpsad"
    modules = sorted(p.stem for p in root.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 10, modules
    machinery = {"stage", "joblock", "locks", "atomic", "checkout", "configfiles", "resources", "devices", "distributed",
                 "io", "artifacts", "finished", "doctor"}
    assert not machinery & set(modules), machinery & set(modules)
