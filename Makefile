# The README's two commands: `make demo` (the pipeline on the bundled MNIST-5k) and `make test`.
# Each creates the virtual environment and installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS := envs/constraints.txt
STAMP := $(VENV)/.installed-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp

.PHONY: demo demo-no-public test lint report dry-run doctor clean-results

# Every package at the version the tests and the demo ran with (envs/constraints.txt); the test and formatting
# tools only for `make test`.  uv installs them (pinned below, itself installed by the venv's pip): it unpacks
# and compiles the bytecode on every core, 45 s for what pip took 100 s (torch's CUDA build is 5 GB unpacked).
# uv reads no pip configuration: the wheel folders and local indexes pip is configured with on this machine
# (envs/pip_sources.py) are passed to it, so that what lies on the disk is not downloaded again.
UV_VERSION := 0.13.9
PIP_SOURCES := $(shell $(PYTHON) envs/pip_sources.py)
PIP_INSTALL := $(VENV)/bin/uv pip install --python $(VENV)/bin/python -q --compile-bytecode \
	$(PIP_SOURCES) -c $(CONSTRAINTS)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	test -x $(VENV)/bin/uv || $(VENV)/bin/python -m pip install --disable-pip-version-check -q uv==$(UV_VERSION)
	$(PIP_INSTALL) -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[test]'
	touch $(TEST_STAMP)

# TARGET and ARGS (e.g. ARGS="--configfile config/config.yaml my.yaml") pass through to Snakemake.
TARGET ?= all
ARGS ?=

# After a kill, the rerun resumes: a stale lock is cleared when no Snakemake runs here,
# and the profile reruns jobs whose outputs were left incomplete.
# The workflow profile profiles/default (this machine's cores) is picked up by Snakemake itself.
demo: $(STAMP)
	PYTHONPATH=src $(VENV)/bin/python -m dpsad.config.files $(ARGS)
	PYTHONPATH=src $(VENV)/bin/python -m dpsad.jobs.preflight
	$(VENV)/bin/snakemake $(TARGET) $(ARGS)

# No public data: the DP warm-up's central images instead (config/examples/no_public.yaml, a complete configuration).
demo-no-public:
	$(MAKE) --no-print-directory demo ARGS="--replace-workflow-config --configfile config/examples/no_public.yaml $(ARGS)"

# Every test (the unit tests, the workflow's end-to-end runs and the SLURM test), after the catalog's checks:
# snakemake --lint (.ci/lint.py: all but the conda lint) and snakefmt --check.  `pytest` alone runs the unit tests.
# The package's bytecode is compiled first: where PYTHONDONTWRITEBYTECODE is set, each of the suite's Python
# processes would otherwise compile the modules it imports (about 0.1 s each).
test: lint
	$(VENV)/bin/python -m compileall -q -j 0 src tests
	$(VENV)/bin/python -m pytest -n 3 -m "e2e or not e2e"

lint: $(TEST_STAMP)
	$(VENV)/bin/python .ci/lint.py $(VENV)/bin/snakemake
	$(VENV)/bin/snakefmt --check Snakefile workflow/

# The report shows the comparison table and the figures of `all`: build (or check) them first.
report: demo
	$(VENV)/bin/snakemake --report results/report.html $(ARGS)

dry-run: $(STAMP)
	$(VENV)/bin/snakemake -n all

# torch, its CUDA build, the GPUs it sees, and whether a job asking for GPUS GPUs would start here.
GPUS ?= 1
doctor: $(STAMP)
	PYTHONPATH=src $(VENV)/bin/python -m dpsad.runtime.doctor --gpus $(GPUS)

clean-results:
	rm -rf results logs
