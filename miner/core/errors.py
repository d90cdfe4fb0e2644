"""User-facing errors: ``miner`` prints them as one line and exits non-zero."""


class MinerError(Exception):
    """Base of every error a user can cause (bad input, missing or corrupt files)."""


class UsageError(MinerError):
    """Bad arguments: an unknown model, candidate or option value."""


class WorkspaceError(MinerError):
    """A workspace file is missing, corrupt or of another schema version."""
