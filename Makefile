# The README's two commands: `make demo` (the pipeline on the bundled MNIST-5k) and `make test`.
# Each creates the virtual environment and installs what is missing first.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test report dry-run clean-results

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -e '.[test]'
	touch $(STAMP)

# TARGET and ARGS (e.g. ARGS="--configfile config/config.yaml my.yaml") pass through to Snakemake.
TARGET ?= all
ARGS ?=

# After a kill, the rerun resumes: a stale lock is cleared when no Snakemake runs here,
# and the profile reruns jobs whose outputs were left incomplete.
demo: $(STAMP)
	PYTHONPATH=src $(VENV)/bin/python -m dpsad.locks
	$(VENV)/bin/snakemake --profile profiles/local $(TARGET) $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest

report: $(STAMP)
	$(VENV)/bin/snakemake --profile profiles/local --report results/report.html

dry-run: $(STAMP)
	$(VENV)/bin/snakemake --profile profiles/local -n all

clean-results:
	rm -rf results logs
