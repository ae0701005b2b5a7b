"""Errors a user can cause. The CLI turns each into one `Error: ...` line and exit code 2.

Exit codes, as linters and type checkers use them: 0 clean, 1 findings at --fail-on or worse
(never an error), 2 any error (a bad option, a missing or unreadable file, a model that does
not fit) — so CI can tell a diverging run from a typo.
"""

ERROR_EXIT = 2
FINDINGS_EXIT = 1


class BlocktraceError(Exception):
    """Base class: something the user asked for cannot be done."""

    exit_code = ERROR_EXIT


class UsageError(BlocktraceError):
    """A bad option value or combination."""


class ConfigError(UsageError, ValueError):
    """An invalid block configuration; `field` names the BlockConfig field at fault."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class InputError(BlocktraceError):
    """Block input that cannot be built (tokens, ids, an input tensor file)."""


class WeightsError(BlocktraceError):
    """A checkpoint that cannot be read or does not fit the block."""


def valid_indices(count: int) -> str:
    """The valid indices of `count` things, for a message: "0–117", or "none" when there are none."""
    return f"0–{count - 1}" if count > 0 else "none"
