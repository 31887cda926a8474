"""What besides A and B themselves may move `minitfm compare`'s figures, in words.

- `settings_note`: the settings the figures depend on (`MEASURED_BY`, any `task.*` key, the
  evaluation) in which the two sides differ, each side's values.
- `timing_note`: how each side's seconds were measured (a run alone, jobs side by side in a
  sweep, stacks of runs: a stacked run's clock covers its whole stack; the threads), when the
  sides differ in that; only what differs is named.
- `ran_first`: when the runs ran. A side whose runs all ran before the other's took its seconds
  under another time's load of the machine: the seconds then measure that too.

A run is a row of `seeds.run_outcome` (its flat `config`, `run_dir`, `wall_s`, `ended`,
`stack`). No torch here.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from minitfm.errors import shown_path
from minitfm.lab.many.runs import SWEEP_FILE

# Besides task.*: what the steps, seconds and success rate count to and how exact match is found.
MEASURED_BY = ("train.target_exact_match", "train.steps", "train.eval_samples")
ENDED_FORMAT = "%Y-%m-%dT%H:%M:%S"  # summary.json's `ended` (run/rundir.py: write_summary)

Runs = list[dict[str, Any]]


def settings_note(runs_a: Runs, runs_b: Runs, exempt: tuple[str, ...] = ()) -> str | None:
    """The settings the figures depend on in which A's and B's runs differ, each side's values;
    None when they agree. `exempt`: keys that name both sides, as two configurations of one
    sweep are named (what the comparison is about): not noted."""
    keys = dict.fromkeys(key for runs in (runs_a, runs_b) for run in runs for key in run["config"]
                         if key.startswith("task.") or key in MEASURED_BY)
    differ = []
    for key in [*keys, "evaluation"]:
        if key in exempt:
            continue
        shown = [side_values(runs, key) for runs in (runs_a, runs_b)]
        if shown[0] != shown[1]:
            differ.append(f"{key} ({shown[0]} vs {shown[1]})")
    if not differ:
        return None
    return (f"A and B differ in settings their figures depend on: {'; '.join(differ)}; a "
            f"difference may come from these, not only from what A and B compare")


def side_values(runs: Runs, key: str) -> str:
    """A side's values of a config key (or its runs' `evaluation`), in order, once each."""
    found = [run.get(key) if key == "evaluation" else run["config"].get(key) for run in runs]
    return ", ".join(dict.fromkeys(str(value) for value in found))


def timing_note(runs_a: Runs, runs_b: Runs) -> str | None:
    """The conditions each side's seconds were measured under, where the sides differ in them
    (how the runs ran, the threads), naming only what differs; None when they agree."""
    found = [[conditions(run) for run in runs] for runs in (runs_a, runs_b)]
    aspects = [i for i in (0, 1)  # how the runs ran, then their threads
               if {c[i][0] for c in found[0]} != {c[i][0] for c in found[1]}]
    if not aspects:
        return None
    shown = [", ".join(dict.fromkeys(", ".join(c[i][1] for i in aspects) for c in side))
             for side in found]
    return (f"seconds to target were measured under different conditions (A: {shown[0]}; "
            f"B: {shown[1]}): their difference is no timing of A against B; compare steps, "
            f"or time runs alone")


def conditions(run: dict[str, Any]) -> tuple[tuple[str, str], tuple[str, str]]:
    """How a run's seconds were measured, each aspect as (kind, words): beside other jobs of a
    sweep, in a stack (whose clock is the whole stack's) or alone; its threads."""
    folder = Path(run["run_dir"]).parent
    stack = run.get("stack")
    in_sweep = f" in the sweep {shown_path(folder)}" if (folder / SWEEP_FILE).is_file() else ""
    if isinstance(stack, int) and stack > 1:
        how = (f"stack of {stack}", f"stacks of {stack} runs{in_sweep} (a run's seconds are "
                                    f"its whole stack's)")
    elif in_sweep:
        how = ("sweep", f"jobs side by side{in_sweep}")
    else:
        how = ("alone", "a run alone")
    threads = f"threads={run['config'].get('threads')}"
    return how, (threads, threads)


def ran_first(runs_a: Runs, runs_b: Runs) -> str | None:
    """"A" when every run of A ran before every run of B (by the middle of its time: from
    `ended` back by `wall_s`), "B" the other way round, None when they ran interleaved or a
    run's times are not known."""
    middles = [[middle(run) for run in runs] for runs in (runs_a, runs_b)]
    if not all(middles) or None in middles[0] + middles[1]:
        return None
    if max(middles[0]) < min(middles[1]):
        return "A"
    if max(middles[1]) < min(middles[0]):
        return "B"
    return None


def middle(run: dict[str, Any]) -> float | None:
    """The middle of the time a run trained, in seconds since the epoch: `ended` (local time,
    to the second) less half its `wall_s` (summed over resumes, so a resumed run's is an
    estimate); None when either is missing."""
    ended, wall = run.get("ended"), run.get("wall_s")
    if not isinstance(ended, str) or not isinstance(wall, (int, float)) or isinstance(wall, bool):
        return None
    try:
        end = datetime.strptime(ended, ENDED_FORMAT).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return end - wall / 2
