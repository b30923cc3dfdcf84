"""The machinery around a workflow stage's process: its runner, one running copy, kept outputs, preflight checks."""
