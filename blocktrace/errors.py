"""Errors a user can cause. The CLI turns each into one `Error: ...` line with its exit code."""


class BlocktraceError(Exception):
    """Base class: something the user asked for cannot be done."""

    exit_code = 1


class UsageError(BlocktraceError):
    """A bad option value or combination: exit code 2, like click's own usage errors."""

    exit_code = 2


class ConfigError(UsageError, ValueError):
    """An invalid block configuration; `field` names the BlockConfig field at fault."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class InputError(BlocktraceError):
    """Block input that cannot be built (tokens, ids, an input tensor file)."""


class WeightsError(BlocktraceError):
    """A checkpoint that cannot be read or does not fit the block."""
