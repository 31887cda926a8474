"""Seeds as an axis: what each configuration's runs say together, with 95% intervals.

A configuration is a sweep's runs that differ only in `seed`. Per configuration: n (the runs
that ended: finished or stopped at target), held-out exact match per evaluated range, steps
and seconds to the target (`train.target_exact_match`), each as a mean with its 95% Student's
t interval and, for steps and seconds, a median; and the success rate (runs that reached the
target) with its Wilson interval. A run that missed the target is never dropped: it counts as
a miss in the rate, and at the step budget (its whole run: `summary.json`'s `step` and
`wall_s`) in the steps and seconds, which are then a lower bound. The maths is `stats.py`'s.

Written to `configurations.jsonl` and `configurations.csv` (a row per configuration: its swept
values and the fixed ones that change the config file's, each interval's ends in columns of
their own) and drawn in `intervals.png`. No torch here.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from statistics import median
from typing import Any

from minitfm.config import flatten
from minitfm.errors import CheckpointError
from minitfm.lab.curves import is_fraction, is_number, read_eval
from minitfm.lab.many.runs import search_status, short_label
from minitfm.lab.many.stats import Interval, mean_interval, rate_interval
from minitfm.lab.pictures import LINE_COLOURS, save_png
from minitfm.run.files import to_json, write_atomic
from minitfm.run.summary import DONE, UNREADABLE, load_summary, read_run_config, run_status

MISSING = "missing"  # a run a sweep's results.jsonl names, whose folder is not there

CAPTION = ("n: runs that ended (of those run). mean ± the half-width of its 95% Student's t "
           "interval over the seeds (a value alone: one run). at target: the runs that reached "
           "train.target_exact_match, with the 95% Wilson interval. Steps and seconds to the "
           "target: a run that missed it counts at the step budget (its whole run), never "
           "dropped; so do the medians. Jobs ran side by side: seconds are not timings.")


def reached(summary: dict[str, Any], target: float | None) -> bool | None:
    """Whether a run that ended reached its target: it stopped there, or the evaluation of its
    last step reached it (it then ends `finished`); None when it has no target."""
    if target is None:
        return None
    best = summary.get("best_exact_match")
    return summary.get("status") == "stopped at target" or (is_number(best) and best >= target)


def run_outcome(run_dir: Path) -> dict[str, Any]:
    """A run directory's figures as `minitfm compare` reads them: seed, status, steps and
    seconds, when it ended and the size of its stack if stacked (`summary.json`), whether it
    reached its target, the budget and target (`config.yaml`), held-out exact match on the
    trained lengths: the sweep's evaluation (`eval-A-B.json`) where there is one, else the
    run's last evaluation (`summary.json`), and which (`evaluation`, of `samples` sequences);
    and its config, flat. A run that cannot be read is
    `unreadable` (`note` says why), a folder that is not there `missing`."""
    row: dict[str, Any] = {"run": run_dir.name, "run_dir": str(run_dir)}
    if not os.path.exists(run_dir):  # a sweep's row whose run is gone (or a dangling link)
        return {**row, "status": MISSING}
    try:
        config, summary = read_run_config(run_dir) or {}, load_summary(run_dir) or {}
    except CheckpointError as err:
        return {**row, "status": UNREADABLE, "note": str(err)}
    train, task = config.get("train") or {}, config.get("task") or {}
    target = train.get("target_exact_match")
    target = target if is_fraction(target) else None
    span = (task.get("min_len"), task.get("max_len"))
    report = read_eval(run_dir / f"eval-{span[0]}-{span[1]}.json") if all(
        isinstance(n, int) for n in span) else None
    exact = report["exact_match"] if report else summary.get("exact_match")
    samples = report.get("samples") if report else train.get("eval_samples")
    evaluation = ("minitfm eval" if report else "the training's last evaluation") + (
        f" of {samples:,} sequences" if type(samples) is int else "")
    status = search_status(run_dir, run_status(run_dir))  # `pruned` by its search too
    seed, stack = config.get("seed"), summary.get("stack")
    return {**row, "seed": seed if is_int(seed) else None,
            "status": status, "steps": summary.get("step"), "wall_s": summary.get("wall_s"),
            "ended": summary.get("ended"), "stack": stack if is_int(stack) else None,
            "reached": reached(summary, target) if status in DONE else None,
            "budget": summary.get("steps", train.get("steps")), "target": target,
            "exact_match": exact if is_fraction(exact) else None, "evaluation": evaluation,
            "samples": samples if is_int(samples) else None, "config": flatten(config)}


def is_int(value: Any) -> bool:
    """An int that is no bool (a seed, a stack's size, a count of samples)."""
    return isinstance(value, int) and not isinstance(value, bool)


def ended(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs that ended (finished or stopped at target): those the figures count."""
    return [row for row in rows if row.get("status") in DONE]


def numbers(rows: list[dict[str, Any]], key: str) -> list[float]:
    """The key's values in the rows that are numbers."""
    return [row[key] for row in rows if is_number(row.get(key))]


def summarise(group: list[dict[str, Any]], spans: list[str]) -> dict[str, Any]:
    """One configuration's runs (rows of results.jsonl) as a row of configurations.jsonl."""
    done = ended(group)
    row: dict[str, Any] = {"configuration": group[0]["configuration"], "runs": len(group),
                           "n": len(done)}
    for span in spans:
        values = [r["exact_match"].get(span) for r in done]
        row.update(flat(f"exact_match {span}", mean_interval([v for v in values
                                                              if v is not None])))
    if any(r.get("target") is not None for r in done):
        hits = sum(r.get("reached") is True for r in done)
        row.update(reached=hits, **flat("success_rate", rate_interval(hits, len(done))))
    for name, key in (("steps", "steps"), ("seconds", "wall_s")):
        values = numbers(done, key)
        row.update(flat(name, mean_interval(values)))
        row[f"{name} median"] = median(values) if values else None
    return row


def flat(name: str, interval: Interval) -> dict[str, float | None]:
    """`name mean`, `name lo`, `name hi`: an interval as columns."""
    return {f"{name} mean": interval.mean, f"{name} lo": interval.lo, f"{name} hi": interval.hi}


def configuration_rows(groups: dict[str, list], keys: list[str],
                       spans: list[str]) -> list[dict[str, Any]]:
    """A row per configuration (`results.by_configuration`'s groups): its number in the sweep's
    table (`#`, what `minitfm compare SWEEP A B` takes: a grid's from 1, a search's trial
    number), its values of `keys` but the seed (the swept keys, then the fixed ones that change
    the config file's), and `summarise`'s figures."""
    return [{"#": group[0].get("trial", i), **{k: group[0].get(k) for k in keys if k != "seed"},
             **summarise(group, spans)} for i, group in enumerate(groups.values(), 1)]


def write_configurations(folder: Path, rows: list[dict[str, Any]]) -> None:
    """configurations.jsonl and configurations.csv: a row per configuration; intervals.png."""
    lines = "".join(to_json(row) + "\n" for row in rows)
    write_atomic(folder / "configurations.jsonl", lines.encode("utf-8"))
    columns = list(dict.fromkeys(key for row in rows for key in row))
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["null" if row.get(c) is None else row[c] for c in columns])
    write_atomic(folder / "configurations.csv", table.getvalue().encode("utf-8"))
    if any(row["n"] >= 2 for row in rows):  # one run a configuration has no interval to draw
        save_png(intervals_figure(rows), folder / "intervals.png", "--out", force=True)


def intervals_figure(rows: list[dict[str, Any]]):
    """intervals.png: a panel per figure, a row per configuration, its mean (a dot) and its 95%
    interval (a bar), as a paper's forest plot; misses count at the step budget."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    spans = [key[len("exact_match "):-len(" mean")] for key in rows[0]
             if key.startswith("exact_match ") and key.endswith(" mean")]
    panels = [(f"exact_match {spans[0]}", f"held-out exact match {spans[0]}")] if spans else []
    to = ""
    if "success_rate mean" in rows[0]:
        panels.append(("success_rate", "at target (Wilson interval)"))
        to = " to target"
    panels += [("steps", f"steps{to}{' (misses at the budget)' if to else ''}"),
               ("seconds", f"seconds{to}")]
    fig = Figure(figsize=(2.2 + 2.6 * len(panels), 1.2 + 0.35 * len(rows)), dpi=120,
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    labels = [f"{row['#']}: {named(row['configuration'])} (n={row['n']})" for row in rows]
    for ax, (name, title) in zip(axes, panels, strict=True):
        for y, row in enumerate(rows):
            centre, lo, hi = (row.get(f"{name} {end}") for end in ("mean", "lo", "hi"))
            if centre is None:
                continue
            bars = [[centre - lo], [hi - centre]] if lo is not None else None
            ax.errorbar([centre], [y], xerr=bars, fmt="o", capsize=3,
                        color=LINE_COLOURS[y % len(LINE_COLOURS)])
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3, axis="x")
        ax.xaxis.set_major_locator(MaxNLocator(4))  # percentages with decimals need the room
        if name.startswith(("exact_match", "success_rate")):
            ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    axes[0].set_yticks(range(len(rows)), labels)
    axes[0].set_ylim(len(rows) - 0.5, -0.5)  # the table's order, top to bottom
    fig.suptitle("mean and 95% interval over seeds (t; Wilson for the rate)", fontsize="medium")
    return fig


def named(configuration: str) -> str:
    """A configuration's short label (`all` when only seeds were swept)."""
    return short_label(configuration) if "=" in configuration else configuration
