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
    assert "dpsad.training.diffusion_model" in graph["dpsad.moco.teacher_features"]  # the walk sees imports
    assert cycles(graph) == []


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
