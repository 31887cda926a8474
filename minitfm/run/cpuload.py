"""How many of this process's cores other programs keep busy: what `threads: auto` leaves them.

OpenMP threads wait for each other: a default run on 2 threads beside one busy program on 2
cores took 164.7 s, against 17.1 s on 1 thread (issue #55). The registry (`threads`) shows the other
minitfm processes; this module sees the rest. Linux counts, per CPU, the clock ticks spent
running anything (/proc/stat: user, nice, system, irq, softirq and steal time; idle and iowait
are free) and, per process, the ticks its threads ran (/proc/PID/stat: utime and stime).
Between two looks (/proc/uptime says when), the busy ticks of this process's CPUs (its
affinity), less this process's own and the other minitfm processes' (the registry counts those
by their settings), divided by the ticks a core has in that time, is how many cores other
programs kept busy, rounded: one busy loop reads about 1, even beside a run on 2 threads (the
scheduler then gives it 2/3 of a core).
Where /proc cannot be read (not Linux), other programs count as none, as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # USER_HZ
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # of a cpuN line: user nice system (idle iowait) irq softirq steal
MIN_WINDOW_S = 0.1  # the shortest look: 10 ticks a core at 100 Hz, a busy loop reads 1.0 +- 0.1


def read_proc(name: str) -> str:
    """The text of /proc/<name>."""
    with open(f"/proc/{name}") as f:
        return f.read()


def busy_ticks(stat: str, cpus: Collection[int]) -> int:
    """The ticks that /proc/stat's text counts busy on `cpus`, since the machine started."""
    total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
            fields = [int(field) for field in rest.split()]
            total += sum(fields[i] for i in BUSY_FIELDS if i < len(fields))
    return total


def process_ticks(stat: str) -> tuple[int, int]:
    """From /proc/PID/stat's text: (utime + stime, the ticks its threads ran since it started;
    its start, in ticks since the machine started)."""
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (command) ": a name may hold ") "
    return int(fields[11]) + int(fields[12]), int(fields[19])  # fields 14, 15, 22 of proc(5)


@dataclass(frozen=True)
class Look:
    """One look at the ticks: when (seconds since the machine started), busy on our CPUs, and
    per process."""

    at: float
    busy: int
    processes: dict[int, tuple[int, int]]  # pid -> (its ticks, its start): minitfm's processes


class CpuLoad:
    """Cores that other programs kept busy between two looks (`others`), on `cpus`."""

    def __init__(self, cpus: Collection[int], read: Callable[[str], str] = read_proc,
                 sleep: Callable[[float], None] = time.sleep):
        self.cpus, self.read, self.sleep = frozenset(cpus), read, sleep
        self.last: Look | None = None

    def look(self, pids: Iterable[int]) -> Look | None:
        """The ticks now (None: /proc cannot be read); a process that has gone is left out."""
        try:
            at = float(self.read("uptime").split()[0])
            busy = busy_ticks(self.read("stat"), self.cpus)
        except (OSError, ValueError, IndexError):
            return None
        processes = {}
        for pid in pids:
            try:
                processes[pid] = process_ticks(self.read(f"{pid}/stat"))
            except (OSError, ValueError, IndexError):  # gone, or not ours to read
                pass
        return Look(at, busy, processes)

    def start(self, pids: Iterable[int]) -> None:
        """The first look: what `others` measures from."""
        self.last = self.look(pids)

    def others(self, pids: Iterable[int]) -> int:
        """Whole cores busy with programs other than `pids` (minitfm's processes, this one
        included) since the last look (a first look waits MIN_WINDOW_S); this look is the next
        one's start. 0 when /proc cannot be read."""
        pids = list(pids)
        if self.last is None:
            self.start(pids)
        if self.last is not None:
            self.wait(MIN_WINDOW_S)
        last, now = self.last, self.look(pids)
        self.last = now
        if last is None or now is None or now.at <= last.at:
            return 0
        ours = sum(self.ran(pid, last, now) for pid in now.processes)
        cores = (now.busy - last.busy - ours) / (TICKS_PER_S * (now.at - last.at))
        return max(0, int(cores + 0.5))  # rounded half up: two thirds of a core is a busy core

    def wait(self, seconds: float) -> None:
        """Until `seconds` have passed since the last look."""
        try:
            elapsed = float(self.read("uptime").split()[0]) - self.last.at
        except (OSError, ValueError, IndexError):
            return
        if elapsed < seconds:
            self.sleep(seconds - elapsed)

    @staticmethod
    def ran(pid: int, last: Look, now: Look) -> int:
        """The ticks minitfm's process `pid` ran between the looks. One the last look did not
        see (it registered since): all its ticks if it started since, else none, so that a long
        life's ticks are not taken for this window's (its load counts as other programs' until
        the next look)."""
        ticks, started = now.processes[pid]
        if pid in last.processes:
            return ticks - last.processes[pid][0]
        return ticks if started >= last.at * TICKS_PER_S else 0
