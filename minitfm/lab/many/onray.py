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
`MAX_RETURN` bytes); the driver writes it into the sweep folder whole. Each task says which it
did, and the sweep says so at the end.

Nothing lost when something dies: a task whose worker or node dies is retried by Ray
(`MAX_RETRIES`), and a retried job plans its commands again, as a resumed sweep does: from the
run's last checkpoint where the folder is shared (the dying worker's children get SIGTERM, and
save it), from the start where not. Ctrl-C or SIGTERM of the driver cancels the tasks (each
child gets SIGINT and saves its last.pt) and the same command goes on. Ray is imported here
only, and only by `--on ray`.
"""

from __future__ import annotations

import ctypes
import io
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from minitfm.config import to_yaml
from minitfm.errors import Interrupted, MinitfmError, quote
from minitfm.lab.many.grid import Grid, RunSpec
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
from minitfm.run.files import to_json, write_atomic
from minitfm.run.signals import CaughtSignals
from minitfm.run.summary import DONE, run_status

RAY_MISSING = "Ray is not installed: pip install 'minitfm[ray]' (on every node of the cluster)"
ADDRESS_ENV = "RAY_ADDRESS"
MAX_RETRIES = 3  # Ray retries a task whose worker or node died this many times
MAX_RETURN = 1_000_000_000  # bytes of a run directory sent back through the object store
TOKEN = ".minitfm-ray-token"  # in the sweep folder: a task that reads it sees the folder
CONNECT_S = 5.0  # how long the driver tries to reach a cluster's address before saying so


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


def connect(address: str | None, say: Callable[[str], None]):
    """Ray, connected to the cluster at `address` (else $RAY_ADDRESS, else a Ray started on this
    machine for this sweep); a missing Ray or an unreachable cluster is one line."""
    try:
        import ray
    except ImportError:
        raise MinitfmError(RAY_MISSING) from None
    logging.getLogger("ray").setLevel(logging.ERROR)  # its notices are not the sweep's lines
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address is not None and address != "auto":
        check_reachable(address)
    # With no address Ray would join any cluster it finds running here (`ray start` leaves its
    # address in /tmp/ray); "local" starts one of this sweep's own, as the help says.
    ray.init(address=address or "local", logging_level="ERROR", log_to_driver=False,
             include_dashboard=False, configure_logging=False)
    nodes = [node for node in ray.nodes() if node["Alive"]]
    cpus = sum(node["Resources"].get("CPU", 0) for node in nodes)
    where = f"the cluster at {address}" if address else "a Ray started on this machine"
    say(f"on Ray: {where}, {len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus:.0f} CPUs")
    return ray


def check_reachable(address: str) -> None:
    """Refuse at once, in one line, an address nothing answers at (Ray would wait minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_S):
            pass
    except (OSError, ValueError) as err:
        raise MinitfmError(f"cannot reach the Ray cluster at {quote(address)} "
                           f"({getattr(err, 'strerror', None) or err}): start it (ray start "
                           f"--head), or give its address with --ray-address HOST:PORT") from None


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
                    job = pending.pop(ref)
                    self.finish(job, self.result(ref), bool(signals.received))
        if signals.received:
            signum = signals.received[0]
            raise Interrupted(stop_message(signum, stopped), 128 + signum)
        return self.failed

    def result(self, ref) -> dict | None:
        """A task's result; None when it failed as a task (cancelled, out of retries)."""
        try:
            return self.ray.get(ref)
        except Exception:  # noqa: BLE001 - Ray's errors: each run's files say where it got
            return None

    def finish(self, job: Job, result: dict | None, stopping: bool) -> None:
        """Write what came back (runs trained without the shared folder), then report."""
        if result is not None:
            self.nodes.add(result["node"])
            self.modes.add(result["mode"])
            for run_id, data in result.get("runs", {}).items():
                spec = next(spec for spec in job.specs if spec.id == run_id)
                receive(spec, data, result["logs"][run_id])
        if stopping:
            return
        for spec in job.specs:
            self.ended(spec, job, run_status(spec.run_dir) in DONE)

    def summary(self) -> str:
        """Which nodes ran the tasks and how their files came back."""
        shared = "written in place (the workers see the sweep folder)"
        copied = (f"sent back through Ray's object store (the workers do not see the sweep "
                  f"folder; at most {MAX_RETURN // 10**9} GB a run)")
        modes = [shared if mode == "shared" else copied for mode in sorted(self.modes)]
        return (f"on Ray: {len(self.nodes)} node{'s' * (len(self.nodes) != 1)} ran the jobs; "
                f"run directories {' and '.join(modes) or 'none'}")


def ray_jobs(jobs: list[Job], plan, token: str) -> dict[int, Work]:
    """What each job's task needs (`Work`), by the job's id."""
    grid = replace(plan.grid, config=str(Path(plan.grid.config).resolve())
                   if plan.grid.config else None)  # a worker's folder is not ours
    return {id(job): Work(grid, job.specs, plan.ranges, plan.threads, plan.samples,
                          bool(job.others), plan.folder.resolve(), Path.cwd(), token)
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
    files went, and (without the shared folder) each run directory and log, packed."""
    import ray

    if threading.current_thread() is threading.main_thread():
        # Ray cancels a task by raising KeyboardInterrupt as a SIGINT would, which it cannot
        # where SIGINT is ignored (a worker of a Ray started from a shell's background job).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    node = ray.get_runtime_context().get_node_id()
    if sees(work):
        run_job(job_of(work, work.grid, work.specs), work.cwd if work.cwd.is_dir() else None)
        return {"node": node, "mode": "shared"}
    runs, logs = {}, {}
    with tempfile.TemporaryDirectory(prefix="minitfm-ray-") as tmp:
        for spec in work.specs:  # each alone: a stack's command reads the sweep folder
            config = Path(tmp) / f"{spec.id}.yaml"
            config.write_text(to_yaml(spec.cfg), encoding="utf-8")
            here = RunSpec(spec.id, spec.choice, [], spec.cfg, Path(tmp) / spec.id)
            job = plan_job(Grid(str(config), [], []), here, work.ranges, work.threads,
                           work.samples)
            run_job(job, Path(tmp))
            runs[spec.id] = pack(here.run_dir)
            logs[spec.id] = job.log.read_bytes() if job.log.is_file() else b""
    return {"node": node, "mode": "copied", "runs": runs, "logs": logs}


def sees(work: Work) -> bool:
    """Whether this worker sees the driver's sweep folder (it holds the token)."""
    try:
        return (work.folder / TOKEN).read_text() == work.token
    except (OSError, UnicodeDecodeError):
        return False


def job_of(work: Work, grid: Grid, specs: list[RunSpec]) -> Job:
    """The job's commands planned now, as a resumed sweep plans them (a retry goes on from the
    run's last.pt)."""
    if not work.stacked:
        return plan_job(grid, specs[0], work.ranges, work.threads, work.samples)
    command = Command(stack_command(work.folder, specs, work.threads, work.samples,
                                    work.ranges))
    return Job(specs[0], [command], others=specs[1:])


def run_job(job: Job, cwd: Path | None) -> None:
    """Run the job's commands one after the other as the local scheduler would, up to the
    first that fails; a KeyboardInterrupt (the driver cancelled the task) is passed on to the
    running child as SIGINT, which saves its last.pt, and raised once it has ended."""
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
        keep_result(job.commands.pop(0), proc.returncode)
        if proc.returncode != 0:
            return


def child_signals() -> None:
    """In a child, before it runs: SIGINT and SIGTERM unblocked (a Ray worker blocks them, and
    a child inherits the mask: it would never hear them), and SIGTERM when the worker that
    started it dies (Linux), so that a killed node's trainings save their last.pt and free
    their runs for the retry."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def pack(run_dir: Path) -> bytes:
    """A run directory as a tar archive, refused past MAX_RETURN bytes."""
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    if size > MAX_RETURN:
        raise MinitfmError(f"the run directory {run_dir.name} holds {size:,} bytes, more than "
                           f"the {MAX_RETURN:,} a task sends back through Ray's object store: "
                           f"give the workers a shared folder for the sweep")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        archive.add(run_dir, arcname=run_dir.name)
    return data.getvalue()


# --- back on the driver ---

def receive(spec: RunSpec, data: bytes, log: bytes) -> None:
    """A run directory sent back, written into the sweep folder whole (unpacked beside it, then
    renamed into place), its evaluations naming its checkpoint here; its log appended."""
    folder = spec.run_dir.parent
    incoming = Path(tempfile.mkdtemp(prefix=f".{spec.id}.incoming-", dir=folder))
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            archive.extractall(incoming, filter="data")  # no path outside, no links out
        arrived = incoming / spec.id
        for report in arrived.glob("eval-*.json"):
            found = json.loads(report.read_text(encoding="utf-8"))
            found["checkpoint"] = str(spec.run_dir / "checkpoints" / "last.pt")
            report.write_text(to_json(found) + "\n", encoding="utf-8")
        old = folder / f".{spec.id}.old-{secrets.token_hex(4)}"
        if spec.run_dir.exists():
            spec.run_dir.rename(old)
        arrived.rename(spec.run_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
    with open(folder / f"{spec.id}.log", "ab") as f:
        f.write(log)
