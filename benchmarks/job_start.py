"""What a job pays before it computes: each workflow script's imports in a fresh process, and the first optimizer
step of a training, through the pipeline's optimizers and through torch's own; and what it pays to exit, with and
without the collector's run that ``run_stage`` leaves for its end (``dpsad.jobs.stage.spare_the_teardown``).

Every job of the workflow is a process of its own, so on a small run (the tests' tiny run, the demo) these costs
are a large share of the CPU time.  Prints one row a script: seconds to import what it imports (median of
``--repeats`` fresh processes) and whether that loads torch, scikit-learn, dp-accounting, matplotlib.

    .venv/bin/python benchmarks/job_start.py                      # every script
    .venv/bin/python benchmarks/job_start.py sample.py evaluate.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "workflow" / "scripts"
HEAVY = ("torch", "sklearn", "dp_accounting", "matplotlib", "torch._dynamo")

MEASURE = """
import json, sys, time
start = time.perf_counter()
{imports}
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "loaded": [name for name in {heavy!r} if name in sys.modules]}}))
"""

FIRST_STEP = """
import json, time, torch
from dpsad.runtime.eager_optimizers import eager
model = torch.nn.Linear(8, 8)
build = eager(torch.optim.Adam) if {eager} else torch.optim.Adam
start = time.perf_counter()
optimizer = build(model.parameters(), lr=1e-3)
model(torch.ones(2, 8)).sum().backward()
optimizer.step()
optimizer.zero_grad()
print(json.dumps({{"seconds": time.perf_counter() - start}}))
"""

# the whole process's CPU time, its exit included, is read by the parent (each process has torch loaded and took a step)
EXIT = """
import torch
from dpsad.jobs.stage import spare_the_teardown
torch.nn.Linear(8, 8)(torch.ones(2, 8)).sum().backward()
if {spare}:
    import atexit
    atexit.register(spare_the_teardown)
print('{{}}')
"""


def script_imports(path: Path) -> str:
    """The top-level import lines of a workflow script (what its job loads before ``main`` runs)."""
    return "\n".join(line for line in path.read_text().splitlines() if line.startswith(("from ", "import ")))


def fresh_process(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"job_start: a fresh process failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def process_cpu(code: str) -> float:
    """User and system seconds of a fresh process running ``code``, from its start to the end of its exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    fresh_process(code)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def median_of(code: str, repeats: int) -> dict:
    runs = sorted((fresh_process(code) for _ in range(repeats)), key=lambda run: run["seconds"])
    return runs[len(runs) // 2]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="*", help="names under workflow/scripts (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per figure (the median is printed)")
    args = parser.parse_args(argv)
    names = args.scripts or sorted(path.name for path in SCRIPTS.glob("*.py"))
    unknown = [name for name in names if not (SCRIPTS / name).is_file()]
    if unknown:
        raise SystemExit(f"job_start: {unknown} not in workflow/scripts, expected names such as sample.py")
    print("| script | imports (s) | loads |")
    print("|---|---|---|")
    for name in names:
        found = median_of(MEASURE.format(imports=script_imports(SCRIPTS / name), heavy=HEAVY), args.repeats)
        print(f"| {name} | {found['seconds']:.2f} | {', '.join(found['loaded']) or '-'} |")
    print()
    print("| first Adam step after import torch | seconds |")
    print("|---|---|")
    for label, eager in (("the pipeline's (runtime.eager_optimizers)", True), ("torch's own", False)):
        print(f"| {label} | {median_of(FIRST_STEP.format(eager=eager), args.repeats)['seconds']:.2f} |")
    print()
    print("| a process that loaded torch, to the end of its exit | CPU seconds |")
    print("|---|---|")
    for label, spare in (("plain exit", False), ("through spare_the_teardown", True)):
        seconds = sorted(process_cpu(EXIT.format(spare=spare)) for _ in range(args.repeats))
        print(f"| {label} | {seconds[len(seconds) // 2]:.2f} |")


if __name__ == "__main__":
    main()
