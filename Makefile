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

demo: $(STAMP)
	$(VENV)/bin/snakemake --profile profiles/local all

test: $(STAMP)
	$(VENV)/bin/python -m pytest

report: $(STAMP)
	$(VENV)/bin/snakemake --profile profiles/local --report results/report.html

dry-run: $(STAMP)
	$(VENV)/bin/snakemake --profile profiles/local -n all

clean-results:
	rm -rf results logs
