"""Time and peak memory of the noise calibration each DP stage runs at start, and the epsilon it spends.

    .venv/bin/python benchmarks/bench_calibration.py            # demo, test and paper-scale settings, then huge epsilons

Each case runs in a fresh process, so its peak RSS is its own (the interpreter
and dp-accounting included; Opacus only for the rdp and prv accountants).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = (  # (label, q, steps, target epsilon)
    ("demo eps 10 (q 256/4000, 47 steps)", 256 / 4000, 47, 10.0),
    ("demo eps 1", 256 / 4000, 47, 1.0),
    ("test overlay (q 16/4000, 13 steps)", 16 / 4000, 13, 10.0),
    ("paper MNIST eps 10 (q 128/54000, 42,188 steps)", 128 / 54000, 42188, 10.0),
)
# The worst case: a huge target drives the multiplier towards 0, where a fixed PLD grid once needed 10-19 GB.
WORST_CASES = tuple((f"test overlay, eps {eps:g}", 16 / 4000, 13, eps) for eps in (100.0, 1000.0, 1e6))

PROBE = """
import json, resource, sys, time
from dpsad.privacy.accounting import Accountant, SGMComponent, noise_for_target
q, steps, target, delta, accountant = json.loads(sys.argv[1])
start = time.perf_counter()
sigma = noise_for_target(target, delta, q, steps, accountant)
seconds = time.perf_counter() - start
spent = Accountant(accountant).epsilon([SGMComponent(sigma, q, steps)], delta)
print(json.dumps([sigma, spent, seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accountants", nargs="+", default=["pld", "rdp"], choices=["pld", "prv", "rdp"])
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    print("| case | accountant | sigma | epsilon spent (same accountant) | calibration time | peak RSS |")
    print("|---|---|---|---|---|---|")
    for label, q, steps, target in CASES + WORST_CASES:
        for accountant in args.accountants:
            out = subprocess.run([sys.executable, "-c", PROBE, json.dumps([q, steps, target, args.delta, accountant])],
                                 capture_output=True, text=True, timeout=3600)
            if out.returncode != 0:
                print(f"| {label} | {accountant} | not computed: {out.stderr.strip().splitlines()[-1]} | | | |")
                continue
            sigma, spent, seconds, rss_mb = json.loads(out.stdout)
            print(f"| {label} | {accountant} | {sigma:.4g} | {spent:.4f} | {seconds:.1f} s | {rss_mb:.0f} MB |")


if __name__ == "__main__":
    main()
