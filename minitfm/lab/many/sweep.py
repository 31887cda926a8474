"""`minitfm sweep`: a grid of runs as parallel processes, each evaluated, in one table and plot.

The grid uses Hydra's multirun syntax: `model.positional=rope,alibi seed=0,1` is four runs; a
key with one value is a fixed override of every run. Every run is a normal run directory in one
sweep folder `runs/sweep-<name>-<changes>-<YYYYmmdd-HHMMSS>/`, `<changes>` what the grid changes
in the config file (`grid.grid_text`: `lr0.005`; none, and the folder is `sweep-<name>-<stamp>`).
Its `sweep.json` holds the grid and the resolved base config, so the same command finds the
folder again and resumes: finished runs are skipped, interrupted ones continue; an edited base
config gets a new folder. One sweep at a
time holds a folder (`.lock`). A job is a chain of real commands (`minitfm train`, then
`minitfm eval --json` per length range), which `--dry-run` prints for any other scheduler.
Each job's threads are fixed so that jobs x threads never exceed the cores (see
minitfm.run.threads). No torch here.

The grid is read in `grid.py`, the folder named and found again in `sweep_folder.py`, the jobs
run in `scheduler.py`, the results written in `results.py`; here they meet: the plan, checked
whole before anything is written, and the folder's lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minitfm.config import BUILT_IN_CODES, EVAL_BATCH_SIZE
from minitfm.errors import MinitfmError, quote, shown_path
from minitfm.lab.many.grid import (
    Grid,
    RunSpec,
    parse_grid,
    parse_lengths,
    plan_runs,
    stated_shortfall,
)
from minitfm.lab.many.results import SweepResult, eval_ranges, result_row, write_results
from minitfm.lab.many.runs import SWEEP_FILE
from minitfm.lab.many.scheduler import PROCESS_BYTES, Command, Job, Scheduler, plan_job
from minitfm.lab.many.space import PRUNERS, SAMPLERS
from minitfm.lab.many.stacking import (
    choose_stacking,
    done_text,
    plan_stacks,
    stack_command,
    stacks_text,
    unstacked_why,
)
from minitfm.lab.many.sweep_folder import (
    base_config,
    check_folder,
    check_out,
    sweep_folder,
    sweep_name,
)
from minitfm.lab.options import SweepOptions
from minitfm.lab.watch.tracking import SweepRun, python_warning
from minitfm.run.files import to_json, write_atomic
from minitfm.run.limits import check_fits, decoding_parts, training_parts
from minitfm.run.rundir import (
    check_writable,
    lock_exclusively,
    make_dirs,
    open_run_file,
    remove_files,
)
from minitfm.run.threads import cores


def job_shape(runs: int, jobs: int | None, threads: int | None) -> tuple[int, int]:
    """(parallel jobs, threads each) with jobs x threads <= cores (one thread each by default:
    two 1-thread runs at once beat two 2-thread runs one after the other)."""
    n = cores()
    if threads is None:
        threads = max(1, n // jobs) if jobs else 1
    if jobs is None:
        jobs = max(1, min(runs, n // threads))
    if jobs * threads > n:
        why = ("OpenMP threads that share cores spin and slow every job down" if threads > 1
               else "jobs beyond them only wait for a core, each holding its memory")
        fix = f"--threads to {n}" if threads > n else f"--jobs to {n // threads}"
        raise MinitfmError(f"--jobs ({jobs}) x --threads ({threads}) exceeds the {n} cores: "
                           f"{why}; lower {fix} or less")
    return jobs, threads


def check_memory(runs: list[RunSpec], parallel: int) -> None:
    """The jobs that run at once must fit together: each is a process with torch, plus its run."""
    at_once = min(parallel, len(runs))
    if at_once < 2:  # one run alone was checked with the grid
        return
    sizes = sorted((sum(part[2] for part in training_parts(spec.cfg)) for spec in runs),
                   reverse=True)
    need = at_once * PROCESS_BYTES + sum(sizes[:at_once])
    check_fits([("--jobs", at_once, need)], f"{at_once} runs at once")


def check_evaluations(runs: list[RunSpec], ranges: list, samples: int) -> None:
    """Every evaluation of every run must be possible (positions, memory): refused now, not
    after the training."""
    names = ("--eval-samples", "--eval-lengths")
    for spec in runs:
        for lo, hi in eval_ranges(spec, ranges):
            short = stated_shortfall(spec.cfg, hi)  # the trained range was checked with the grid
            if short is not None:
                raise MinitfmError(f"--eval-lengths {lo}..{hi} needs {short.needed} positions but "
                                   f"{spec.named} learns {spec.cfg.model.max_len} "
                                   f"(model.max_len): evaluate up to a shorter length, or "
                                   f"raise model.max_len")
            check_fits(decoding_parts(spec.cfg, samples, hi, EVAL_BATCH_SIZE, names),
                       "evaluation")


@dataclass
class Plan:
    """A validated sweep: its runs, where they go, how many at once, what to evaluate."""

    grid: Grid
    runs: list[RunSpec]
    skipped: list[str]  # invalid combinations left out (--skip-invalid), with the reason
    folder: Path
    parallel: int
    threads: int  # per job
    ranges: list[tuple[int, int]]  # --eval-lengths
    samples: int
    base: dict[str, Any]  # what every run shares (see base_config), stored in sweep.json
    note: str | None = None  # why the folder is a new one, when an old one held this grid
    stacks: list[list[RunSpec]] = field(default_factory=list)  # none: each run alone
    stacking: str = ""  # why the runs are stacked or not (see stacking.choose_stacking)
    on: str = "local"  # where the jobs run: local processes, or Ray tasks (ray_launcher.py)
    ray_address: str | None = None
    search: Any = None  # a search (`search.Search`): its trials are drawn as it goes
    checked: list[RunSpec] = field(default_factory=list)  # a search's ends, checked as runs
    fixed: dict[str, str] = field(default_factory=dict)  # the fixed keys that change the file

    def notes(self, dry_run: bool = False) -> list[str]:
        """What to say besides the plan: a new folder's reason; for `--dry-run` (whose stdout is
        its lines alone), the combinations it left out and, where the sweep would stack runs,
        that its lines train each run alone."""
        if not dry_run:
            return [self.note] if self.note else []
        skipped = [f"skipped (invalid) {reason}" for reason in self.skipped]
        working = [job for job in self.jobs() if job.commands]
        stacked = [f"these lines train each run alone; minitfm sweep itself would train them "
                   f"{stacks_text(working)}; stacked: {self.stacking}"] \
            if any(job.others for job in working) else []
        return [*([self.note] if self.note else []), *skipped, *stacked]

    def record(self) -> dict[str, Any]:
        """What `sweep.json` holds: the grid and the base config."""
        return {"grid": self.grid.spec(), "base": self.base}

    def jobs(self, alone: bool = False) -> list[Job]:
        """What is left to do: a job per run, or per stack of runs that still have work (unless
        `alone`: a job per run, as `--dry-run` prints them for any scheduler)."""
        each = [plan_job(self.grid, spec, self.ranges, self.threads, self.samples)
                for spec in self.runs]
        if not self.stacks or alone:
            return each
        left = {job.spec.id: job for job in each if job.commands}
        jobs = [job for job in each if not job.commands]  # done: nothing left
        for stack in self.stacks:
            specs = [spec for spec in stack if spec.id in left]
            if len(specs) == 1:  # a stack of one is a run alone
                jobs.append(left[specs[0].id])
            elif specs:
                command = Command(stack_command(self.folder, specs, self.threads, self.samples,
                                                self.ranges))
                jobs.append(Job(specs[0], [command], others=specs[1:]))
        return jobs


def prepare(config: str | None, items: list[str],
            options: SweepOptions = SweepOptions()) -> Plan:
    """Parse and validate the whole grid (`items`, over the base `config`) before anything is
    written (a sweep with ranges is a search: `search.prepare_search`)."""
    check_search_options(options, False)
    check_launcher(options)
    swept, fixed = parse_grid(items, options.seeds)
    grid = Grid(config, swept, fixed)
    ranges = [parse_lengths(text) for text in options.eval_lengths or ()]
    name = sweep_name(options.name, config)
    out = options.out
    if out is not None:
        check_out(out)
    if options.on == "ray":  # the cluster's CPUs and memory are Ray's to share out
        parallel, per_job = math.prod(len(v) for _, v in swept), options.threads or 1
    else:
        parallel, per_job = job_shape(math.prod(len(v) for _, v in swept), options.jobs,
                                      options.threads)
    runs, skipped = plan_runs(grid, per_job, options.skip_invalid)
    if options.on == "ray":
        check_no_workbook(runs)
    else:
        check_memory(runs, parallel)
    samples = options.eval_samples
    check_evaluations(runs, ranges, samples)
    base = base_config(runs, grid)
    folder, note = sweep_folder(grid, name, out, base, runs)
    for spec in runs:
        spec.run_dir = folder / spec.id
    stacked, why = choose_stacking(runs, options.stack)
    stacks = plan_stacks(runs, 1 if options.on == "ray" else parallel) if stacked else []
    if stacked and all(len(stack) < 2 for stack in stacks):
        stacks, why = [], unstacked_why(parallel)
    return Plan(grid, runs, skipped, folder, parallel, per_job, ranges, samples, base, note,
                stacks, why, options.on, options.ray_address)


def check_launcher(options: SweepOptions) -> None:
    """`--on` is local or ray; `--ray-address` goes with ray, `--jobs` with local."""
    if options.on not in ("local", "ray"):
        raise MinitfmError(f"--on ({quote(options.on)}) must be local (processes of this "
                           f"machine) or ray (tasks on a Ray cluster)")
    if options.ray_address is not None and options.on != "ray":
        raise MinitfmError("--ray-address goes with --on ray: add --on ray")
    if options.jobs is not None and options.on == "ray":
        raise MinitfmError("--jobs is for --on local: on Ray the cluster's CPUs decide how "
                           "many jobs run at once (each asks for --threads CPUs)")


def check_search_options(options, searching: bool) -> None:
    """--trials, --sampler, --sampler-seed and --prune go with a search; and their values."""
    if not searching:
        given = [flag for flag, value, default in (
            ("--trials", options.trials, None), ("--sampler", options.sampler, "tpe"),
            ("--prune", options.prune, "none"), ("--sampler-seed", options.sampler_seed, 0))
            if value != default]
        if given:
            raise MinitfmError(f"{given[0]} goes with a search: give a range to search, e.g. "
                               f"train.lr=tag(log,interval(1e-3,3e-2)) (a plain KEY=a,b is a "
                               f"grid: every value is run)")
        return
    if options.sampler not in SAMPLERS:
        raise MinitfmError(f"--sampler ({quote(options.sampler)}) must be one of "
                           f"{', '.join(SAMPLERS)}")
    if options.prune not in PRUNERS:
        raise MinitfmError(f"--prune ({quote(options.prune)}) must be one of "
                           f"{', '.join(PRUNERS)}")
    if options.stack:
        raise MinitfmError("--stack trains a grid's runs side by side as one model; a search "
                           "draws its trials one by one: leave out --stack")


def check_no_workbook(runs: list[RunSpec]) -> None:
    """A workbook's code is a folder on this machine: its runs train here only."""
    for spec in runs:
        if spec.cfg.model.code not in BUILT_IN_CODES:
            raise MinitfmError(f"{spec.named} trains the workbook "
                               f"{quote(spec.cfg.model.code)}, a folder of this machine: train "
                               f"a workbook's runs without --on ray")


def dry_run_lines(plan: Plan) -> list[str]:
    """One line of shell per run that still has work: its commands joined by &&, each run
    alone (a stack's `minitfm stack` reads the sweep.json that only the sweep writes)."""
    return [" && ".join(command.shell() for command in job.commands)
            for job in plan.jobs(alone=True) if job.commands]


def run_sweep(plan: Plan, say: Callable[[str], None],
              warn: Callable[[str], None] = python_warning) -> SweepResult:
    """Run what is left of the grid, then write and return the results (failed runs too); with
    log.mlflow, as the children of an MLflow run of the sweep's (`warn` says its failure)."""
    if plan.on == "ray" and any(job.commands for job in plan.jobs()):
        from minitfm.lab.many.raycluster import check_cluster  # Ray is imported there only

        check_cluster(plan.ray_address)  # one line, before the sweep folder is made
    tracker = SweepRun.of([spec.cfg for spec in plan.runs])  # and so is a tracker's
    with SweepLock(plan.folder):
        check_folder(plan.folder, plan.grid, plan.base, plan.runs)  # no sweep came between
        check_writable(plan.folder, [f"{spec.id}.log" for spec in plan.runs])  # appended to
        record = to_json(plan.record(), indent=1) + "\n"
        write_atomic(plan.folder / SWEEP_FILE, record.encode("utf-8"))
        for spec in plan.runs:  # left by a sweep killed midway; under the lock, none is live
            remove_files(spec.run_dir, r"\.eval-.+\.tmp")
        jobs = plan.jobs()
        say(f"sweep folder: {shown_path(plan.folder)}")
        for text in plan.notes():
            say(f"note: {text}")
        for reason in plan.skipped:
            say(f"skipped (invalid) {reason}")
        say(plan_line(plan, jobs))
        with tracker.watching(plan.folder, plan.base, plan.grid.swept, warn) if tracker \
                else nullcontext({}) as env:
            for job in jobs:
                job.env = env  # the sweep's MLflow run, for its runs to nest under
            failed = launch_jobs(jobs, plan, say)
            keys = [key for key, _ in plan.grid.swept]
            rows = [result_row(spec, plan.ranges) for spec in plan.runs]
            write_results(plan.folder, rows, keys, list(plan.runs[0].fixed))
    return SweepResult(plan.folder, rows, keys, [spec.id for spec in failed])


def plan_line(plan: Plan, jobs: list[Job]) -> str:
    """What the sweep is about to do: `8 runs (0 already done), 2 at a time, 1 thread each`,
    in stacks and on Ray as it will, and why it stacks or not, in words true of what it does:
    runs already done are not trained again, however they were trained (it says how, where
    that differs, and the way to a sweep of their own)."""
    done = [job.spec for job in jobs if not job.commands]
    working = [job for job in jobs if job.commands]
    ran = f"{len(plan.runs)} runs ({len(done)} already done{done_text(done, bool(plan.stacks))})"
    if not working:
        again = "; to train them stacked, give a --name (a sweep folder of its own)" \
            if plan.stacks and done_text(done, True) else ""
        return f"{ran}: nothing left to train{', so nothing to stack' if plan.stacks else ''}" \
            f"{again}"
    unit = "CPU" if plan.on == "ray" else "thread"
    each = f"{plan.threads} {unit}{'s' if plan.threads > 1 else ''} each"
    at_once = "as Ray tasks" if plan.on == "ray" else \
        f"{min(plan.parallel, len(working))} at a time"
    if any(job.others for job in working):
        cut = plan.on == "local" and len(plan.stacks) < min(plan.parallel, len(plan.runs))
        fewer = f"; {len(working)} at a time rather than {plan.parallel}: a stack holds two " \
                f"runs or more" if cut and len(working) < plan.parallel else ""
        return (f"{ran} {stacks_text(working)}, {at_once}, {each}; stacked: {plan.stacking}"
                f"{fewer}")
    why = "each model shape has one run left to train" if plan.stacks else plan.stacking
    return f"{ran}, {at_once}, {each}{f'; not stacked: {why}' if why else ''}"


def launch_jobs(jobs: list[Job], plan: Plan, say: Callable[[str], None]) -> list[RunSpec]:
    """Run the jobs where `--on` says: this machine's processes, or Ray's tasks; the runs that
    failed."""
    if plan.on == "ray":
        from minitfm.lab.many.ray_launcher import run_on_ray  # Ray is imported there only

        return run_on_ray(jobs, plan, say)
    return Scheduler(jobs, plan.parallel, say).run()


class SweepLock:
    """An exclusive lock on a sweep folder while one sweep runs in it.

    As `run.rundir.RunLock` for a run: `flock`, which the kernel drops when the process dies,
    so a killed sweep never blocks the next one; a second sweep in the folder is refused.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.file = None

    def __enter__(self) -> SweepLock:
        check_writable(self.folder, [".lock"])
        try:
            make_dirs(self.folder)
            self.file = open_run_file(self.folder / ".lock", "a+")
        except OSError as err:
            raise MinitfmError(f"cannot create the sweep folder {quote(str(self.folder))} "
                               f"({err.strerror}): check --out or log.dir") from None
        lock_exclusively(self.file, lambda pid: MinitfmError(
            f"sweep folder {quote(str(self.folder))} is in use by another sweep (pid {pid}): "
            f"wait for it to end, or give another --out"))
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()  # closing the file drops the lock


