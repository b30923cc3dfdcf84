"""What a Snakemake job costs before its work: each workflow script's imports in a fresh interpreter, and the
first torch optimizer (torch.optim imports torch._dynamo on it), the two costs every job of the test suite's
tiny runs pays again.

    PYTHONPATH=src .venv/bin/python benchmarks/job_overhead.py [--repeats 3]

Prints one row a script (median seconds of ``--repeats`` fresh interpreters) and the optimizer's first build.
Run it alone: it times wall clock.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_OPTIMIZER = ("import time, torch\nstart = time.perf_counter()\n"
                   "torch.optim.Adam([torch.zeros(1, requires_grad=True)])\nprint(time.perf_counter() - start)")


def script_imports(path: Path) -> str:
    """The module-level import statements of a workflow script (what its job loads before ``main``)."""
    tree = ast.parse(path.read_text())
    return "\n".join(ast.unparse(node) for node in tree.body
                     if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", "") != "__future__")


def seconds(code: str, repeats: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bare = seconds("pass", args.repeats)
    print(f"a bare interpreter: {bare:.2f} s (subtracted below)\n")
    print("| workflow script | its imports, s |\n|---|---|")
    for path in sorted((ROOT / "workflow" / "scripts").glob("*.py")):
        print(f"| {path.name} | {seconds(script_imports(path), args.repeats) - bare:.2f} |")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    first = [float(subprocess.run([sys.executable, "-c", FIRST_OPTIMIZER], check=True, env=env, capture_output=True,
                                  text=True).stdout) for _ in range(args.repeats)]
    print(f"\nthe first torch.optim.Adam of a process (imports torch._dynamo): {statistics.median(first):.2f} s")


if __name__ == "__main__":
    main()
