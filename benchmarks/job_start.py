"""What a job pays before it computes: each workflow script's imports in a fresh process, and the first optimizer
step of a training, through the pipeline's optimizers and through torch's own; and a small training's whole
process with Python's cyclic collector as a job runs it (paused while the libraries load, then frozen out of what
they built: ``dpsad.jobs.paused_collector``) and as a plain process runs it.

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

# the whole process's CPU time, its exit included, is read by the parent
SMALL_TRAINING = """
if {as_a_job}:
    import dpsad.jobs.paused_collector
import torch
from dpsad.jobs.stage import resume_the_collector
resume_the_collector()  # leaves a collector that ran all along as it is
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
for _ in range(300):
    model(torch.randn(32, 64)).square().mean().backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= 0.01 * parameter.grad
            parameter.grad = None
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
    print("| 300 steps of a small model, a whole process | CPU seconds |")
    print("|---|---|")
    for label, as_a_job in (("the collector as a job runs it", True), ("a plain process's collector", False)):
        seconds = sorted(process_cpu(SMALL_TRAINING.format(as_a_job=as_a_job)) for _ in range(args.repeats))
        print(f"| {label} | {seconds[len(seconds) // 2]:.2f} |")


if __name__ == "__main__":
    main()
