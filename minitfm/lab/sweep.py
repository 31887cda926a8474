"""`minitfm sweep`: a grid of runs as parallel processes, each evaluated, in one table and plot.

The grid uses Hydra's multirun syntax: `model.positional=rope,alibi seed=0,1` is four runs; a
key with one value is a fixed override of every run. Every run is a normal run directory in one
sweep folder `runs/sweep-<name>-<YYYYmmdd-HHMMSS>/` (its `sweep.json` holds the grid, so the same
command finds the folder again and resumes: finished runs are skipped, interrupted ones
continue). A job is a chain of real commands (`minitfm train`, then `minitfm eval --json` per
length range), which `--dry-run` prints for any other scheduler. Each job's threads are fixed
so that jobs x threads never exceed the cores (see minitfm.run.threads). No torch here.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from minitfm.config import Config, load_config, parse_override
from minitfm.errors import ConfigError, Interrupted, MinitfmError
from minitfm.lab.runs import SWEEP_FILE
from minitfm.run.files import write_atomic
from minitfm.run.limits import check_fits, training_parts
from minitfm.run.rundir import DONE, read_summary, run_status
from minitfm.run.signals import CaughtSignals
from minitfm.run.threads import cores

MINITFM = [sys.executable, "-m", "minitfm"]


@dataclass
class Grid:
    """What a sweep command asks for: a base config, swept keys and fixed overrides."""

    config: str | None
    swept: list[tuple[str, list[str]]]  # (key, value texts) in the order given
    fixed: list[str]  # KEY=VALUE applied to every run

    def spec(self) -> dict[str, Any]:
        """The grid as stored in `sweep.json`: what makes two sweeps the same sweep."""
        config = str(Path(self.config).resolve()) if self.config else None
        return {"config": config, "swept": [[k, v] for k, v in self.swept], "fixed": self.fixed}


@dataclass
class RunSpec:
    """One run of the grid: its values of the swept keys, overrides, config and directory."""

    id: str
    choice: dict[str, str]  # swept key -> value text
    overrides: list[str]
    cfg: Config
    run_dir: Path

    @property
    def label(self) -> str:
        """The configuration this run belongs to: its choice without the seed."""
        return ", ".join(f"{k}={v}" for k, v in self.choice.items() if k != "seed") or "all"


def parse_grid(items: list[str], seeds: str | None) -> tuple[list, list[str]]:
    """`KEY=V1,V2` items (and `--seeds`) -> (swept keys with their values, fixed overrides)."""
    swept, fixed = [], []
    for item in [*items, *([f"seed={seeds}"] if seeds is not None else [])]:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"grid item '{item}' must look like KEY=V1,V2,..., e.g. "
                              f"model.positional=rope,alibi")
        if key == "threads":
            raise ConfigError(f"grid item '{item}': sweep sets threads per job; use --threads N "
                              f"(and --jobs N)")
        values = [v.strip() for v in text.split(",")]
        if not any(values) or (len(values) > 1 and not all(values)):
            raise ConfigError(f"grid item '{item}' has an empty value: give {key}=V1,V2,... "
                              f"(null for None)")
        if key in dict(swept):  # a fixed value given again is overridden, as in `train`
            raise ConfigError(f"grid key '{key}' is swept twice: list all its values in one "
                              f"item, {key}=A,B")
        if len(values) == 1:
            fixed.append(f"{key}={values[0]}")
        else:
            swept.append((key, values))
    return swept, fixed


def short_names(keys: list[str]) -> dict[str, str]:
    """`model.positional` -> `positional`, unless two keys would share a name."""
    last = [key.rpartition(".")[2] for key in keys]
    return {key: name if last.count(name) == 1 else key for key, name in zip(keys, last)}


def run_id(choice: dict[str, str]) -> str:
    """A file-name-safe id such as `positional=rope,random_positions=64,seed=0`."""
    names = short_names(list(choice))
    text = ",".join(f"{names[k]}={v}" for k, v in choice.items()) or "run"
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)


def plan_runs(grid: Grid, folder: Path, threads: int,
              skip_invalid: bool = False) -> tuple[list[RunSpec], list[str]]:
    """Every run of the grid, each config validated: one bad value refuses the whole grid,
    unless `skip_invalid` (then the second list says which were left out, and why)."""
    keys = [key for key, _ in grid.swept]
    runs, skipped = [], []
    for values in itertools.product(*(v for _, v in grid.swept)):
        choice = dict(zip(keys, values))
        overrides = [*grid.fixed, *(f"{k}={v}" for k, v in choice.items())]
        try:
            cfg = load_config(grid.config, [*overrides, f"threads={threads}"])
            check_fits(training_parts(cfg), "training")  # a MinitfmError: never skipped
        except ConfigError as err:
            if not skip_invalid or not choice:
                where = f" (in the run {run_id(choice)})" if choice else ""
                raise ConfigError(f"{err}{where}") from None
            skipped.append(f"{run_id(choice)}: {err}")
            continue
        runs.append(RunSpec(run_id(choice), choice, overrides, cfg, folder / run_id(choice)))
    if not runs:
        raise ConfigError(f"no valid run in the grid: {skipped[0]}")
    return runs, skipped


def sweep_folder(grid: Grid, name: str, out: Path | None) -> Path:
    """`out`, else the newest `<log.dir>/sweep-<name>-*` with this grid, else a new one."""
    if out is not None:
        stored = read_spec(out)
        if stored is not None and stored != grid.spec():
            raise MinitfmError(f"--out '{out}' holds another sweep (its grid is in "
                               f"{out / SWEEP_FILE}): pick another folder")
        return out
    cfg = load_config(grid.config, grid.fixed)
    check_fits(training_parts(cfg), "training")  # the grid's fixed part alone must fit
    base = Path(cfg.log.dir)
    same = [p for p in sorted(base.glob(f"sweep-{name}-*")) if read_spec(p) == grid.spec()]
    if same:
        return same[-1]
    return base / f"sweep-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def read_spec(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / SWEEP_FILE).read_text(encoding="utf-8"))["grid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def eval_ranges(spec: RunSpec, extra: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The trained range first, then each `--eval-lengths` range not equal to it."""
    trained = (spec.cfg.task.min_len, spec.cfg.task.max_len)
    return [trained, *(r for r in extra if r != trained)]


def eval_path(spec: RunSpec, lo: int, hi: int) -> Path:
    return spec.run_dir / f"eval-{lo}-{hi}.json"


def train_command(grid: Grid, spec: RunSpec, threads: int) -> list[str]:
    """`minitfm train` for a new run, or `--resume` where a checkpoint is already there."""
    if (spec.run_dir / "checkpoints" / "last.pt").is_file():
        return [*MINITFM, "train", "--resume", str(spec.run_dir), f"threads={threads}"]
    config = [grid.config] if grid.config else []
    # --overwrite: what a start killed before its first checkpoint left
    return [*MINITFM, "train", *config, *spec.overrides, f"threads={threads}",
            "--run-dir", str(spec.run_dir), "--overwrite"]


def eval_command(spec: RunSpec, lo: int, hi: int, threads: int, samples: int) -> list[str]:
    return [*MINITFM, "eval", str(spec.run_dir), "--checkpoint", "last", "--json",
            "--samples", str(samples), "--min-len", str(lo), "--max-len", str(hi),
            "--threads", str(threads)]


@dataclass
class Step:
    """One command of a job; its stdout goes to `out` (appended to the job's log if None)."""

    argv: list[str]
    out: Path | None = None

    def shell(self) -> str:
        """The command as one line of shell, redirection included."""
        redirect = f" > {shlex.quote(str(self.out))}" if self.out else ""
        return shlex.join(self.argv) + redirect


@dataclass
class Job:
    """The commands still to run for one run of the grid."""

    spec: RunSpec
    steps: list[Step]
    started: float = field(default_factory=time.monotonic)

    @property
    def log(self) -> Path:
        # beside the run, not in it: a run directory holds only what `minitfm train` writes
        return self.spec.run_dir.parent / f"{self.spec.run_dir.name}.log"


def plan_job(grid: Grid, spec: RunSpec, ranges: list, threads: int, samples: int) -> Job:
    """What is left to do for `spec`: training unless it ended, evaluations not yet written."""
    steps = []
    if run_status(spec.run_dir) not in DONE:
        steps.append(Step(train_command(grid, spec, threads)))
    for lo, hi in eval_ranges(spec, ranges):
        if steps or read_eval(eval_path(spec, lo, hi)) is None:
            steps.append(Step(eval_command(spec, lo, hi, threads, samples),
                              eval_path(spec, lo, hi)))
    return Job(spec, steps)


POLL_S = 0.1  # how often the scheduler looks at its children


class Scheduler:
    """Runs jobs `parallel` at a time, each a chain of child processes; forwards signals.

    Children get their own session, so a terminal's Ctrl-C reaches only this process, which
    forwards it once to each child (a second Ctrl-C is forwarded again: children then stop at
    once). A training child saves `last.pt` and exits 130; the scheduler waits for them all.
    """

    def __init__(self, jobs: list[Job], parallel: int, say: Callable[[str], None]):
        self.pending = deque(job for job in jobs if job.steps)
        self.total = len(self.pending)
        self.parallel, self.say = parallel, say
        self.running: dict[subprocess.Popen, Job] = {}
        self.done: list[Job] = []
        self.failed: list[Job] = []
        self.forwarded = 0
        self.stopped = 0  # jobs running when the first signal came

    def run(self) -> list[Job]:
        """Run every job; returns the failed ones. A signal raises Interrupted at the end."""
        with CaughtSignals() as signals:
            while self.pending or self.running:
                while self.pending and len(self.running) < self.parallel and not signals.received:
                    job = self.pending.popleft()
                    job.started = time.monotonic()
                    self.start(job)
                self.forward(signals.received)
                for proc, job in list(self.running.items()):
                    if proc.poll() is not None:
                        del self.running[proc]
                        self.advance(proc.returncode, job, bool(signals.received))
                if signals.received and not self.running:
                    break
                time.sleep(POLL_S)
        if signals.received:
            raise Interrupted(f"{signal.Signals(signals.received[0]).name}: stopped "
                              f"{self.stopped} running job(s), each training one saved "
                              f"checkpoints/last.pt; run the same command again to resume",
                              128 + signals.received[0])
        return self.failed

    def start(self, job: Job) -> None:
        """Start the job's next command, its output going to its log or result file."""
        step = job.steps[0]
        job.spec.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(job.log, "a") as log, open(step.out.with_name(f".{step.out.name}.tmp")
                                               if step.out else os.devnull, "w") as out:
            proc = subprocess.Popen(step.argv, stdout=out if step.out else log, stderr=log,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.running[proc] = job

    def forward(self, received: list[int]) -> None:
        """Send each signal received since the last call to every running child."""
        if self.forwarded == 0 and received:
            self.stopped = len(self.running)
        for signum in received[self.forwarded:]:
            for proc in self.running:
                proc.send_signal(signum)
        self.forwarded = len(received)

    def advance(self, code: int, job: Job, stopping: bool) -> None:
        """After a command ended: keep its result, then start the next one or report."""
        step = job.steps.pop(0)
        if step.out is not None:  # an evaluation's JSON, kept only when it succeeded
            tmp = step.out.with_name(f".{step.out.name}.tmp")
            if code == 0:
                os.replace(tmp, step.out)
            else:
                tmp.unlink(missing_ok=True)
        if code != 0:
            if not stopping:
                self.failed.append(job)
                self.say(f"failed: {job.spec.id} (exit {code}); see {job.log}: "
                         f"{last_line(job.log)}")
        elif job.steps and not stopping:
            self.start(job)
        elif not job.steps:
            self.done.append(job)
            self.say(f"[{len(self.done)}/{self.total}] {job.spec.id}: "
                     f"{run_line(job.spec, time.monotonic() - job.started)}")


def last_line(path: Path) -> str:
    """The last non-empty line of a log file (the error a failed command printed)."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"


def run_line(spec: RunSpec, seconds: float) -> str:
    """`finished at step 350, exact match 99.1% (1..16) 3.2% (17..32), 21 s`."""
    summary = read_summary(spec.run_dir) or {}
    scores = " ".join(f"{em:.1%} ({span})" for span, em in exact_matches(spec).items()
                      if em is not None)
    return (f"{summary.get('status', '?')} at step {summary.get('step', '?')}, exact match "
            f"{scores}, {seconds:.0f} s")


def read_eval(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def exact_matches(spec: RunSpec, ranges: list = ()) -> dict[str, float | None]:
    """Exact match per evaluated range, `"A..B"` -> fraction (None: not evaluated)."""
    found = {}
    extra = list(ranges) or [r for r in map(range_of, spec.run_dir.glob("eval-*-*.json")) if r]
    for lo, hi in eval_ranges(spec, sorted(extra)):
        report = read_eval(eval_path(spec, lo, hi))
        found[f"{lo}..{hi}"] = report["exact_match"] if report else None
    return found


def range_of(path: Path) -> tuple[int, int] | None:
    """`eval-17-32.json` -> (17, 32)."""
    found = re.fullmatch(r"eval-(\d+)-(\d+)\.json", path.name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def per_length(spec: RunSpec, ranges: list) -> dict[int, float]:
    """Exact match per input length over every evaluated range."""
    lengths = {}
    for lo, hi in eval_ranges(spec, ranges):
        report = read_eval(eval_path(spec, lo, hi)) or {"per_length": {}}
        lengths.update({int(n): row["exact_match"] for n, row in report["per_length"].items()})
    return dict(sorted(lengths.items()))


def result_row(spec: RunSpec, ranges: list) -> dict[str, Any]:
    """One line of results.jsonl: the swept values, how the run went, its exact matches."""
    summary = read_summary(spec.run_dir) or {}
    values = {key: parse_override(f"{key}={text}")[1] for key, text in spec.choice.items()}
    return {"run": spec.id, "run_dir": str(spec.run_dir), **values,
            "configuration": spec.label, "status": run_status(spec.run_dir),
            "steps": summary.get("step"), "wall_s": summary.get("wall_s"),
            "trained_lengths": [spec.cfg.task.min_len, spec.cfg.task.max_len],
            "exact_match": exact_matches(spec, ranges), "per_length": per_length(spec, ranges)}


def write_results(folder: Path, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """results.jsonl (everything), results.csv (no per-length figures) and results.png."""
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    write_atomic(folder / "results.jsonl", lines.encode("utf-8"))
    spans = range_labels(rows)
    columns = ["run", *keys, "status", "steps", "wall_s", *(f"exact_match {s}" for s in spans)]
    with open(folder / "results.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            values = [row["run"], *(row[k] for k in keys), row["status"], row["steps"],
                      row["wall_s"], *(row["exact_match"].get(s) for s in spans)]
            writer.writerow(["null" if v is None else v for v in values])
    plot_results(rows, folder / "results.png")


def range_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Every evaluated range, in the order first met."""
    return list(dict.fromkeys(span for row in rows for span in row["exact_match"]))


def by_configuration(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by their configuration (the swept values but the seed), in order."""
    groups: dict[str, list] = {}
    for row in rows:
        groups.setdefault(row["configuration"], []).append(row)
    return groups


def plot_results(rows: list[dict[str, Any]], path: Path) -> None:
    """Exact match per input length, one line per configuration (mean over seeds)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    groups = by_configuration(rows)
    fig = Figure(figsize=(8 if len(groups) <= 6 else 11, 4.5), layout="constrained")
    ax = fig.add_subplot()
    colours = colormaps["tab20"].colors  # 20 distinct colours, then dashed lines
    for i, (label, group) in enumerate(groups.items()):
        lengths = sorted({int(n) for row in group for n in row["per_length"]})
        means = [mean(row["per_length"][n] for row in group if n in row["per_length"])
                 for n in lengths]
        ax.plot(lengths, means, marker="o", markersize=3, color=colours[i % 20],
                linestyle="-" if i < 20 else "--", label=short_label(label))
    if rows:
        lo, hi = rows[0]["trained_lengths"]
        ax.axvspan(lo - 0.5, hi + 0.5, color="0.9", zorder=0, label=f"trained {lo}..{hi}")
    ax.set(xlabel="input length", ylabel="exact match", ylim=(-0.02, 1.02),
           title="exact match per input length (greedy decoding, held-out data)")
    ax.grid(alpha=0.3)
    # beside the axes, not on them: with many configurations a legend inside hides the lines
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, format="png", dpi=120)


def short_label(configuration: str) -> str:
    """`task.name=copy, model.positional=rope` -> `name=copy, positional=rope`."""
    pairs = [part.partition("=")[::2] for part in configuration.split(", ")]
    names = short_names([key for key, _ in pairs])
    return ", ".join(f"{names[key]}={value}" for key, value in pairs)


def spread(values: list[float | None], form: str = "{:.1%}") -> str:
    """`97.3% ± 1.2%` (mean ± std) for several values, the value alone for one."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return form.format(values[0])
    return f"{form.format(mean(values))} ± {form.format(stdev(values))}"


@dataclass
class SweepResult:
    """What `minitfm sweep` shows at the end."""

    folder: Path
    rows: list[dict[str, Any]]
    keys: list[str]
    failed: list[str]


def job_shape(runs: int, jobs: int | None, threads: int | None) -> tuple[int, int]:
    """(parallel jobs, threads each) with jobs x threads <= cores (one thread each by default:
    two 1-thread runs at once beat two 2-thread runs one after the other)."""
    n = cores()
    if threads is None:
        threads = max(1, n // jobs) if jobs else 1
    if jobs is None:
        jobs = max(1, min(runs, n // threads))
    if threads > 1 and jobs * threads > n:
        raise MinitfmError(f"--jobs ({jobs}) x --threads ({threads}) exceeds the {n} cores: "
                           f"OpenMP threads that share cores spin and slow every job down; "
                           f"lower one of them")
    return jobs, threads


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

    def jobs(self) -> list[Job]:
        return [plan_job(self.grid, spec, self.ranges, self.threads, self.samples)
                for spec in self.runs]


def prepare(config: str | None, items: list[str], *, seeds: str | None = None,
            name: str | None = None, out: Path | None = None, jobs: int | None = None,
            threads: int | None = None, eval_lengths: list[str] = (), samples: int = 1000,
            skip_invalid: bool = False) -> Plan:
    """Parse and validate the whole grid before anything is written."""
    swept, fixed = parse_grid(items, seeds)
    grid = Grid(config, swept, fixed)
    ranges = [parse_lengths(text) for text in eval_lengths]
    name = name or (Path(config).stem if config else "default")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise MinitfmError(f"--name ({name!r}) may hold only letters, digits, '_', '-', '.'")
    parallel, per_job = job_shape(math.prod(len(v) for _, v in swept), jobs, threads)
    folder = sweep_folder(grid, name, out)
    runs, skipped = plan_runs(grid, folder, per_job, skip_invalid)
    return Plan(grid, runs, skipped, folder, parallel, per_job, ranges, samples)


def dry_run_lines(plan: Plan) -> list[str]:
    """One line of shell per run that still has work: its commands joined by &&."""
    return [" && ".join(step.shell() for step in job.steps) for job in plan.jobs() if job.steps]


def run_sweep(plan: Plan, say: Callable[[str], None]) -> SweepResult:
    """Run what is left of the grid, then write and return the results (failed runs too)."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    spec = json.dumps({"grid": plan.grid.spec()}, indent=1) + "\n"
    write_atomic(plan.folder / SWEEP_FILE, spec.encode("utf-8"))
    jobs = plan.jobs()
    done = sum(1 for job in jobs if not job.steps)
    say(f"sweep folder: {plan.folder}")
    for reason in plan.skipped:
        say(f"skipped (invalid) {reason}")
    say(f"{len(jobs)} runs ({done} already done), {min(plan.parallel, len(jobs))} at a time, "
        f"{plan.threads} thread{'s' if plan.threads > 1 else ''} each")
    failed = Scheduler(jobs, plan.parallel, say).run()
    keys = [key for key, _ in plan.grid.swept]
    rows = [result_row(spec, plan.ranges) for spec in plan.runs]
    write_results(plan.folder, rows, keys)
    return SweepResult(plan.folder, rows, keys, [job.spec.id for job in failed])


def parse_lengths(text: str) -> tuple[int, int]:
    """`17..32` -> (17, 32)."""
    found = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", text)
    if not found or int(found.group(1)) < 1 or int(found.group(1)) > int(found.group(2)):
        raise MinitfmError(f"--eval-lengths ({text!r}) must look like A..B with 1 <= A <= B, "
                           f"e.g. 17..32")
    return int(found.group(1)), int(found.group(2))
