"""Errors the command-line layer turns into one-line messages and a non-zero exit."""


class DpsadError(ValueError):
    """Bad input or configuration; the message names the bad value and what was expected."""


class PrivacyError(DpsadError):
    """A run would break its privacy contract (unsound mode, budget exceeded, ...)."""
