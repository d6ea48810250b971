"""The one error type for what the user can fix: a bad flag or value, a file they named that is missing, settings
that do not match a store. ``bench`` shows it as one line (exit 2); every other exception is a bug and shows its
traceback. A ``ValueError``, so that callers that catch or expect one keep working."""


class UsageError(ValueError):
    """Something the user can fix, said in one line: what is wrong and what is allowed."""
