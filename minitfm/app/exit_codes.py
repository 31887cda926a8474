"""Library errors as one line on stderr and their exit code (`clean_errors`, no traceback):
0 success, 1 runtime failure, 2 bad input, 130 interrupted by Ctrl-C, 143 by SIGTERM."""

from __future__ import annotations

import functools
import signal
import sys

import typer

from minitfm.app.output import CLI_OPTIONS, fail, note
from minitfm.errors import Interrupted, MinitfmError, from_signal, quote
from minitfm.run.signals import Terminated, signals_held, started, stopped_by


def out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) \
        or "out of memory" in str(err)


def clean_errors(command=None, *, uses_torch: bool = True):
    """Turn library errors into one line on stderr and their exit code (no traceback).

    A command that `uses_torch` loads it first with signals held (see `signals_held`); sweep
    and runs need no torch in their own process.
    """
    if command is None:
        return functools.partial(clean_errors, uses_torch=uses_torch)

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            started()  # from here a Ctrl-C is this command's to handle (below)
            if uses_torch:
                with signals_held():
                    import torch  # noqa: F401
            return command(*args, **kwargs)
        except Interrupted as err:
            fail(str(err.spelled(CLI_OPTIONS)), err.exit_code, "interrupted")
        except MinitfmError as err:
            for line in getattr(err, "__notes__", ()):  # e.g. best.pt fell back to last.pt
                note(line)
            fail(err.spelled(CLI_OPTIONS).problems(), err.exit_code)  # a line per problem
        except KeyboardInterrupt as err:
            if not from_signal(err):  # raised by code, not by a key: say so
                fail("the code raised KeyboardInterrupt (no key was pressed): the command did "
                     "not finish", 1)
            fail(f"{stopped_by(signal.SIGINT)}: the command did not finish", 130, "interrupted")
        except Terminated:
            fail(f"{stopped_by(signal.SIGTERM)}: the command did not finish", 143, "interrupted")
        except BrokenPipeError:  # `minitfm ... | head`: the reader has gone, nothing to say
            silence_stdout()
            raise typer.Exit(1) from None
        except OSError as err:  # stdout on a full disk, a vanished file: no traceback
            silence_stdout()
            where = f" {quote(str(err.filename))}" if err.filename else ""
            fail(f"cannot read or write{where} ({err.strerror or err})", 1)
        except (MemoryError, RuntimeError) as err:
            if not out_of_memory(err):
                raise
            fail("out of memory: lower the sizes (model.d_model, train.batch_size, "
                 "task.max_len, --samples, --batch-size) and try again", 1)

    return wrapper


def silence_stdout() -> None:
    """Nothing more reaches stdout (see `progress.silence`)."""
    from minitfm.app.progress import silence

    silence(sys.stdout)
