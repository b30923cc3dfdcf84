#!/usr/bin/env bash
# The test suite under an older PyTorch than the pinned one: the GPU image's 2.11 by default.  A venv of its own
# (.venv-torch<version>-py<python version>) with every pin of envs/constraints.txt but torch, torchvision and the
# CUDA libraries they bring, then the suite on the CPU.  Catches a call that the pinned torch has and the older
# one lacks before a cluster job does.  About 5 GB in the venv (torch's CUDA build); pytest's options pass through.
#
#   bash envs/older_torch.sh                                  # torch 2.11.0, torchvision 0.26.0, every test
#   TORCH=2.11.0 TORCHVISION=0.26.0 bash envs/older_torch.sh -m "not e2e"
#   PYTHON=python3.12 bash envs/older_torch.sh                # the GPU image's Python too
#
# One test is left out: it checks that the installed torch is the pinned one, which here it is not by design.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TORCH:-2.11.0}
TORCHVISION=${TORCHVISION:-0.26.0}
PYTHON=${PYTHON:-python3}
venv=.venv-torch$TORCH-py$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
uv_version=$(sed -n 's/^UV_VERSION := //p' Makefile)

test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv"
test -x "$venv/bin/uv" || "$venv/bin/python" -m pip install --disable-pip-version-check -q "uv==$uv_version"
# the CUDA libraries are torch's own dependencies: each torch release pins its own versions of them
grep -v -i -E '^(torch|torchvision|triton|nvidia-|cuda-)' envs/constraints.txt > "$venv/constraints.txt"
printf 'torch==%s\ntorchvision==%s\n' "$TORCH" "$TORCHVISION" > "$venv/overrides.txt"
# shellcheck disable=SC2046  # the sources are options, split on purpose
"$venv/bin/uv" pip install --python "$venv/bin/python" -q --compile-bytecode $("$PYTHON" envs/pip_sources.py) \
    -c "$venv/constraints.txt" --override "$venv/overrides.txt" -e '.[test]'
installed=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
[ "$installed" = "$TORCH" ] || { echo "older_torch: torch $installed installed, expected $TORCH" >&2; exit 1; }
# the tests that run `make demo` with this venv need the Makefile's stamps: the same pins installed them
touch "$venv/.installed-stamp" "$venv/.installed-test-stamp"
echo "older_torch: torch $installed, torchvision $("$venv/bin/python" -c 'import torchvision; print(torchvision.__version__)')"
exec "$venv/bin/python" -m pytest -n 3 -m "e2e or not e2e" -p no:cacheprovider \
    --deselect tests/test_cluster.py::test_environment_file_is_pinned_and_needs_no_path_into_the_checkout "$@"
