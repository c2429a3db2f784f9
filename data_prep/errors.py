"""The one exception type of the data preparation stage.

Every expected failure (bad path, empty corpus, corrupt output, vocabulary mismatch,
missing asset, no network) raises `DataPrepError` with a one-line message that names the
problem and the fix; the Hydra entry point prints it as `error: ...` and exits non-zero.
"""


class DataPrepError(Exception):
    """A user-fixable problem with the data preparation inputs or outputs."""
