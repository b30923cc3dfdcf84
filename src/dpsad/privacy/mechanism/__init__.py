"""The DP mechanisms: what reads private records, and how it is made DP (see :mod:`dpsad.privacy`)."""
