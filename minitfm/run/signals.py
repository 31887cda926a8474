"""Ctrl-C (SIGINT) and SIGTERM, caught rather than obeyed at once, so that a command stops cleanly.

A stopped command exits with 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM. From the first
line of the `minitfm` command until a command starts, one ends the process with one line
(`catch_while_starting`); while torch loads, they are held and acted on once it has
(`signals_held`); training turns the first into a flag it checks after each step, saves and
stops (`StopSignal`); a sweep forwards each one to its jobs (`CaughtSignals`); anywhere else
SIGTERM is Ctrl-C's twin, an exception (`Terminated`), so that a command stopped midway undoes
what it was doing (a picture's temp file is removed). No torch here, and nothing slow to
import: the `minitfm` command imports this module first.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from minitfm.errors import Interrupted, Terminated, ctrl_c

STOPPING = (signal.SIGINT, signal.SIGTERM)


def raise_terminated(signum, frame) -> None:
    """The handler of SIGTERM while a command runs (see `started`)."""
    raise Terminated


class CaughtSignals:
    """Records SIGINT and SIGTERM instead of dying while inside; the previous handlers after.

    Only the main thread may set handlers: elsewhere the signals are left alone.
    """

    def __init__(self):
        self.received: list[int] = []
        self._previous: dict[int, object] = {}  # a handler, SIG_DFL or SIG_IGN

    def __enter__(self) -> CaughtSignals:
        for signum in STOPPING:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)


class StopSignal(CaughtSignals):
    """Turns the first SIGINT/SIGTERM into a flag the loop checks after each step."""

    @property
    def signum(self) -> int | None:
        """The first signal received (None: none yet)."""
        return self.received[0] if self.received else None

    def _handle(self, signum, frame) -> None:
        if self.received:  # a second Ctrl-C aborts at once, even mid-save
            raise Interrupted(f"{signal.Signals(signum).name} again: stopped at once, without "
                              f"saving; the run's checkpoints are those saved before (a save "
                              f"cut short leaves the previous file intact)", 128 + signum)
        super()._handle(signum, frame)

    def agreed(self, dist) -> int:
        """The signal any rank got (0: none), so that all ranks stop after the same step;
        `dist` is the run's `distributed.Dist`."""
        return dist.all_max(self.signum or 0)


def stopped_by(signum: int) -> str:
    """How a message names the signal: `Ctrl-C (SIGINT)`, `SIGTERM`."""
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


def starting_message(signum: int) -> str:
    """What a signal that lands before a command has done anything says."""
    return f"{stopped_by(signum)} while starting: nothing was done"


def catch_while_starting() -> None:
    """From now until `started`, SIGINT and SIGTERM end the process at once with one
    `interrupted:` line and 128 + the signal (those the parent made us ignore stay ignored).

    Installed before typer, rich or torch load, which takes a moment: Python's own
    handler would print a KeyboardInterrupt traceback from inside their imports, and Click
    turns a KeyboardInterrupt while it parses into a silent exit. Nothing has been written yet,
    so there is nothing to clean up.
    """
    for signum in STOPPING:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, exit_while_starting)


def exit_while_starting(signum, frame) -> None:
    """The signal handler of `catch_while_starting`."""
    try:
        os.write(2, f"interrupted: {starting_message(signum)}\n".encode())
    except OSError:  # no stderr: the exit code still tells
        pass
    os._exit(128 + signum)


def started() -> None:
    """A command takes over: Ctrl-C raises KeyboardInterrupt again, as Python has it (marked as
    Ctrl-C's, `errors.CtrlC`, so that one a learner's code raises is told apart), and SIGTERM
    raises Terminated, for the command's own handling (see `app.exit_codes.clean_errors`): killed
    at once instead, a command would leave a half-written temp file behind."""
    for signum, usual, replaced in (
            (signal.SIGINT, ctrl_c, (exit_while_starting, signal.default_int_handler)),
            (signal.SIGTERM, raise_terminated, (exit_while_starting,))):
        if signal.getsignal(signum) in replaced:
            try:
                signal.signal(signum, usual)
            except ValueError:  # not the main thread: signals are the main thread's
                pass


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while torch is imported, then act on them.

    torch's C++ start-up swallows a KeyboardInterrupt raised inside it, and the command would
    then run to the end as if nothing happened.
    """
    with CaughtSignals() as caught:
        yield
    if caught.received:
        signum = caught.received[0]
        raise Interrupted(starting_message(signum), 128 + signum)
