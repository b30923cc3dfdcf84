"""Time of the noise calibration each DP stage runs at start, and the epsilon it spends, per accountant.

    .venv/bin/python benchmarks/bench_calibration.py            # demo and paper-scale settings
"""

from __future__ import annotations

import argparse
import time

from dpsad.privacy.accounting import SGMComponent, compose_epsilon, noise_for_target

CASES = (  # (label, q, steps, target epsilon)
    ("demo eps 10 (q 64/3600, 113 steps)", 64 / 3600, 113, 10.0),
    ("demo eps 1", 64 / 3600, 113, 1.0),
    ("test overlay (q 16/3600, 68 steps)", 16 / 3600, 68, 10.0),
    ("paper MNIST eps 10 (q 128/54000, 42,188 steps)", 128 / 54000, 42188, 10.0),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accountants", nargs="+", default=["pld", "rdp"], choices=["pld", "prv", "rdp"])
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    print("| case | accountant | sigma | epsilon spent (same accountant) | calibration time |")
    print("|---|---|---|---|---|")
    for label, q, steps, target in CASES:
        for accountant in args.accountants:
            start = time.perf_counter()
            sigma = noise_for_target(target, args.delta, q, steps, accountant)
            seconds = time.perf_counter() - start
            spent = compose_epsilon([SGMComponent(sigma, q, steps)], args.delta, accountant)
            print(f"| {label} | {accountant} | {sigma:.4f} | {spent:.4f} | {seconds:.1f} s |")


if __name__ == "__main__":
    main()
