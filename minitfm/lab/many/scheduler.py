"""A sweep's jobs as child processes: each job a chain of real commands (`minitfm train`, then
`minitfm eval --json` per length range), run `parallel` jobs at a time, signals forwarded.

A job's commands are what `minitfm sweep --dry-run` prints for any other scheduler; a command's
stdout goes to its result file (an evaluation's JSON, kept only when it succeeded) or to the
job's log, beside the run. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minitfm.config import BUILT_IN_CODES
from minitfm.errors import Interrupted, shown_path
from minitfm.lab.child_process import python_module
from minitfm.lab.curves import read_eval
from minitfm.lab.many.grid import Grid, RunSpec
from minitfm.lab.many.results import eval_path, eval_ranges, run_line
from minitfm.run.files import write_atomic
from minitfm.run.rundir import open_run_file
from minitfm.run.signals import CaughtSignals
from minitfm.run.summary import DONE, run_status

MINITFM = python_module("minitfm")  # safe-path mode: the working folder is not on its path
POLL_S = 0.1  # how often the scheduler looks at its children
PROCESS_BYTES = 300_000_000  # one job's process with torch loaded (~280 MB measured, tiny run)


def train_command(grid: Grid, spec: RunSpec, threads: int) -> list[str]:
    """`minitfm train` for a new run, or `--resume` where a checkpoint is already there."""
    if (spec.run_dir / "checkpoints" / "last.pt").is_file():
        return [*MINITFM, "train", "--resume", str(spec.run_dir), f"threads={threads}",
                *book(spec)]
    config = [grid.config] if grid.config else []
    # --overwrite: what a start killed before its first checkpoint left
    return [*MINITFM, "train", *config, *spec.overrides, f"threads={threads}",
            "--run-dir", str(spec.run_dir), "--overwrite"]


def eval_command(spec: RunSpec, lo: int, hi: int, threads: int, samples: int) -> list[str]:
    """`minitfm eval --json` of the run's last checkpoint on input lengths lo..hi."""
    return [*MINITFM, "eval", str(spec.run_dir), "--checkpoint", "last", "--json",
            "--samples", str(samples), "--min-len", str(lo), "--max-len", str(hi),
            "--threads", str(threads), *book(spec)]


def book(spec: RunSpec) -> list[str]:
    """`--book DIR` when the run trains a workbook: the sweep's command line named it, so its
    resume and its evaluations run it too (minitfm never imports a workbook a run names)."""
    code = spec.cfg.model.code
    return [] if code in BUILT_IN_CODES else ["--book", code]


@dataclass
class Command:
    """One command of a job; its stdout goes to `out` (appended to the job's log if None)."""

    argv: list[str]
    out: Path | None = None
    tmp: Path | None = None  # where the running command writes `out` (a name of its own)

    def shell(self) -> str:
        """The command as one line of shell, redirection included."""
        redirect = f" > {shlex.quote(str(self.out))}" if self.out else ""
        return shlex.join(self.argv) + redirect


@dataclass
class Job:
    """The commands still to run for one run of the grid (with `others`: for a stack of runs,
    trained and evaluated by one command, `minitfm stack`; its log is the first run's)."""

    spec: RunSpec
    commands: list[Command]
    started: float = field(default_factory=time.monotonic)
    others: list[RunSpec] = field(default_factory=list)  # the stack's other runs
    env: dict[str, str] = field(default_factory=dict)  # for its commands, besides ours (MLflow's)

    @property
    def specs(self) -> list[RunSpec]:
        return [self.spec, *self.others]

    @property
    def log(self) -> Path:
        # beside the run, not in it: a run directory holds only what `minitfm train` writes
        return self.spec.run_dir.parent / f"{self.spec.run_dir.name}.log"


def plan_job(grid: Grid, spec: RunSpec, ranges: list, threads: int, samples: int) -> Job:
    """What is left to do for `spec`: training unless it ended, evaluations not yet written."""
    commands = []
    if run_status(spec.run_dir) not in DONE:
        commands.append(Command(train_command(grid, spec, threads)))
    for lo, hi in eval_ranges(spec, ranges):
        if commands or read_eval(eval_path(spec, lo, hi)) is None:
            commands.append(Command(eval_command(spec, lo, hi, threads, samples),
                                    eval_path(spec, lo, hi)))
    return Job(spec, commands)


def open_result(command: Command) -> contextlib.AbstractContextManager:
    """A new temp file beside `command.out` for its stdout (None when it has no `out`).

    Its own name (mkstemp), never a fixed one: two processes can never write the same file.
    """
    if command.out is None:
        return contextlib.nullcontext()
    fd, tmp = tempfile.mkstemp(prefix=f".{command.out.name}.", suffix=".tmp",
                               dir=command.out.parent)
    command.tmp = Path(tmp)
    return os.fdopen(fd, "w")


def launch(job: Job, cwd: Path | None = None, **popen) -> subprocess.Popen:
    """Start the job's next command in a session of its own (a terminal's Ctrl-C reaches only
    the scheduler, which forwards it): its stdout to its result file (or the job's log), its
    stderr to the job's log, the job's `env` in its environment. `cwd` and `popen`: as
    subprocess.Popen takes them."""
    command = job.commands[0]
    for spec in job.specs:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **job.env}
    with open_run_file(job.log, "a") as log, open_result(command) as result:
        return subprocess.Popen(command.argv, stdout=result or log, stderr=log, cwd=cwd,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                **popen)


def keep_result(command: Command, code: int) -> None:
    """After a command ended: its result file (an evaluation's JSON) kept only when it
    succeeded, replacing the old one whole."""
    if command.tmp is not None:
        if code == 0:
            write_atomic(command.out, command.tmp.read_bytes())
        command.tmp.unlink(missing_ok=True)


class Scheduler:
    """Runs jobs `parallel` at a time, each a chain of child processes; forwards signals.

    Children get their own session, so a terminal's Ctrl-C reaches only this process, which
    forwards it once to each child (a second Ctrl-C is forwarded again: children then stop at
    once). A training child saves `last.pt` and exits 130; the scheduler waits for them all.
    """

    def __init__(self, jobs: list[Job], parallel: int, say: Callable[[str], None]):
        self.pending = deque(job for job in jobs if job.commands)
        self.total = sum(len(job.specs) for job in self.pending)  # runs, not jobs
        self.parallel, self.say = parallel, say
        self.running: dict[subprocess.Popen, Job] = {}
        self.done: list[RunSpec] = []
        self.failed: list[RunSpec] = []
        self.forwarded = 0
        self.stopped: list[Job] = []  # the jobs running when the first signal came

    def run(self) -> list[RunSpec]:
        """Run every job; returns the runs that failed. A signal raises Interrupted at the
        end."""
        with CaughtSignals() as signals:
            while self.pending or self.running:
                while self.pending and len(self.running) < self.parallel and not signals.received:
                    job = self.pending.popleft()
                    job.started = time.monotonic()
                    self.start(job)
                self.forward(signals.received)
                self.collect(bool(signals.received))
                if signals.received and not self.running:
                    break
                time.sleep(POLL_S)
        if signals.received:
            raise Interrupted(stop_message(signals.received[0], self.stopped),
                              128 + signals.received[0])
        return self.failed

    def start(self, job: Job) -> None:
        """Start the job's next command (see `launch`)."""
        self.running[launch(job)] = job

    def collect(self, stopping: bool) -> None:
        """Each command that ended: its result kept, the job's next command started (`advance`)."""
        for proc, job in list(self.running.items()):
            if proc.poll() is not None:
                del self.running[proc]
                self.advance(proc.returncode, job, stopping)

    def forward(self, received: list[int]) -> None:
        """Send each signal received since the last call to every running child."""
        if self.forwarded == 0 and received:
            self.stopped = list(self.running.values())
        for signum in received[self.forwarded:]:
            for proc in self.running:
                proc.send_signal(signum)
        self.forwarded = len(received)

    def advance(self, code: int, job: Job, stopping: bool) -> None:
        """After a command ended: keep its result, then start the next one or report."""
        keep_result(job.commands.pop(0), code)
        if code != 0 and not job.others:
            if not stopping:
                self.failed_with(job.spec, job.log, f" (exit {code})")
        elif code != 0:  # a stack: each of its runs ended as its own files say
            if not stopping:
                for spec in job.specs:
                    self.ended(spec, job, run_status(spec.run_dir) in DONE)
        elif job.commands and not stopping:
            self.start(job)
        elif not job.commands:
            for spec in job.specs:
                self.ended(spec, job, True)

    def ended(self, spec: RunSpec, job: Job, ok: bool) -> None:
        """Report one run of a job that ended: its line, or why it failed."""
        if not ok:
            self.failed_with(spec, job.log)
            return
        self.done.append(spec)
        self.say(f"[{len(self.done)}/{self.total}] {spec.id}: "
                 f"{run_line(spec, time.monotonic() - job.started)}")

    def failed_with(self, spec: RunSpec, log: Path, how: str = "") -> None:
        """Report one run as failed: `failed: ID (exit 1); see LOG: its last line`."""
        self.failed.append(spec)
        self.say(f"failed: {spec.id}{how}; see {shown_path(log)}: {last_line(log)}")


def stop_message(signum: int, stopped: list[Job]) -> str:
    """What a signal left behind, in words that fit: which stopped runs have a checkpoint (a
    stack's job counts each of its runs)."""
    runs = [spec for job in stopped for spec in job.specs]
    saved = sum((spec.run_dir / "checkpoints" / "last.pt").is_file() for spec in runs)
    if not runs:
        what = "no job was running"
    elif saved == len(runs):
        what = f"stopped {len(runs)} run(s), each with its checkpoints/last.pt"
    elif saved == 0:  # stopped before a first checkpoint: these runs start again
        what = f"stopped {len(runs)} run(s) before any saved a checkpoint"
    else:
        what = (f"stopped {len(runs)} runs, {saved} with checkpoints/last.pt (the "
                f"others had saved none yet)")
    again = "start them again" if runs and saved == 0 else "resume"
    return f"{signal.Signals(signum).name}: {what}; run the same command again to {again}"


def last_line(path: Path) -> str:
    """The last non-empty line of a log file (the error a failed command printed)."""
    try:
        with open_run_file(path, "r", errors="replace") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"


