#!/usr/bin/env bash
# Check that the pip pins of envs/dpsad.yaml resolve together on this Python, without conda (which cannot
# reach conda-forge from every machine): a throw-away venv, pip install --dry-run of exactly that list.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -n 's/^      - \([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' envs/dpsad.yaml > "$work/pins.txt"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --disable-pip-version-check -q --dry-run --ignore-installed \
    -r "$work/pins.txt" --report "$work/report.json"
"$work/venv/bin/python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
pins = dict(line.strip().lower().split("==") for line in open(f"{work}/pins.txt") if line.strip())
resolved = {p["metadata"]["name"].lower(): p["metadata"]["version"] for p in json.load(open(f"{work}/report.json"))["install"]}
wrong = {name: (version, resolved.get(name)) for name, version in pins.items() if resolved.get(name) != version}
print(f"{len(pins)} pins, {len(resolved)} packages resolved by pip; pins not honoured: {wrong or 'none'}")
sys.exit(1 if wrong else 0)
PY
