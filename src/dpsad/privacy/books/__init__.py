"""The books of what was spent: a run's, a workspace's, the records' across workspaces (see :mod:`dpsad.privacy`)."""
