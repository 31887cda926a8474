"""Sweeps on Ray (`minitfm sweep --on ray`): the same plan's jobs, run as Ray tasks on a cluster.

The launcher is a seam: the sweep plans, holds its folder's lock, writes sweep.json, the
results, the table and the intervals as it does with processes of its own (`scheduler.py`);
only where a job's commands run changes. Each job (`minitfm train`, then `minitfm eval --json`
per length range; or a stack's `minitfm stack`) is a Ray task asking for the CPUs its threads
use (and a GPU for a stack that trains on one), which runs those same commands as child
processes on the node Ray picks.

Files, with or without a shared filesystem: a task first looks for a token the driver wrote in
the sweep folder. Where it finds it, the workers see the folder and write in place. Where not,
the task trains in a folder of its own on its node, from the run's resolved config (a stack's
runs one by one), and sends the run directory back through Ray's object store (at most
`MAX_RETURN` bytes); the driver checks it and writes it into the sweep folder whole
(`rayfolders.py`). Each task says which it did, and the sweep says so at the end. Every path a
task is given is absolute: a worker's working folder is not the driver's.

A run fails on Ray as it fails locally: a command that exits non-zero (training or an
evaluation) is `failed: ID (exit N)`, with its log's last line; a task that fails as a task
(out of retries, an error in the worker) is failed with Ray's error, whole in the run's log; a
run sent back that is not a run folder is failed, and its old folder stays.

Nothing lost when something dies: a task whose worker or node dies is retried by Ray
(`MAX_RETRIES`), and a retried job plans its commands again, as a resumed sweep does: from the
run's last checkpoint where the folder is shared (the dying worker's children get SIGTERM, and
save it), from the start where not. Ctrl-C or SIGTERM of the driver cancels the tasks (each
child gets SIGINT and saves its last.pt) and the same command goes on. Ray is imported here
and in `raycluster.py` (which joins the cluster) only, and only by `--on ray`.
"""

from __future__ import annotations

import ctypes
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from minitfm.config import to_yaml
from minitfm.errors import Interrupted, MinitfmError, shown_path
from minitfm.lab.many.grid import Grid, RunSpec
from minitfm.lab.many.raycluster import connect, last_line
from minitfm.lab.many.rayfolders import MAX_RETURN, pack, receive
from minitfm.lab.many.scheduler import (
    POLL_S,
    Command,
    Job,
    Scheduler,
    keep_result,
    launch,
    plan_job,
    stop_message,
)
from minitfm.lab.many.stacking import on_gpu, stack_command
from minitfm.run.files import write_atomic
from minitfm.run.rundir import open_run_file
from minitfm.run.signals import CaughtSignals
from minitfm.run.summary import DONE, run_status

MAX_RETRIES = 3  # Ray retries a task whose worker or node died this many times
TOKEN = ".minitfm-ray-token"  # in the sweep folder: a task that reads it sees the folder


@dataclass
class Work:
    """What a task needs to run one job anywhere: the job's runs, how to plan their commands,
    where the sweep folder is (for a worker that sees it) and the token that proves it does."""

    grid: Grid
    specs: list[RunSpec]
    ranges: list[tuple[int, int]]
    threads: int
    samples: int
    stacked: bool
    folder: Path
    cwd: Path
    token: str
    env: dict[str, str]  # for the job's commands (`Job.env`: the sweep's MLflow run)


class RayScheduler(Scheduler):
    """The jobs as Ray tasks; what ended is reported as the local `Scheduler` reports it."""

    def __init__(self, jobs: list[Job], works: dict[int, Work], ray, say: Callable[[str], None]):
        super().__init__(jobs, len(jobs), say)
        self.works, self.ray = works, ray
        self.nodes: set[str] = set()
        self.modes: set[str] = set()

    def run(self) -> list[RunSpec]:
        ray = self.ray
        remote = ray.remote(run_work)
        pending = {}
        for job in self.pending:
            work = self.works[id(job)]
            gpus = 1 if work.stacked and on_gpu(work.specs[0].cfg.device) else 0
            ref = remote.options(num_cpus=work.threads, num_gpus=gpus,
                                 max_retries=MAX_RETRIES).remote(work)
            pending[ref] = job
        stopped: list[Job] = []
        with CaughtSignals() as signals:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
                if signals.received and not stopped:
                    stopped = list(pending.values())
                    for ref in pending:
                        ray.cancel(ref)  # KeyboardInterrupt in the task: its child saves
                for ref in done:
                    self.finish(pending.pop(ref), ref, bool(signals.received))
        if signals.received:
            signum = signals.received[0]
            raise Interrupted(stop_message(signum, stopped), 128 + signum)
        return self.failed

    def result(self, ref) -> tuple[dict | None, str]:
        """A task's result; else None and Ray's error (cancelled, out of retries, an error
        raised in the worker)."""
        try:
            return self.ray.get(ref), ""
        except Exception as err:  # noqa: BLE001 - Ray's errors, each said as it is
            return None, re.sub(r"\x1b\[[0-9;]*m", "", str(err)) or type(err).__name__  # no colours

    def finish(self, job: Job, ref, stopping: bool) -> None:
        """Write what came back (runs trained without the shared folder), then report each of
        the job's runs as the local scheduler would."""
        result, error = self.result(ref)
        if result is None or not readable(result, job):
            if stopping:  # a task cancelled by the stop: the sweep's last line says it
                return
            if result is None:
                self.task_failed(job, f"its Ray task failed: {last_line(error)} (Ray's whole "
                                      f"error is in {shown_path(job.log)})", error)
            else:  # a node with another minitfm, say
                self.task_failed(job, "its Ray task sent back a result this minitfm does not "
                                      "read: install the same minitfm on every node")
            return
        self.nodes.add(str(result.get("node")))
        self.modes.add(result["mode"])
        refused = {}
        for spec in job.specs:
            if result["mode"] == "copied":
                try:
                    receive(spec, result["runs"][spec.id], result["logs"][spec.id])
                except MinitfmError as err:  # this run fails; the others go on
                    refused[spec.id] = str(err)
        if stopping:
            return
        alone = not job.others or result["mode"] == "copied"  # one exit code a run
        for spec in job.specs:
            code = result["exits"][spec.id]
            if spec.id in refused:
                self.failed.append(spec)
                self.say(f"failed: {spec.id}; {refused[spec.id]}")
            elif code != 0 and alone:
                self.failed_with(spec, Job(spec, []).log, f" (exit {code})")
            else:  # done, or a stack's command failed: each run ended as its files say
                self.ended(spec, job, run_status(spec.run_dir) in DONE)

    def task_failed(self, job: Job, why: str, error: str = "") -> None:
        """Report each run of a job whose task failed as a task (`why`); Ray's `error`, whole,
        in the job's log."""
        if error:
            with open_run_file(job.log, "a") as log:
                log.write(f"minitfm sweep: the Ray task of this job failed:\n{error}\n")
        for spec in job.specs:
            self.failed.append(spec)
            self.say(f"failed: {spec.id}; {why}")

    def summary(self) -> str:
        """Which nodes ran the tasks and how their files came back."""
        shared = "written in place (the workers see the sweep folder)"
        copied = (f"sent back through Ray's object store (the workers do not see the sweep "
                  f"folder; at most {MAX_RETURN // 10**9} GB a run)")
        modes = [shared if mode == "shared" else copied for mode in sorted(self.modes)]
        return (f"on Ray: {len(self.nodes)} node{'s' * (len(self.nodes) != 1)} ran the jobs; "
                f"run directories {' and '.join(modes) or 'none'}")


def readable(result: Any, job: Job) -> bool:
    """Whether a task's result is one `run_work` makes, for each of the job's runs (a node with
    another minitfm may send another)."""
    try:
        packed = ("runs", "logs") if result["mode"] == "copied" else ()
        for spec in job.specs:
            if type(result["exits"][spec.id]) is not int or \
                    not all(isinstance(result[key][spec.id], bytes) for key in packed):
                return False
        return result["mode"] in ("shared", "copied")
    except (TypeError, KeyError):
        return False


def ray_jobs(jobs: list[Job], plan, token: str) -> dict[int, Work]:
    """What each job's task needs (`Work`), by the job's id."""
    grid = replace(plan.grid, config=str(Path(plan.grid.config).resolve())
                   if plan.grid.config else None)  # a worker's folder is not ours
    return {id(job): Work(grid, [replace(spec, run_dir=spec.run_dir.resolve())
                                 for spec in job.specs],  # each path absolute, as the folder
                          plan.ranges, plan.threads, plan.samples, bool(job.others),
                          plan.folder.resolve(), Path.cwd(), token, job.env)
            for job in jobs if job.commands}


def run_on_ray(jobs: list[Job], plan, say: Callable[[str], None]) -> list[RunSpec]:
    """Run the plan's jobs on Ray (see the module docstring); the runs that failed."""
    if not any(job.commands for job in jobs):  # all done: nothing to ask a cluster for
        return []
    ray = connect(plan.ray_address, say)
    token = write_token(plan.folder)
    try:
        scheduler = RayScheduler(jobs, ray_jobs(jobs, plan, token), ray, say)
        failed = scheduler.run()
        say(scheduler.summary())
        return failed
    finally:
        (plan.folder / TOKEN).unlink(missing_ok=True)
        ray.shutdown()


def write_token(folder: Path) -> str:
    """A new token in the sweep folder, for the tasks to find."""
    token = secrets.token_hex(16)
    write_atomic(folder / TOKEN, token.encode())
    return token


# --- on the worker ---

def run_work(work: Work) -> dict[str, Any]:
    """A Ray task: run one job's commands where this worker is; which node it was, how the
    files went, each run's exit code (its last command's: 0 when all succeeded) and (without
    the shared folder) each run directory and log, packed."""
    import ray

    if threading.current_thread() is threading.main_thread():
        # Ray cancels a task by raising KeyboardInterrupt as a SIGINT would, which it cannot
        # where SIGINT is ignored (a worker of a Ray started from a shell's background job).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    node = ray.get_runtime_context().get_node_id()
    if sees_sweep_folder(work):
        code = run_job(job_of(work, work.grid, work.specs),
                       work.cwd if work.cwd.is_dir() else None)
        return {"node": node, "mode": "shared", "exits": {spec.id: code for spec in work.specs}}
    runs, logs, exits = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="minitfm-ray-") as tmp:
        for spec in work.specs:  # each alone: a stack's command reads the sweep folder
            config = Path(tmp) / f"{spec.id}.yaml"
            config.write_text(to_yaml(spec.cfg), encoding="utf-8")
            here = RunSpec(spec.id, spec.choice, [], spec.cfg, Path(tmp) / spec.id)
            job = plan_job(Grid(str(config), [], []), here, work.ranges, work.threads,
                           work.samples)
            job.env = work.env
            exits[spec.id] = run_job(job, Path(tmp))
            runs[spec.id] = pack(here.run_dir)
            logs[spec.id] = job.log.read_bytes() if job.log.is_file() else b""
    return {"node": node, "mode": "copied", "exits": exits, "runs": runs, "logs": logs}


def sees_sweep_folder(work: Work) -> bool:
    """Whether this worker sees the driver's sweep folder (it holds the token)."""
    try:
        return (work.folder / TOKEN).read_text() == work.token
    except (OSError, UnicodeDecodeError):
        return False


def job_of(work: Work, grid: Grid, specs: list[RunSpec]) -> Job:
    """The job's commands planned now, as a resumed sweep plans them (a retry goes on from the
    run's last.pt)."""
    if not work.stacked:
        job = plan_job(grid, specs[0], work.ranges, work.threads, work.samples)
        job.env = work.env
        return job
    command = Command(stack_command(work.folder, specs, work.threads, work.samples,
                                    work.ranges))
    return Job(specs[0], [command], others=specs[1:], env=work.env)


def run_job(job: Job, cwd: Path | None) -> int:
    """Run the job's commands one after the other as the local scheduler would, up to the
    first that fails; the exit code of the last one run (0: all succeeded, or none was left).
    A KeyboardInterrupt (the driver cancelled the task) is passed on to the running child as
    SIGINT, which saves its last.pt, and raised once it has ended."""
    code = 0
    while job.commands:
        proc = launch(job, cwd, preexec_fn=child_signals)
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            keep_result(job.commands.pop(0), proc.returncode)
            raise
        code = proc.returncode
        keep_result(job.commands.pop(0), code)
        if code != 0:
            break
    return code


def child_signals() -> None:
    """In a child, before it runs: SIGINT and SIGTERM unblocked (a Ray worker blocks them, and
    a child inherits the mask: it would never hear them), and SIGTERM when the worker that
    started it dies (Linux), so that a killed node's trainings save their last.pt and free
    their runs for the retry."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
