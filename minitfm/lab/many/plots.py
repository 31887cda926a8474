"""`minitfm plot`: training curves without TensorBoard, loss and exact match against step, or
any number of the runs' records (`--metric`), or a grokking run's three phases (`--phases`).

Each run's curves come from its `metrics.jsonl` (`lab/curves.py`); several runs are overlaid and
labelled by the config keys whose values differ between them; a curve of a few points (the
evaluations of a short run) is drawn as points, not joined by lines (`pictures.points_or_line`).
The PNG is written by the picture rule (`lab/pictures.py`). matplotlib is imported inside
functions, and nothing here needs torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from minitfm.config import flatten
from minitfm.errors import CheckpointError, MinitfmError, quote
from minitfm.lab.curves import NUMBERS, is_number, run_curves
from minitfm.lab.many.runs import HIDDEN_KEYS, short_label
from minitfm.lab.pictures import (
    check_output,
    line_style,
    points_or_line,
    save_png,
    wrap_to_width,
)
from minitfm.lab.watch.phases import PHASES_NAME, draw_phases
from minitfm.run.summary import read_run_config
from minitfm.run.which_run import run_directory
from minitfm.schema import did_you_mean

PLOT_NAME = "plot.png"


def plot_runs(runs: list[Path], out: Path | None = None, force: bool = False,
              notes: list[str] | None = None, metrics: list[str] | None = None) -> Path:
    """Loss and exact match against step of `runs` (default: the latest run), or a panel per
    metric of `metrics` (`metric_panels`), as one PNG; `notes` gets a line per run whose
    metrics.jsonl has lines that were skipped, or that has no value of a metric asked for."""
    run_dirs = [run_directory(run) for run in runs] or [run_directory(None, notes=notes)]
    out = out if out is not None else default_plot_path(run_dirs)
    check_output(out, "--out", force)  # before any drawing
    curves = [run_curves(run_dir, notes) for run_dir in run_dirs]
    labels = run_labels(run_dirs)
    if not metrics:
        figure = curves_figure(curves, labels)
    else:
        panels = metric_panels(curves, metrics)
        for run_dir, curve in zip(run_dirs, curves, strict=True):
            missing = [f"{split}/{key}" for split, key in panels if not points(curve, split, key)]
            if missing and notes is not None:
                notes.append(f"run '{run_dir}' has no {', '.join(missing)}: not drawn")
        figure = metrics_figure(curves, panels, labels)
    save_png(figure, out, "--out", force)
    return out


def plot_phases(run: Path | None, out: Path | None = None, force: bool = False,
                notes: list[str] | None = None) -> tuple[Path, dict]:
    """Grokking's three phases of one modadd run (default: the latest run), as a PNG beside it
    (`phases.draw_phases`): its path, and the steps that end the phases with the gauges there."""
    run_dir = run_directory(run, notes=notes)
    out = out if out is not None else run_dir / PHASES_NAME
    return out, draw_phases(run_dir, out, force)


def default_plot_path(run_dirs: list[Path]) -> Path:
    """plot.png in the run directory; for several runs, in the folder holding the first (`runs/`
    for runs under ./runs, git-ignored), so that a comparison never litters a checkout."""
    return run_dirs[0] / PLOT_NAME if len(run_dirs) == 1 else run_dirs[0].parent / PLOT_NAME


def run_labels(run_dirs: list[Path]) -> list[str]:
    """`key=value, ...` of the config keys that differ between the runs (the run's name when
    none do, or when two runs share a label)."""
    if len(run_dirs) == 1:  # nothing to tell apart: no config needed
        return [run_dirs[0].name]
    configs = [flatten(read_config(run_dir)) for run_dir in run_dirs]
    keys = [key for key in dict.fromkeys(k for config in configs for k in config)
            if key not in HIDDEN_KEYS and len({repr(c.get(key)) for c in configs}) > 1]
    labels = [short_label(", ".join(f"{k}={c.get(k, 'null')}" for k in keys)) if keys
              else run_dir.name for c, run_dir in zip(configs, run_dirs, strict=True)]
    if len(set(labels)) < len(labels):
        labels = [run_dir.name if not keys else f"{label} ({run_dir.name})"
                  for label, run_dir in zip(labels, run_dirs, strict=True)]
    return labels


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.yaml as plain data ({} when it has none); a damaged one (see
    `summary.read_run_config`) is a CheckpointError naming the run."""
    try:
        return read_run_config(run_dir) or {}
    except CheckpointError as err:
        raise CheckpointError(f"run '{run_dir}': {err}: restore its config.yaml, or plot the "
                              f"run alone (its label needs no config)") from None


def curves_figure(curves: list[dict], labels: list[str]):
    """Two panels: loss (training solid, held-out dashed, log scale) and held-out exact match;
    held-out evaluations as points where a run has few (`pictures.points_or_line`)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    fig = Figure(figsize=(11, 4.5), dpi=100, layout="constrained")
    loss_ax, exact_ax = fig.subplots(1, 2)
    for i, (curve, label) in enumerate(zip(curves, labels, strict=True)):
        style, train, held_out = line_style(i), curve["train"], curve["eval"]
        colour = style["color"]
        loss_ax.plot([r["step"] for r in train], [r["loss"] for r in train], color=colour)
        dashed = {**style, "linestyle": "--"}  # held-out: dashed, or points where few
        loss_ax.plot([r["step"] for r in held_out], [r["loss"] for r in held_out],
                     **points_or_line(dashed, len(held_out)))
        exact_ax.plot([r["step"] for r in held_out], [r["exact_match"] for r in held_out],
                      **points_or_line(style, len(held_out)), label=label)
    loss_ax.set(xlabel="step", ylabel="loss per target token", yscale="log",
                title="loss (solid: training, dashed or points: held-out)")
    exact_ax.set(xlabel="step", ylabel="exact match", ylim=(-0.02, 1.02),
                 title="exact match (greedy decoding, held-out)")
    exact_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    for ax in (loss_ax, exact_ax):
        ax.grid(alpha=0.3)
    # beside the axes, not on them (as the sweep's plot): many runs would hide the curves
    exact_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


LEGEND_WIDTH = 2.5  # inches of a legend label, wrapped past it
LOG_SPAN = 10  # a loss whose values span more than this factor is drawn on a log scale
ACCURACIES = ("exact_match", "exact", "token_accuracy", "train_exact")  # drawn as percentages


def metric_keys(curves: list[dict]) -> dict[str, list[str]]:
    """Split -> the keys of its records that hold a number in some run, in the order met."""
    found: dict[str, dict[str, None]] = {split: {} for split in NUMBERS}
    for curve in curves:
        for split, records in curve.items():
            for record in records:
                found[split].update((key, None) for key, value in record.items()
                                    if key != "step" and is_number(value))
    return {split: list(keys) for split, keys in found.items() if keys}


def metric_panels(curves: list[dict], metrics: list[str]) -> list[tuple[str, str]]:
    """(split, key) of each panel: a metric is a record key (a panel for each split that holds
    it: `loss` is three) or `split/key` (one: `gauges/loss`); one that no run holds is a
    MinitfmError listing those they do."""
    have = metric_keys(curves)
    panels: list[tuple[str, str]] = []
    for metric in metrics:
        split, _, key = metric.rpartition("/")
        found = [(s, key) for s, keys in have.items() if split in ("", s) and key in keys]
        if not found:
            listed = "; ".join(f"{s}: {', '.join(keys)}" for s, keys in have.items())
            whose = ("the run's metrics.jsonl has no such number" if len(curves) == 1 else
                     "no run's metrics.jsonl has such a number")
            raise MinitfmError(f"--metric {quote(metric)}: {whose}"
                               f"{hint(metric, key, have)}; the numbers there: {listed} "
                               f"(give KEY, or SPLIT/KEY for one split)")
        panels += [panel for panel in found if panel not in panels]
    return panels


def hint(metric: str, key: str, have: dict[str, list[str]]) -> str:
    """` (did you mean 'eval/exact_match'?)`: the key in the splits that have it (asked in
    another), else the closest key (`schema.did_you_mean`)."""
    elsewhere = [f"{split}/{key}" for split, keys in have.items() if key in keys]
    if elsewhere:
        return f" (did you mean {' or '.join(map(repr, elsewhere))}?)"
    names = [*dict.fromkeys(k for keys in have.values() for k in keys),
             *(f"{split}/{k}" for split, keys in have.items() for k in keys)]
    return did_you_mean(metric, names)


def points(curve: dict, split: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a run's `split` records that hold a number at `key`."""
    return [(r["step"], r[key]) for r in curve[split] if is_number(r.get(key))]


def metrics_figure(curves: list[dict], panels: list[tuple[str, str]], labels: list[str]):
    """A panel per (split, key) of `panels`, two to a row over the same steps, a curve per run
    (points where it has few: `pictures.points_or_line`); a loss that falls tenfold on a log
    scale, accuracies as percentages."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    columns = min(len(panels), 2)
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(2.5 + 5 * columns, 0.5 + 4 * rows), dpi=100, layout="constrained")
    axes = list(fig.subplots(rows, columns, squeeze=False, sharex=True).flat)  # steps alike
    handles: dict[str, Any] = {}
    for ax, (split, key) in zip(axes, panels):
        for i, (curve, label) in enumerate(zip(curves, labels, strict=True)):
            found = points(curve, split, key)
            if found:
                steps, values = zip(*found)
                (handles[label],) = ax.plot(steps, values, label=label,
                                            **points_or_line(line_style(i), len(found)))
        ax.set(xlabel="step", ylabel=key, title=f"{split}/{key}")  # as --metric spells it
        ax.tick_params(labelbottom=True)  # every panel's steps (the one below may be empty)
        drawn = [v for line in ax.get_lines() for v in line.get_ydata() if math.isfinite(v)]
        if key.endswith("loss") and drawn and 0 < LOG_SPAN * min(drawn) < max(drawn):
            ax.set_yscale("log")
        if key in ACCURACIES:
            ax.set_ylim(-0.02, 1.02)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:  # the empty place of an odd count of panels
        ax.set_visible(False)
    # beside the panels, not on them: many runs would hide the curves; a long label (runs that
    # differ in many keys) wrapped, not widening the legend until the panels have no room
    ordered = [handles[label] for label in labels if label in handles]
    fig.legend(ordered, [wrap_to_width(h.get_label(), LEGEND_WIDTH, 8, prefer=())
                         for h in ordered], fontsize="small", loc="outside right upper")
    return fig
