"""Ctrl-C (SIGINT) and SIGTERM, caught rather than obeyed at once, so that a command stops cleanly.

A stopped command exits with 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM. While torch
loads, the signals are held and acted on once it has (`signals_held`); training turns the first
into a flag it checks after each step, saves and stops (`StopSignal`); a sweep forwards each one
to its jobs (`CaughtSignals`). No torch here.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from minitfm.errors import Interrupted

STOPPING = (signal.SIGINT, signal.SIGTERM)


class CaughtSignals:
    """Records SIGINT and SIGTERM instead of dying while inside; the previous handlers after.

    Only the main thread may set handlers: elsewhere the signals are left alone.
    """

    def __init__(self):
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

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
        raise Interrupted(f"{stopped_by(signum)} while starting: nothing was done", 128 + signum)
