"""The forecast checked over finished runs: `python -m minitfm.lab.watch.forecast_check FOLDER...`

Each run's readings (metrics.jsonl, split `gauges`) are replayed through `make_forecast`, as the
run's GaugeReader made them while it trained, and held against what then came. Definitions
(docs/looking-inside.md, "How well it forecasts"):

- the click: the first reading whose exact match passed CLICK; the plateau: the steps before it;
- a run reached its target when an evaluation did (summary.json's best exact match);
- a run that reached it is **flagged in time** when every forecast from one made at or before
  three quarters of its plateau until its click says it is on course (`Forecast.verdict`: the
  target with an eighth of the run to spare); the **lead** is the share of the plateau still
  ahead at the first of those forecasts;
- a **false alarm**: a run that did not reach its target with a forecast, at any reading,
  saying it was on course;
- the click's error: how far a forecast's click step was from the click, for the forecasts made
  from half the plateau on, until the click.

It prints one row per configuration (the runs of a folder whose names differ only in their seed,
as a sweep names them), as a Markdown table. The readings are those a resumed run forecasts from
(`gauge_readings`: one per step, within train.steps; a line of metrics.jsonl that holds no record
minitfm writes, such as an exact match of 7, is left out). A run that cannot be replayed (not
finished, a damaged summary.json or config.yaml) is skipped with a note; a folder without a
finished run is an error, exit 2.
"""

from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from minitfm.config import load_config
from minitfm.errors import CheckpointError, MinitfmError, shown_path
from minitfm.lab.curves import read_metrics
from minitfm.lab.watch.forecast import CLICK, Course, gauge_readings, make_forecast
from minitfm.lab.watch.gauges import GAUGE_SAMPLES
from minitfm.run.files import name_text
from minitfm.run.summary import DONE, load_summary, read_run_config
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set

IN_TIME = 0.25  # flagged in time: at least this share of the plateau ahead of the click
NEAR = 20  # a click forecast this many steps from the click or nearer counts as near


@dataclass
class Tally:
    """The forecasts of one configuration's runs, counted."""

    reached: int = 0  # runs that reached their target
    in_time: int = 0  # of those, flagged in time
    missed: int = 0  # runs that did not reach it
    alarms: int = 0  # of those, flagged at some reading
    leads: list[float] = field(default_factory=list)  # flagged in time: the share ahead
    clicks: list[int] = field(default_factory=list)
    errors: list[int | None] = field(default_factory=list)  # None: no click forecast


def replay(run_dir: Path) -> tuple[list[tuple], list, bool]:
    """A finished run's readings (step, exact, token accuracy), the forecast after each, and
    whether the run reached its target. A run that cannot be replayed (not finished, a damaged
    summary.json or config.yaml, its data gone) is a MinitfmError saying why."""
    summary = load_summary(run_dir) or {"status": "gone (no summary.json)"}
    if summary["status"] not in DONE:
        raise CheckpointError(f"it is {summary['status']}, not finished")
    best = summary.get("best_exact_match")
    if best is None:
        raise CheckpointError("summary.json has no best_exact_match")
    settings = read_run_config(run_dir)
    if settings is None:
        raise CheckpointError("it has no config.yaml")
    cfg = load_config(settings)
    task = make_task(cfg.task)
    pairs = eval_set(task, cfg.train.eval_samples, cfg.task.eval_seed)[:GAUGE_SAMPLES]
    course = Course(cfg.train, [len(target) + 1 for _, target in pairs], task.name)
    readings = gauge_readings(read_metrics(run_dir), cfg.train.steps)
    forecasts = [make_forecast(readings[:i + 1], course) for i in range(len(readings))]
    target = cfg.train.target_exact_match
    return readings, forecasts, target is not None and best >= target


def count(tally: Tally, replayed: tuple[list[tuple], list, bool]) -> None:
    """Add a run's replay (see `replay`) to its configuration's tally."""
    readings, forecasts, reached = replayed
    click = next((step for step, exact, _ in readings if exact >= CLICK), None)
    flags = [(step, f.verdict == "on course") for (step, *_), f in zip(readings, forecasts)
             if f is not None]
    if click is not None:
        tally.clicks.append(click)
        for (step, *_), f in zip(readings, forecasts):
            if f is not None and click / 2 <= step < click:
                tally.errors.append(None if f.click_step is None else abs(f.click_step - click))
    if not reached:
        tally.missed += 1
        tally.alarms += any(flag for _, flag in flags)
        return
    tally.reached += 1
    if click is None:
        return
    since = None  # the first reading of the last streak of flags before the click
    for step, flag in flags:
        if step >= click:
            break
        since = (since if since is not None else step) if flag else None
    if since is not None and since <= (1 - IN_TIME) * click:
        tally.in_time += 1
        tally.leads.append((click - since) / click)


def configuration(run_dir: Path) -> str:
    """The folder and the run's name without its seed: `sweep/steps=150`."""
    name = re.sub(r"(^|,)seed=\d+", "", run_dir.name).strip(",")
    return name_text(f"{run_dir.parent.name}/{name}" if name else run_dir.parent.name)


def table(folders: list[Path], notes: list[str]) -> str:
    """The Markdown table of the finished runs in `folders`, a row per configuration. A run
    that cannot be replayed is skipped, and said in `notes`; a folder with no finished run to
    replay is a MinitfmError."""
    tallies: dict[str, Tally] = {}
    for folder in folders:
        runs = sorted(p.parent for p in folder.glob("*/summary.json"))
        replayed = 0
        for run_dir in runs:
            try:
                run = replay(run_dir)
            except MinitfmError as err:
                notes.append(f"run '{name_text(shown_path(run_dir))}' skipped: {err}")
                continue
            count(tallies.setdefault(configuration(run_dir), Tally()), run)
            replayed += 1
        if not replayed:
            raise MinitfmError(f"no finished runs in '{name_text(shown_path(folder))}' "
                               f"({no_runs(folder, len(runs))}): give folders of finished "
                               f"runs, such as a sweep's")
    rows = ["| runs | reached the target | flagged in time (median lead) | false alarms | "
            "click at step | click forecasts within 20 steps, from half the plateau on |",
            "|---|---|---|---|---|---|"]
    for name, t in tallies.items():
        lead = f" ({statistics.median(t.leads):.0%})" if t.leads else ""
        in_time = f"{t.in_time} of {t.reached}{lead}" if t.reached else "-"
        alarms = f"{t.alarms} of {t.missed}" if t.missed else "-"
        clicks = f"{min(t.clicks)}-{max(t.clicks)}" if t.clicks else "never"
        near = sum(e is not None and e <= NEAR for e in t.errors)
        errors = f"{near / len(t.errors):.0%}" if t.errors else "-"
        rows.append(f"| {name} | {t.reached} of {t.reached + t.missed} | {in_time} | {alarms} "
                    f"| {clicks} | {errors} |")
    return "\n".join(rows)


def no_runs(folder: Path, skipped: int) -> str:
    """Why `folder` gave no run to replay, in words."""
    if not folder.exists():
        return "no such folder"
    if not folder.is_dir():
        return "a file, not a folder"
    if skipped:
        return f"{skipped} skipped: see the notes above"
    return "no run folder in it holds a summary.json, which a run writes when it ends"


def main(argv: list[str]) -> int:
    """Print the table of the finished runs in the folders `argv`, each note and error on a
    line of stderr; the exit code (2: no folder given, or one with no finished run)."""
    if not argv:
        sys.stderr.write("error: give one or more folders of finished runs, such as a "
                         "sweep's: python -m minitfm.lab.watch.forecast_check FOLDER...\n")
        return 2
    notes: list[str] = []
    try:
        rows = table([Path(folder) for folder in argv], notes)
    except MinitfmError as err:
        sys.stderr.writelines(f"note: {note}\n" for note in notes)
        sys.stderr.write(f"error: {err}\n")
        return err.exit_code
    sys.stderr.writelines(f"note: {note}\n" for note in notes)
    sys.stdout.write(rows + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
