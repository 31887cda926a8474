"""Errors a user can cause, each carrying the exit code the CLI should use.

Library code raises these with an actionable one-line message; only `app` prints them. A message
that names an option the command line and the Python API both have (`train`'s resume, `ablate`'s
mode, `eval`'s max_len, ...) names it by key (`option`), and the face that shows the message
spells it its way (`MinitfmError.spelled`): `--resume` on the command line, `resume=` in the
Python API; `--max-len` there, `max_len` here.
"""

import os
import re
import reprlib
import signal
from collections.abc import Mapping
from pathlib import Path

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


def shown_path(path: str | Path) -> str:
    """A path as minitfm prints it, in any output line or message, whoever found it (a resolved
    checkpoint, a path as typed): relative to the current folder (`runs/r/best.pt`,
    `../runs/r`), or absolute where that is shorter (`/data/r` rather than `../../../data/r`)."""
    try:
        whole = os.path.abspath(path)  # `..` folded; links left as they are
        relative = os.path.relpath(whole)
    except (OSError, ValueError):  # no current folder (removed), another drive, a NUL
        return str(path)
    return relative if len(relative) <= len(whole) else whole


OPTION_MARK = re.compile("\0(\\w+)\0([^\0]*)\0")  # a NUL never occurs in a path or a key


def percent(value: float) -> str:
    """0.99 -> `99%`, 0.995 -> `99.5%`: a share as messages print it."""
    return f"{value * 100:.4g}%"


def option(key: str, run: object = "") -> str:
    """An option named in a message by `key`: train's "resume", "run_dir", "overwrite", "book",
    "resume_of" and "again" (the option, and the whole call, that continue the run `run`); the
    lab's "mode", "samples", "min_len", "max_len". Each face spells every key."""
    return f"\0{key}\0{run}\0"


def spell(text: str, spelling: Mapping[str, str]) -> str:
    """`text` with each `option` spelled by `spelling` (key -> text; `{}` takes the run)."""
    return OPTION_MARK.sub(lambda mark: spelling[mark[1]].format(mark[2]), text)


class MinitfmError(Exception):
    """A mistake the user can fix (bad config, argument, file): exit code 2."""

    exit_code = 2

    def problems(self) -> list[str]:
        """What is wrong, one problem a line: the message (a ConfigError may hold several)."""
        return [str(self)]

    def spelled(self, spelling: Mapping[str, str]) -> "MinitfmError":
        """This error, the options its message names spelled by the face about to show it."""
        if self.args and isinstance(self.args[0], str):
            self.args = (spell(self.args[0], spelling), *self.args[1:])
        return self


class ConfigError(MinitfmError):
    """The YAML config or a key=value override is wrong: one problem, or several at once (a
    file with two wrong keys), each a line of its own on the command line (`problems`); the
    message joins them with '; '."""

    def __init__(self, *problems: str):
        super().__init__("; ".join(problems))
        self.several = list(problems)

    def problems(self) -> list[str]:
        return self.several if len(self.several) > 1 else [str(self)]

    def spelled(self, spelling: Mapping[str, str]) -> "ConfigError":
        self.several = [spell(problem, spelling) for problem in self.several]
        return super().spelled(spelling)


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


class Terminated(BaseException):
    """SIGTERM as an exception, as Ctrl-C is KeyboardInterrupt: the command's cleanups run, and
    it ends with one line and 143. A BaseException, which no `except Exception` swallows."""


class CtrlC(KeyboardInterrupt):
    """The KeyboardInterrupt of a Ctrl-C (SIGINT) while a command runs (`ctrl_c` raises it):
    then any other KeyboardInterrupt was raised by code, a learner's say."""


def ctrl_c(signum, frame) -> None:
    """SIGINT's handler while a command runs (see `run.signals.started`)."""
    raise CtrlC


def from_signal(err: BaseException) -> bool:
    """Whether `err` is a signal stopping the command (Ctrl-C, SIGTERM), not something code
    raised. A bare KeyboardInterrupt counts as Ctrl-C's unless `ctrl_c` is SIGINT's handler
    (which marks Ctrl-C's own): under another handler, Python's say, none can tell them apart."""
    if isinstance(err, (CtrlC, Terminated)):
        return True
    return isinstance(err, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is not ctrl_c
