"""`python -m minitfm` and the `minitfm` command (see pyproject.toml): the command line.

Ctrl-C and SIGTERM are caught first, before the command line's libraries load, so that one
landing at any moment of the start-up ends it with one `interrupted:` line (see
`run.signals.catch_while_starting`). A command that ends (well or with an error it explains)
leaves without the interpreter's teardown: see `exit_now`.
"""

import atexit
import contextlib
import os
import sys

from minitfm.run.signals import catch_while_starting


def main() -> None:
    """Console-script entry point: catch the signals, then load and run the CLI."""
    catch_while_starting()
    from minitfm.app.cli import main as cli_main

    try:
        cli_main()
    except SystemExit as stop:  # how the CLI ends, 0 included
        exit_now(stop.code)
    exit_now(0)


def exit_now(code: int | str | None) -> None:
    """Exit with `code` (as SystemExit reads it) without the interpreter's teardown.

    Python frees every module and object one by one at exit, a noticeable part of a default
    training run once torch is loaded (docs/speed.md), spent on memory the system takes back
    anyway. By now
    every file minitfm wrote is closed (runs close their logs, checkpoints are written
    atomically); the output streams are flushed and the atexit handlers run here, then the
    process ends at once. An unexpected exception does not get here: it ends the usual way.
    """
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # SystemExit("text") prints its text and exits 1
        code = 1
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError):  # `minitfm ... | head`: the reader may have gone
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
