"""The machinery that runs a workflow stage as a Snakemake job: logging, locks, devices, processes, resources."""
