"""A digest of the code the DP guarantee rests on, for the DP stages' params.

The workflow does not rerun a stage because a script's file time changed (a ``git pull``, a branch switch or a
copy would otherwise retrain every DP stage and spend its budget again).  A change to the mechanism itself must
rerun them: the DP stages take this digest as a parameter.  It covers the modules that form and clip per-example
gradients, draw the noise, and plan the training (its size where the configuration leaves batch and steps to
``dp_sizing``, its sample rate, steps and calibrated noise: :mod:`dpsad.privacy.plan`): :data:`MECHANISM_MODULES`.  It is taken over their syntax trees
without docstrings, so comments, docstrings and formatting do not count; any change to what runs does.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

MECHANISM_MODULES = ("mechanism.py", "per_example.py", "clipped_sum.py", "precision.py", "accounting.py", "plan.py")


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


# Modules the mechanism imports that have moved inside the package: hashed under their former names, so that
# moving a file (no change to what runs) does not rerun every DP stage and spend its budget again.
FORMER_MODULE_NAMES = {"jobs.distributed": "distributed"}


def _former_import_names(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in FORMER_MODULE_NAMES:
            node.module = FORMER_MODULE_NAMES[node.module]
    return tree


def code_sha256(source: str) -> str:
    """sha256 of a module's syntax tree without docstrings (moved modules under their former names)."""
    tree = _former_import_names(_without_docstrings(ast.parse(source)))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


@lru_cache(maxsize=1)
def mechanism_code_sha256() -> str:
    """One sha256 over :data:`MECHANISM_MODULES` of this package."""
    folder = Path(__file__).resolve().parent
    total = hashlib.sha256()
    for name in MECHANISM_MODULES:
        total.update(f"{name}\0{code_sha256((folder / name).read_text())}\n".encode())
    return total.hexdigest()


@lru_cache(maxsize=1)
def pe_code_sha256() -> str:
    """Private Evolution's mechanism: :mod:`dpsad.privacy.histogram` beside accounting and the secret generators, and
    the loop that embeds the records and casts their votes (:mod:`dpsad.pe.evolution`)."""
    folder = Path(__file__).resolve().parent
    total = hashlib.sha256()
    for path in (folder / "histogram.py", folder / "accounting.py", folder / "mechanism.py", folder / "precision.py",
                 folder.parent / "pe" / "evolution.py"):
        total.update(f"{path.name}\0{code_sha256(path.read_text())}\n".encode())
    return total.hexdigest()


@lru_cache(maxsize=1)
def central_code_sha256() -> str:
    """The warm-up stage's mechanism: :mod:`dpsad.privacy.group_means` beside :data:`MECHANISM_MODULES`."""
    folder = Path(__file__).resolve().parent
    return hashlib.sha256(f"{mechanism_code_sha256()}\0{code_sha256((folder / 'group_means.py').read_text())}".encode()).hexdigest()
