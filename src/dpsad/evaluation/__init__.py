"""Evaluation of synthetic datasets.  Reads private records: not covered by any DP guarantee.

Nothing computed here feeds back into a released model.
"""
