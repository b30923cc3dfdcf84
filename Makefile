# The README's two commands: `make demo` (the pipeline on the bundled MNIST-5k) and `make test`.
# Each creates the virtual environment and installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS := envs/constraints.txt
STAMP := $(VENV)/.installed-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp

.PHONY: demo demo-no-public test lint report dry-run doctor clean-results

# Every package at the version the tests and the demo ran with (envs/constraints.txt); the test and formatting
# tools only for `make test`.  pip compiles each file it installs one at a time (about 40 s of torch here);
# compileall does the same on every core.  A file that does not compile under this Python (torch ships one in
# 3.12 syntax) is skipped, as pip skips it.
PIP_INSTALL := $(VENV)/bin/pip install --disable-pip-version-check -q --no-compile -c $(CONSTRAINTS)
COMPILE := $(VENV)/bin/python -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e .
	$(COMPILE)
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[test]'
	$(COMPILE)
	touch $(TEST_STAMP)

# TARGET and ARGS (e.g. ARGS="--configfile config/config.yaml my.yaml") pass through to Snakemake.
TARGET ?= all
ARGS ?=

# After a kill, the rerun resumes: a stale lock is cleared when no Snakemake runs here,
# and the profile reruns jobs whose outputs were left incomplete.
# The workflow profile profiles/default (this machine's cores) is picked up by Snakemake itself.
demo: $(STAMP)
	PYTHONPATH=src $(VENV)/bin/python -m dpsad.jobs.configfiles $(ARGS)
	PYTHONPATH=src $(VENV)/bin/python -m dpsad.jobs.preflight
	$(VENV)/bin/snakemake $(TARGET) $(ARGS)

# No public data: the DP warm-up's central images instead (config/examples/no_public.yaml, a complete configuration).
demo-no-public:
	$(MAKE) --no-print-directory demo ARGS="--replace-workflow-config --configfile config/examples/no_public.yaml $(ARGS)"

# The tests, after the catalog's checks: snakemake --lint (.ci/lint.py: all but the conda lint) and snakefmt --check.
test: lint
	$(VENV)/bin/python -m pytest

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
	PYTHONPATH=src $(VENV)/bin/python -m dpsad.jobs.doctor --gpus $(GPUS)

clean-results:
	rm -rf results logs
