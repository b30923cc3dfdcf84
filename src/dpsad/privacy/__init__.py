"""Everything privacy: the DP-SGD mechanism, accounting, the ledger and the verdict.

This package is the only place that touches Opacus.
"""
