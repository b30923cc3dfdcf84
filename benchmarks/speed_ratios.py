"""Every figure of the speed targets (issue 14) in one run, each beside its target.

1. The DP-SAD student step against the same step without DP, at each batch size
   (the demo's student, all parameters and the demo's conditioning-only set,
   per-example gradients by hooks), with the DP step's peak memory; one child
   process per setting, as in ``bench_dp_step.py``.
2. Sampling: images/s of the default sampler against DDIM-50 on one generator of
   a finished demo, and the CNN accuracy of each one's samples (``sampler_choice.py``'s
   scoring); "not computed" without a finished demo.
3. The last Snakemake run in the project folder: jobs done and elapsed time, as
   Snakemake logged them (``make demo`` on a fresh clone is the figure the target means).

    .venv/bin/python benchmarks/speed_ratios.py
    .venv/bin/python benchmarks/speed_ratios.py --batches 64 --repeats 3 --n-per-class 50
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
DP_STEP_TARGET = 1.25
SAMPLING_TARGET = 3.0
DEMO_TARGET_MIN = 12.0


def dp_step_rows(batches, trainable_sets, repeats: int, threads: int) -> list[dict]:
    """One ``bench_dp_step.py`` child per (batch, trained set): seconds, ratio and peak memory."""
    rows = []
    for batch in batches:
        for trainable in trainable_sets:
            setting = {"batch": batch, "trainable": trainable, "method": "hooks", "microbatch": 64, "k": 1,
                       "threads": threads, "repeats": repeats}
            child = subprocess.run([sys.executable, str(BENCHMARKS / "bench_dp_step.py"), "--child", json.dumps(setting)],
                                   check=True, capture_output=True, text=True)
            r = json.loads(child.stdout.strip().splitlines()[-1])
            rows.append({"batch": batch, "trainable": trainable, **r, "ratio": r["dp_s"] / r["plain_s"]})
    return rows


def sampling_rows(results: Path, model: Path, n_per_class: int) -> list[dict] | str:
    """DDIM-50 and the configured sampler, by ``sampler_choice.py``'s measurement; a reason string when not computable."""
    missing = [p for p in (results / "data.h5", results / "evaluator.pt", model) if not p.exists()]
    if missing:
        return f"not computed: {', '.join(str(p) for p in missing)} missing (run `make demo` first)"
    sys.path.insert(0, str(BENCHMARKS))
    from sampler_choice import load_config, sampler_rows

    config = load_config()
    default = {k: config["sample"][k] for k in ("sampler", "steps", "eta", "guidance")}
    ddim50 = {"sampler": "ddim", "steps": 50, "eta": 1.0, "guidance": 0.0}
    return list(sampler_rows(model, results, [ddim50, default], n_per_class, config))


def last_snakemake_run(project: Path) -> str:
    """'<done> of <total> steps in <elapsed>' from the newest Snakemake log of ``project``, or why not."""
    logs = sorted((project / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        return f"not computed: no Snakemake log under {project}/.snakemake/log"
    text = logs[-1].read_text(errors="replace")
    done = re.findall(r"(\d+ of \d+ steps \(\d+%\) done)", text)
    elapsed = re.search(r"Elapsed time: ([0-9:.]+)", text)
    if not elapsed:
        return f"not computed: {logs[-1].name} has no elapsed time (the run did not finish)"
    return f"{done[-1] if done else 'no jobs'} in {elapsed.group(1).split('.')[0]} ({logs[-1].name})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--trainable", nargs="+", default=["all", "conditioning"], choices=["all", "conditioning"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--project", default=str(ROOT), help="the folder `make demo` ran in")
    parser.add_argument("--model", default=None, help="generator for the sampling row (default: the demo's public teacher)")
    parser.add_argument("--n-per-class", type=int, default=100)
    parser.add_argument("--skip-sampling", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    project = Path(args.project)
    results = project / "results" / "mnist5k"

    print(f"## DP step / non-private step (target <= {DP_STEP_TARGET}x), per-example hooks, {args.threads} threads")
    print("| batch | trained | non-private s | DP s | DP / non-private | target met | DP peak memory MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in dp_step_rows(args.batches, args.trainable, args.repeats, args.threads):
        print(f"| {r['batch']} | {r['trainable']} ({r['trained']:,}) | {r['plain_s']:.3f} | {r['dp_s']:.3f} | "
              f"{r['ratio']:.2f}x | {'yes' if r['ratio'] <= DP_STEP_TARGET else 'no'} | {r['dp_peak_mib']:.0f} ({r['device']}) |",
              flush=True)

    print(f"\n## Sampling against DDIM-50 (target >= {SAMPLING_TARGET}x images/s at equal or better acc_cnn)")
    rows = "not computed: --skip-sampling" if args.skip_sampling else sampling_rows(
        results, Path(args.model) if args.model else results / "teacher" / "public.pt", args.n_per_class)
    if isinstance(rows, str):
        print(rows)
    else:
        base = rows[0]
        print("| sampler | steps | images/s | x DDIM-50 | class_fidelity | acc_cnn |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['sampler']} | {r['steps']} | {r['images_per_s']:.1f} | {r['images_per_s'] / base['images_per_s']:.1f} | "
                  f"{r['class_fidelity']:.3f} | {r['acc_cnn']:.3f} |")

    print(f"\n## Last Snakemake run in {project} (target: `make demo` <= {DEMO_TARGET_MIN:.0f} min)")
    print(last_snakemake_run(project))


if __name__ == "__main__":
    main()
