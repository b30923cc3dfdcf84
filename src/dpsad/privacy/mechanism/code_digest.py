"""A digest of the code the DP guarantee rests on, for the DP stages' params.

The workflow does not rerun a stage because a script's file time changed (a ``git pull``, a branch switch or a
copy would otherwise retrain every DP stage and spend its budget again).  A change to the mechanism itself must
rerun them: the DP stages take this digest as a parameter.  It covers the modules that form and clip per-example
gradients, draw the noise, share a batch between processes, and plan the training (its size where the configuration
leaves batch and steps to ``dp_sizing``, its sample rate, steps, the upstream components and the calibrated noise:
:mod:`dpsad.privacy.mechanism.plan`): :data:`MECHANISM_MODULES`, paths under ``src/dpsad``.  It is taken over their
syntax trees without docstrings, so comments, docstrings and formatting do not count; any change to what runs does.
Not covered: the trainings' own code that hands the plan to the mechanism (``training/``, ``gan/train.py``), and
for PE the code that loads its split and labels (``training/diffusion_training.py``) and embeds the images
(``moco/teacher_features.py``): one vote per record, the noise and the accounting are in the digest.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

MECHANISM_MODULES = ("privacy/mechanism/dpsgd.py", "privacy/mechanism/per_example.py", "privacy/mechanism/clipped_sum.py",
                     "privacy/mechanism/precision.py", "privacy/accounting.py", "privacy/mechanism/plan.py",
                     "privacy/books/ledger.py", "privacy/epsilon_cache.py", "runtime/distributed.py")


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _imports_by_module_name(tree: ast.AST) -> ast.AST:
    """``from ..runtime.distributed import x`` as ``from distributed import x``: where a module the mechanism
    imports lives in the package is not what runs, so moving a file does not rerun every DP stage."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            node.module, node.level = (node.module or "").rpartition(".")[2] or None, 0
    return tree


FIELDS_AFTER_311 = ("type_params",)  # added to FunctionDef and ClassDef by Python 3.12: empty for any earlier code


def _dump(node) -> str:
    """``ast.dump(node)`` as Python 3.11 writes it, on any later Python too.  ``ast.dump`` itself differs between
    versions (3.12 adds ``type_params=[]``, 3.13 leaves out empty fields), so hashing it would rerun every DP
    stage of a workspace whose ``.venv`` was rebuilt with another Python."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(node, ast.JoinedStr) and name == "values":  # 3.12.1 adds '' parts to nested format specs
                value = [part for part in value if not (isinstance(part, ast.Constant) and part.value == "")]
            if value is None and getattr(type(node), name, ...) is None or name in FIELDS_AFTER_311 and not value:
                continue
            fields.append(f"{name}={_dump(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(_dump(item) for item in node)}]"
    return repr(node)


def code_sha256(source: str) -> str:
    """sha256 of a module's syntax tree without docstrings, its relative imports by module name."""
    tree = _imports_by_module_name(_without_docstrings(ast.parse(source)))
    return hashlib.sha256(_dump(tree).encode()).hexdigest()


PE_MODULES = ("privacy/mechanism/histogram.py", "privacy/accounting.py", "privacy/mechanism/dpsgd.py",
              "privacy/mechanism/precision.py", "privacy/epsilon_cache.py", "privacy/books/ledger.py",
              "privacy/books/preparation.py", "pe/evolution.py")
# ledger: the entry PE writes and the upstream components it reads; preparation: the records it names
SIM_PE_MODULES = (*PE_MODULES, "pe/simulator_evolution.py")
PACKAGE = Path(__file__).resolve().parents[2]  # src/dpsad
MECHANISM_FILES = tuple(PACKAGE / name for name in MECHANISM_MODULES)


@lru_cache(maxsize=None)
def _file_code_sha256(path: Path) -> str:
    """:func:`code_sha256` of one file, parsed once a process: the digests below share most of their modules, and
    every Snakemake start takes them all."""
    return code_sha256(path.read_text())


def _files_sha256(paths) -> str:
    """One sha256 over the files' syntax trees, each under its file name (not its folder: moving one reruns nothing)."""
    total = hashlib.sha256()
    for path in paths:
        total.update(f"{path.name}\0{_file_code_sha256(path)}\n".encode())
    return total.hexdigest()


@lru_cache(maxsize=1)
def mechanism_code_sha256() -> str:
    """One sha256 over :data:`MECHANISM_MODULES`: the DP-SGD stages' mechanism."""
    return _files_sha256(MECHANISM_FILES)


@lru_cache(maxsize=1)
def package_source_sha256() -> str:
    """sha256 of every module of the package as written (comments too: a cheap read of bytes, and a restart costs
    compute, never privacy), for a training's resume check only (never a rule's params: finished stages do not
    rerun on a code change).  Failure prevented: a job killed, the code updated, and
    the training taken up from its checkpoint, so that the released model holds steps of two versions of the
    training code while its ledger describes the second."""
    total = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE)
        if any(part.startswith(".") for part in name.parts) or not path.is_file():
            continue  # an editor's lock file (.#student.py, a dangling link) or backup is not code
        total.update(f"{name.as_posix()}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()


@lru_cache(maxsize=1)
def pe_code_sha256() -> str:
    """Private Evolution's mechanism: :mod:`.histogram` beside accounting and the secret generators, and the loop
    that embeds the records and casts their votes (:mod:`dpsad.pe.evolution`)."""
    return _files_sha256(PACKAGE / name for name in PE_MODULES)


@lru_cache(maxsize=1)
def sim_pe_code_sha256() -> str:
    """Sim-PE's mechanism (``pe.simulator``): :func:`pe_code_sha256`'s modules (PE's loop among them: Sim-PE takes
    its embedder and draw from it) and Sim-PE's own loop, :mod:`dpsad.pe.simulator_evolution`."""
    return _files_sha256(PACKAGE / name for name in SIM_PE_MODULES)


@lru_cache(maxsize=1)
def central_code_sha256() -> str:
    """The warm-up stage's mechanism: :mod:`.group_means` beside :data:`MECHANISM_MODULES`."""
    means = _file_code_sha256(PACKAGE / "privacy" / "mechanism" / "group_means.py")
    return hashlib.sha256(f"{mechanism_code_sha256()}\0{means}".encode()).hexdigest()
