"""`minitfm sweep`: a grid of runs as parallel processes, each evaluated, in one table and plot.

The grid uses Hydra's multirun syntax: `model.positional=rope,alibi seed=0,1` is four runs; a
key with one value is a fixed override of every run. Every run is a normal run directory in one
sweep folder `runs/sweep-<name>-<YYYYmmdd-HHMMSS>/` (its `sweep.json` holds the grid and the
resolved base config, so the same command finds the folder again and resumes: finished runs are
skipped, interrupted ones continue; an edited base config gets a new folder). One sweep at a
time holds a folder (`.lock`). A job is a chain of real commands (`minitfm train`, then
`minitfm eval --json` per length range), which `--dry-run` prints for any other scheduler.
Each job's threads are fixed so that jobs x threads never exceed the cores (see
minitfm.run.threads). No torch here.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from minitfm.catalog import TASKS, Shortfall, position_shortfall
from minitfm.config import (
    EVAL_BATCH_SIZE,
    Config,
    flatten,
    load_config,
    parse_override,
    split_key_value,
)
from minitfm.errors import ConfigError, Interrupted, MinitfmError, quote
from minitfm.lab.options import MAX_LEN as MAX_EVAL_LEN  # `minitfm eval --max-len`'s bound
from minitfm.lab.plots import save_png
from minitfm.lab.runs import SWEEP_FILE, short_label, short_names
from minitfm.run.files import make_dirs, write_atomic
from minitfm.run.limits import check_fits, decoding_parts, training_parts
from minitfm.run.rundir import (
    DONE,
    is_run_dir,
    lock_exclusively,
    new_run_dir,
    read_summary,
    run_status,
)
from minitfm.run.signals import CaughtSignals
from minitfm.run.threads import cores

MINITFM = [sys.executable, "-m", "minitfm"]
MAX_RUNS = 10_000  # a grid larger than this is a typo, not an experiment on one machine
NAME_MAX = 255  # bytes of one file name (Linux and macOS file systems)
PROCESS_BYTES = 300_000_000  # one job's process with torch loaded (~280 MB measured, tiny run)
STAMP = "-YYYYmmdd-HHMMSS"  # the end of a default sweep folder's name


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
    run_dir: Path = Path()  # set once the sweep folder is chosen

    @property
    def label(self) -> str:
        """The configuration this run belongs to: its choice without the seed."""
        return ", ".join(f"{k}={v}" for k, v in self.choice.items() if k != "seed") or "all"


def parse_grid(items: list[str], seeds: str | None) -> tuple[list, list[str]]:
    """`KEY=V1,V2` items (and `--seeds`) -> (swept keys with their values, fixed overrides)."""
    swept, fixed = [], []
    for item in [*items, *([f"seed={seeds}"] if seeds is not None else [])]:
        split = split_key_value(item)
        if split is None:
            raise ConfigError(f"grid item '{item}' must look like KEY=V1,V2,..., e.g. "
                              f"model.positional=rope,alibi")
        key, text = split
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
    check_size(swept)
    for key, values in swept:
        check_distinct(key, values)
    return swept, fixed


def check_size(swept: list[tuple[str, list[str]]]) -> None:
    """Refuse a grid of more than MAX_RUNS runs, counted before any of them is made."""
    total = math.prod(len(values) for _, values in swept)
    if total > MAX_RUNS:
        factors = " x ".join(f"{len(values):,} {key}" for key, values in swept)
        raise ConfigError(f"the grid has {total:,} runs ({factors}): at most {MAX_RUNS:,}; "
                          f"sweep fewer values, or split it into several sweeps")


def check_distinct(key: str, values: list[str]) -> None:
    """Refuse a value given twice in one axis (`seed=0,0`, `seed=0,00`): two runs, one config."""
    seen: dict[str, str] = {}
    for text in values:
        try:  # compared as parsed (`00` is 0); a value that does not parse fails later, per run
            same = json.dumps(parse_override(f"{key}={text}")[1])
        except ConfigError:
            same = text
        if same in seen:
            both = f" ({quote(seen[same])} and {quote(text)})" if seen[same] != text else ""
            raise ConfigError(f"grid key '{key}' gives the value {quote(text)} twice{both}: "
                              f"give each value once")
        seen[same] = text


def run_id(choice: dict[str, str]) -> str:
    """A file-name-safe id such as `positional=rope,random_positions=64,seed=0`."""
    names = short_names(list(choice))
    text = ",".join(f"{names[k]}={v}" for k, v in choice.items()) or "run"
    # Escaped, not replaced (`d/a.tsv` -> `d%2Fa.tsv`, `%` itself too): two values never
    # share a folder, as `d/a.tsv` and `d_a.tsv` did when both became `d_a.tsv`.
    return re.sub(r"[^A-Za-z0-9_.,=+-]", escape, text)


def escape(found: re.Match) -> str:
    """One character as `%XX` per byte of its UTF-8 form."""
    return "".join(f"%{byte:02X}" for byte in found.group().encode("utf-8"))


def plan_runs(grid: Grid, threads: int,
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
            check_trained_positions(cfg)
            check_fits(training_parts(cfg), "training")  # a MinitfmError: never skipped
        except ConfigError as err:
            if not skip_invalid or not choice:
                where = f" (in the run {run_id(choice)})" if choice else ""
                raise ConfigError(f"{err}{where}") from None
            skipped.append(f"{run_id(choice)}: {err}")
            continue
        runs.append(RunSpec(run_id(choice), choice, overrides, cfg))
    if not runs:
        raise ConfigError(f"no valid run in the grid: {skipped[0]}")
    check_distinct_runs(runs)
    return runs, skipped


def check_trained_positions(cfg: Config) -> None:
    """What training refuses as it starts: learned positions too few for task.max_len."""
    short = stated_shortfall(cfg, cfg.task.max_len)
    if short is not None:
        raise ConfigError(f"model.max_len ({cfg.model.max_len}) is too small for task.max_len "
                          f"({cfg.task.max_len}): sequences need {short.needed} positions; "
                          f"raise model.max_len")


def stated_shortfall(cfg: Config, hi: int) -> Shortfall | None:
    """`catalog.position_shortfall` for inputs of up to `hi` symbols, as the config states them
    (pairs: the sources; their targets are known only from the files); randomized positions are
    checked as a run starts."""
    return position_shortfall(cfg.model, TASKS[cfg.task.name].positions_for_inputs(hi))


def check_distinct_runs(runs: list[RunSpec]) -> None:
    """Refuse two runs with one config (`lr=1,1.0`, `./d.tsv,d.tsv`) and ids too long."""
    seen: dict[str, str] = {}
    for spec in runs:
        if len(f"{spec.id}.log".encode()) > NAME_MAX:
            key = max(spec.choice, key=lambda k: len(spec.choice[k]))
            raise ConfigError(f"the run {quote(spec.id)} needs a file name of "
                              f"{len(spec.id.encode()) + 4} bytes, more than {NAME_MAX}: give "
                              f"{key} shorter values (a shorter file name, say)")
        same = json.dumps(spec.cfg.model_dump(mode="json"), sort_keys=True)
        if same in seen:
            raise ConfigError(f"the runs {quote(seen[same])} and {quote(spec.id)} have the same "
                              f"config: give each value once")
        seen[same] = spec.id


def sweep_folder(grid: Grid, name: str, out: Path | None, base: dict[str, Any],
                 runs: list[RunSpec]) -> tuple[Path, str | None]:
    """`out` (checked), else the newest `<log.dir>/sweep-<name>-*` holding this grid from this
    base config, else a new one; with a note when only the base config differs from an old one."""
    if out is not None:
        check_folder(out, grid, base, runs)
        return out, None
    cfg = load_config(grid.config, grid.fixed)
    check_fits(training_parts(cfg), "training")  # the grid's fixed part alone must fit
    root = Path(cfg.log.dir)
    same = [p for p in sorted(root.glob(f"sweep-{name}-*"))
            if (read_record(p) or {}).get("grid") == grid.spec()]
    resumable = [p for p in same if base_change(read_record(p), base) is None]
    if resumable:
        return resumable[-1], None
    folder = new_run_dir(root, f"sweep-{name}")
    if not same:
        return folder, None
    # An edited config is another experiment: its runs go beside the old ones, never among them.
    return folder, (f"the base config changed since {same[-1]} "
                    f"({base_change(read_record(same[-1]), base)}): a new sweep folder")


def sweep_name(name: str | None, config: str | None) -> str:
    """`--name` as given (checked), else the config's file name with other characters as `_`."""
    limit = NAME_MAX - len(f"sweep-{STAMP}-99")  # the folder's name must fit a file name
    if name is None:
        derived = Path(config).stem if config else "default"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", derived)[:limit]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise MinitfmError(f"--name ({quote(name)}) may hold only letters, digits, '_', '-', '.'")
    if len(name) > limit:
        raise MinitfmError(f"--name has {len(name)} characters, at most {limit}: the folder "
                           f"sweep-<name>{STAMP} must fit a file name")
    return name


def check_out(out: Path) -> None:
    """`--out` is a folder (or none yet) with a file name that fits, never in a run."""
    shown = quote(str(out))
    existing = next(p for p in [out, *out.parents] if p.exists() or p.is_symlink())
    if not existing.is_dir():
        raise MinitfmError(f"--out {shown}: {quote(str(existing))} is not a folder: give a "
                           f"new or empty folder")
    if any(len(part.encode()) > NAME_MAX for part in out.parts):
        raise MinitfmError(f"--out {shown} has a name longer than {NAME_MAX} bytes: give a "
                           f"shorter one")
    inside = next((p for p in [out.resolve(), *out.resolve().parents] if is_run_dir(p)), None)
    if inside is not None:
        raise MinitfmError(f"--out {shown} is a run directory or inside one "
                           f"({quote(str(inside))}): a sweep folder holds runs; give a folder "
                           f"outside any run")


def check_folder(folder: Path, grid: Grid, base: dict[str, Any], runs: list[RunSpec]) -> None:
    """What a sweep folder may hold: its sweep.json with this grid and base config, else
    nothing but this sweep's runs (as the commands of its `--dry-run` make them)."""
    record = read_record(folder)
    if record is None:
        ours = {".lock", *(spec.id for spec in runs), *(f"{spec.id}.log" for spec in runs)}
        stray = next((p.name for p in folder.iterdir() if p.name not in ours), None) \
            if folder.is_dir() else None
        if stray is not None:
            raise MinitfmError(f"--out {quote(str(folder))} holds {quote(stray)}, which is no "
                               f"part of this sweep (and no {SWEEP_FILE} written by minitfm): "
                               f"give a new or empty folder, or this sweep's own")
        return
    if record["grid"] != grid.spec():
        raise MinitfmError(f"--out {quote(str(folder))} holds another sweep (its grid is in "
                           f"{folder / SWEEP_FILE}): pick another folder")
    change = base_change(record, base)
    if change is not None:
        raise MinitfmError(f"--out {quote(str(folder))} holds this grid trained from another "
                           f"base config ({change}): give a new --out to train it anew, or "
                           f"restore the config to resume")


def read_record(folder: Path) -> dict[str, Any] | None:
    """A sweep folder's `sweep.json` ({"grid": ..., "base": ...}), None if none is readable."""
    try:
        record = json.loads((folder / SWEEP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "grid" in record else None


def base_config(runs: list[RunSpec], grid: Grid) -> dict[str, Any]:
    """What the runs share: the first run's resolved config without its swept keys (and
    threads, which the sweep sets per job), flat, as stored in `sweep.json`."""
    flat = flatten(runs[0].cfg.model_dump(mode="json"))
    for key in ["threads", *(key for key, _ in grid.swept)]:
        flat.pop(key, None)
    return json.loads(json.dumps(flat))  # as read back from the file (lists, not tuples)


def base_change(record: dict[str, Any] | None, base: dict[str, Any]) -> str | None:
    """None when `record` was made from `base`, else the first key that differs, both values."""
    stored = (record or {}).get("base")
    if stored is None:  # a folder from before sweep.json held it: nothing to compare
        return None
    if not isinstance(stored, dict):
        return f"{SWEEP_FILE} holds no readable base config"
    for key in [*base, *(key for key in stored if key not in base)]:
        if stored.get(key) != base.get(key):
            return f"{key} was {quote(stored.get(key))}, now {quote(base.get(key))}"
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
    tmp: Path | None = None  # where the running command writes `out` (a name of its own)

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


def open_result(step: Step) -> contextlib.AbstractContextManager:
    """A new temp file beside `step.out` for the command's stdout (None when it has no `out`).

    Its own name (mkstemp), never a fixed one: two processes can never write the same file.
    """
    if step.out is None:
        return contextlib.nullcontext()
    fd, tmp = tempfile.mkstemp(prefix=f".{step.out.name}.", suffix=".tmp", dir=step.out.parent)
    step.tmp = Path(tmp)
    return os.fdopen(fd, "w")


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
        self.stopped: list[Job] = []  # the jobs running when the first signal came

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
            raise Interrupted(stop_message(signals.received[0], self.stopped),
                              128 + signals.received[0])
        return self.failed

    def start(self, job: Job) -> None:
        """Start the job's next command, its output going to its log or result file."""
        step = job.steps[0]
        job.spec.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(job.log, "a") as log, open_result(step) as result:
            proc = subprocess.Popen(step.argv, stdout=result or log, stderr=log,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.running[proc] = job

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
        step = job.steps.pop(0)
        if step.tmp is not None:  # an evaluation's JSON, kept only when it succeeded
            if code == 0:
                write_atomic(step.out, step.tmp.read_bytes())
            step.tmp.unlink(missing_ok=True)
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


def stop_message(signum: int, stopped: list[Job]) -> str:
    """What a signal left behind, in words that fit: which stopped jobs have a checkpoint."""
    saved = sum((job.spec.run_dir / "checkpoints" / "last.pt").is_file() for job in stopped)
    if not stopped:
        what = "no job was running"
    elif saved == len(stopped):
        what = f"stopped {len(stopped)} running job(s), each with its checkpoints/last.pt"
    elif saved == 0:  # stopped before a first checkpoint: these runs start again
        what = f"stopped {len(stopped)} running job(s) before any saved a checkpoint"
    else:
        what = (f"stopped {len(stopped)} running jobs, {saved} with checkpoints/last.pt (the "
                f"others had saved none yet)")
    again = "start them again" if stopped and saved == 0 else "resume"
    return f"{signal.Signals(signum).name}: {what}; run the same command again to {again}"


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
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(columns)
    for row in rows:
        values = [row["run"], *(row[k] for k in keys), row["status"], row["steps"],
                  row["wall_s"], *(row["exact_match"].get(s) for s in spans)]
        writer.writerow(["null" if v is None else v for v in values])
    write_atomic(folder / "results.csv", table.getvalue().encode("utf-8"))
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
    """results.png: `results_figure`, written by the picture rule (`plots.save_png`). The sweep
    folder is minitfm's, so its results.png is replaced as the sweep goes (one an older minitfm
    wrote has no mark): as with --force."""
    save_png(results_figure(rows), path, "--out", force=True)


def results_figure(rows: list[dict[str, Any]]):
    """What differs between the runs: held-out exact match over training steps, a line per run
    coloured by configuration (its seeds in one colour); beside it, when lengths outside the
    trained ones were evaluated (`--eval-lengths`), exact match per input length (mean over
    seeds). Colours and dashes from `plots.line_style`."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    from minitfm.lab.palette import line_style

    groups = by_configuration(rows)
    beyond = rows and any(not lo <= int(n) <= hi for row in rows for n in row["per_length"]
                          for lo, hi in [row["trained_lengths"]])
    fig = Figure(figsize=((8 if len(groups) <= 6 else 11) + 5 * bool(beyond), 4.5), dpi=120,
                 layout="constrained")
    axes = fig.subplots(1, 2 if beyond else 1, squeeze=False)[0]
    for i, (label, group) in enumerate(groups.items()):
        for n, row in enumerate(group):
            steps, exact = eval_curve(Path(row["run_dir"]))
            axes[0].plot(steps, exact, **line_style(i), label=None if n else short_label(label))
    axes[0].set(xlabel="step", ylabel="exact match (held-out, greedy decoding)",
                ylim=(-0.02, 1.02), title="exact match over training (one line per run)")
    if beyond:
        plot_lengths(axes[1], rows, groups)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    # beside the axes, not on them: with many configurations a legend inside hides the lines
    axes[-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def eval_curve(run_dir: Path) -> tuple[list[int], list[float]]:
    """A run's held-out exact match at each evaluation, from its metrics.jsonl (the last record
    of a step counts, as in `plots.run_curves`)."""
    from minitfm.lab.runs import scan_metrics

    by_step = {r["step"]: r["exact_match"] for r in scan_metrics(run_dir)[0]
               if r.get("split") == "eval" and isinstance(r.get("exact_match"), (int, float))}
    steps = sorted(by_step)
    return steps, [by_step[step] for step in steps]


def plot_lengths(ax, rows: list[dict[str, Any]], groups: dict[str, list]) -> None:
    """Exact match per input length, a line per configuration (mean over seeds), the trained
    lengths shaded."""
    from minitfm.lab.palette import line_style

    for i, (label, group) in enumerate(groups.items()):
        lengths = sorted({int(n) for row in group for n in row["per_length"]})
        means = [mean(row["per_length"][n] for row in group if n in row["per_length"])
                 for n in lengths]
        ax.plot(lengths, means, **line_style(i), label=short_label(label))
    lo, hi = rows[0]["trained_lengths"]
    ax.axvspan(lo - 0.5, hi + 0.5, color="0.93", zorder=0, label=f"trained lengths {lo}..{hi}")
    ax.set(xlabel="input length", ylabel="exact match (mean over seeds)", ylim=(-0.02, 1.02),
           title="exact match per input length (held-out)")


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
                                   f"the run {quote(spec.id)} learns {spec.cfg.model.max_len} "
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

    def record(self) -> dict[str, Any]:
        """What `sweep.json` holds: the grid and the base config."""
        return {"grid": self.grid.spec(), "base": self.base}

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
    name = sweep_name(name, config)
    if out is not None:
        check_out(out)
    parallel, per_job = job_shape(math.prod(len(v) for _, v in swept), jobs, threads)
    runs, skipped = plan_runs(grid, per_job, skip_invalid)
    check_memory(runs, parallel)
    check_evaluations(runs, ranges, samples)
    base = base_config(runs, grid)
    folder, note = sweep_folder(grid, name, out, base, runs)
    for spec in runs:
        spec.run_dir = folder / spec.id
    return Plan(grid, runs, skipped, folder, parallel, per_job, ranges, samples, base, note)


def dry_run_lines(plan: Plan) -> list[str]:
    """One line of shell per run that still has work: its commands joined by &&."""
    return [" && ".join(step.shell() for step in job.steps) for job in plan.jobs() if job.steps]


def run_sweep(plan: Plan, say: Callable[[str], None]) -> SweepResult:
    """Run what is left of the grid, then write and return the results (failed runs too)."""
    with SweepLock(plan.folder):
        check_folder(plan.folder, plan.grid, plan.base, plan.runs)  # no sweep came between
        record = json.dumps(plan.record(), indent=1) + "\n"
        write_atomic(plan.folder / SWEEP_FILE, record.encode("utf-8"))
        for spec in plan.runs:  # left by a sweep killed midway; under the lock, none is live
            for stale in spec.run_dir.glob(".eval-*.tmp"):
                stale.unlink()
        jobs = plan.jobs()
        say(f"sweep folder: {plan.folder}")
        if plan.note:
            say(f"note: {plan.note}")
        for reason in plan.skipped:
            say(f"skipped (invalid) {reason}")
        done = sum(1 for job in jobs if not job.steps)
        say(f"{len(jobs)} runs ({done} already done), {min(plan.parallel, len(jobs))} at a "
            f"time, {plan.threads} thread{'s' if plan.threads > 1 else ''} each")
        failed = Scheduler(jobs, plan.parallel, say).run()
        keys = [key for key, _ in plan.grid.swept]
        rows = [result_row(spec, plan.ranges) for spec in plan.runs]
        write_results(plan.folder, rows, keys)
    return SweepResult(plan.folder, rows, keys, [job.spec.id for job in failed])


class SweepLock:
    """An exclusive lock on a sweep folder while one sweep runs in it.

    As `run.rundir.RunLock` for a run: `flock`, which the kernel drops when the process dies,
    so a killed sweep never blocks the next one; a second sweep in the folder is refused.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.file = None

    def __enter__(self) -> SweepLock:
        try:
            make_dirs(self.folder)
            self.file = open(self.folder / ".lock", "a+")
        except OSError as err:
            raise MinitfmError(f"cannot create the sweep folder {quote(str(self.folder))} "
                               f"({err.strerror}): check --out or log.dir") from None
        lock_exclusively(self.file, lambda pid: MinitfmError(
            f"sweep folder {quote(str(self.folder))} is in use by another sweep (pid {pid}): "
            f"wait for it to end, or give another --out"))
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()  # closing the file drops the lock


def parse_lengths(text: str) -> tuple[int, int]:
    """`17..32` -> (17, 32)."""
    found = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", text)
    # A digit string longer than 9 is beyond any bound (and int() of a huge one is slow).
    lo, hi = (int(n) if len(n) <= 9 else math.inf for n in found.groups()) if found else (0, 0)
    if not found or lo < 1 or lo > hi:
        raise MinitfmError(f"--eval-lengths ({quote(text)}) must look like A..B with "
                           f"1 <= A <= B, e.g. 17..32")
    if hi > MAX_EVAL_LEN:
        raise MinitfmError(f"--eval-lengths ({quote(text)}) may reach at most {MAX_EVAL_LEN:,} "
                           f"(as eval --max-len): give a smaller B")
    return lo, hi
