"""User-facing errors: ``miner`` prints them as one line and exits non-zero."""


class MinerError(Exception):
    """Base of every error a user can cause (bad input, missing or corrupt files)."""


class UsageError(MinerError):
    """Bad arguments: an unknown model, candidate or option value."""


class WorkspaceError(MinerError):
    """A workspace file is missing, corrupt or of another schema version."""


def unreadable(problems: "list[str] | tuple[str, ...]") -> WorkspaceError:
    """One error for the workspace files a verb could not read: the first in full, then how many more.

    Each problem already names its file and the command that rebuilds it (``workspace.read_json``).
    """
    more = len(problems) - 1
    return WorkspaceError(problems[0] + (f" (and {more} more unreadable file{'s' if more > 1 else ''})" if more else ""))
