"""`minitfm plot`: training curves without TensorBoard, loss and exact match against step.

Each run's curves come from its `metrics.jsonl` (`lab/curves.py`); several runs are overlaid and
labelled by the config keys whose values differ between them. The PNG is written by the picture
rule (`lab/pictures.py`). matplotlib is imported inside functions, and nothing here needs torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minitfm.config import flatten
from minitfm.errors import CheckpointError
from minitfm.lab.curves import run_curves
from minitfm.lab.many.runs import HIDDEN_KEYS, short_label
from minitfm.lab.pictures import check_output, line_style, save_png
from minitfm.run.summary import read_run_config
from minitfm.run.which_run import run_directory

PLOT_NAME = "plot.png"


def plot_runs(runs: list[Path], out: Path | None = None, force: bool = False,
              notes: list[str] | None = None) -> Path:
    """Loss and exact match against step of `runs` (default: the latest run), as one PNG;
    `notes` gets a line per run whose metrics.jsonl has lines that were skipped."""
    run_dirs = [run_directory(run) for run in runs] or [run_directory(None, notes=notes)]
    out = out if out is not None else default_plot_path(run_dirs)
    check_output(out, "--out", force)  # before any drawing
    curves = [run_curves(run_dir, notes) for run_dir in run_dirs]
    save_png(curves_figure(curves, run_labels(run_dirs)), out, "--out", force)
    return out


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
    """Two panels: loss (training solid, held-out dashed, log scale) and held-out exact match."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    fig = Figure(figsize=(11, 4.5), dpi=100, layout="constrained")
    loss_ax, exact_ax = fig.subplots(1, 2)
    for i, (curve, label) in enumerate(zip(curves, labels, strict=True)):
        style, train, held_out = line_style(i), curve["train"], curve["eval"]
        colour = style["color"]
        loss_ax.plot([r["step"] for r in train], [r["loss"] for r in train], color=colour)
        loss_ax.plot([r["step"] for r in held_out], [r["loss"] for r in held_out],
                     color=colour, linestyle="--", marker=style["marker"], markersize=3)
        exact_ax.plot([r["step"] for r in held_out], [r["exact_match"] for r in held_out],
                      **style, label=label)
    loss_ax.set(xlabel="step", ylabel="loss per target token", yscale="log",
                title="loss (solid: training, dashed: held-out)")
    exact_ax.set(xlabel="step", ylabel="exact match", ylim=(-0.02, 1.02),
                 title="exact match (greedy decoding, held-out)")
    exact_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    for ax in (loss_ax, exact_ax):
        ax.grid(alpha=0.3)
    # beside the axes, not on them (as the sweep's plot): many runs would hide the curves
    exact_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
