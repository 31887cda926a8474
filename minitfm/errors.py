"""Errors a user can cause, each carrying the exit code the CLI should use.

Library code raises these with an actionable one-line message; only `cli` prints them.
"""

import reprlib

QUOTE_LIMIT = 80  # characters of a user's value quoted in a message


def quote(value, limit: int = QUOTE_LIMIT) -> str:
    """A bounded repr of user input for an error message: `'abc'`, `[1, 2, ...]`, `'aaa…'`.

    reprlib stops at a few items per level, so even an aliased YAML structure of a billion
    elements costs microseconds; control characters come out escaped, as repr() writes them.
    """
    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxdict = 2, 4, 4
    short.maxstring = short.maxother = short.maxlong = limit
    text = short.repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


class MinitfmError(Exception):
    """A mistake the user can fix (bad config, argument, file): exit code 2."""

    exit_code = 2


class ConfigError(MinitfmError):
    """The YAML config or a key=value override is wrong."""


class TaskInputError(MinitfmError):
    """Text given to a task cannot be parsed into tokens."""


class DataError(MinitfmError):
    """A data file (task.train_path, task.eval_path) cannot be read as pairs."""


class CheckpointError(MinitfmError):
    """A checkpoint or run directory is missing, corrupt or not ours."""


class RunFailed(MinitfmError):
    """Training or evaluation failed while running (e.g. the loss diverged): exit code 1."""

    exit_code = 1


class Interrupted(MinitfmError):
    """Stopped by SIGINT (exit 130) or SIGTERM (exit 143), after saving what can be resumed."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
