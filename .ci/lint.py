"""`snakemake --lint` with one lint accepted: rules without a `conda:` or `container:` directive.

dpsad ships no conda environment or container that Snakemake could build for its jobs (jobs import the
package from the checkout's src/, installed with pip: docs/running.md), so its rules name none; a directive
that pointed at an environment nobody builds would document software the job does not run with.  Every
other lint, and any error of Snakemake itself, fails this check.

    python .ci/lint.py [SNAKEMAKE]
"""

from __future__ import annotations

import re
import subprocess
import sys

ACCEPTED = {"Specify a conda environment or container for each rule."}


def main() -> int:
    snakemake = sys.argv[1] if len(sys.argv) > 1 else "snakemake"
    done = subprocess.run([snakemake, "--lint"], capture_output=True, text=True)
    text = done.stdout + done.stderr
    found = re.findall(r"^    \* (.+?):?$", text, flags=re.MULTILINE)
    other = sorted(set(found) - ACCEPTED)
    if other or (done.returncode != 0 and not found):
        sys.stderr.write(text)
        sys.stderr.write(f"error: snakemake --lint: {', '.join(other) or f'exit {done.returncode}'}\n")
        return 1
    accepted = len(found)
    print(f"snakemake --lint: no lint but the {accepted} accepted one(s) (no conda or container directive: .ci/lint.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
