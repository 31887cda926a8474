"""Pictures without TensorBoard: training curves (`minitfm plot`) and exact match per input
length (`minitfm eval --plot`), and what every minitfm picture shares: titles wrapped to the
figure's width, and one rule for writing a picture file (`check_output`, `write_picture`).

The rule, for every picture (plot, eval --plot, visualize-attention's PNG, its --over-training
strip and GIF, ablate's PNG): its name has the right suffix, its folder can take it (checked
before anything is drawn), and an existing file is replaced only if minitfm wrote it (a PNG's
`Software` text, a GIF's comment, say "minitfm") or the user passes --force. A failed write
names the picture, exits 2 and leaves the old file whole.

Each run's curves come from its `metrics.jsonl`; several runs are overlaid and labelled by the
config keys whose values differ between them. matplotlib is imported inside functions, and
nothing here needs torch.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any

from minitfm.config import flatten
from minitfm.errors import CheckpointError, MinitfmError
from minitfm.lab.palette import LINE_COLOURS, line_style
from minitfm.lab.runs import HIDDEN_KEYS, scan_metrics, short_label, skipped
from minitfm.run.files import write_atomic
from minitfm.run.rundir import find_run_dir, read_run_config, run_directory

SOFTWARE = "minitfm"  # a PNG's `Software` text and a GIF's comment: minitfm wrote it
PREFERRED_BREAKS = (" → ", " (")  # where a title too wide for one line breaks first
PLOT_NAME = "plot.png"
TRAINED, BEYOND = LINE_COLOURS[:2]  # eval --plot: lengths trained on, and beyond


# --- shared by every picture ---

def wrap_to_width(text: str, width: float, size: float) -> str:
    """`text` broken into lines no wider than `width` inches at `size` points, measured with
    the Agg renderer that draws it: a line too wide breaks first before " → " and " (", then
    at spaces (a word too long alone, anywhere)."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    renderer, font = RendererAgg(1, 1, 72), FontProperties(size=size)  # 72 dpi: 1 px = 1 pt

    def fits(line: str) -> bool:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0] <= width * 72

    lines = []
    for line in text.split("\n"):
        if not fits(line):
            for mark in PREFERRED_BREAKS:
                line = line.replace(mark, "\n" + mark.lstrip())
        for part in line.split("\n"):
            lines.extend(wrap_words(part, fits))
    return "\n".join(lines)


def wrap_words(text: str, fits) -> list[str]:
    """Greedy word wrap of one line by a `fits(line)` test."""
    lines, line = [], ""
    for word in text.split(" "):
        candidate = f"{line} {word}" if line else word
        if fits(candidate):
            line = candidate
            continue
        if line:
            lines.append(line)
        while not fits(word) and len(word) > 1:  # a file name wider than the figure
            cut = max([n for n in range(1, len(word)) if fits(word[:n])] or [1])
            lines.append(word[:cut])
            word = word[cut:]
        line = word
    return [*lines, line]


def is_minitfm_picture(path: Path) -> bool:
    """Whether `path` is a PNG or GIF file that minitfm wrote (its `Software` text or its
    comment says so)."""
    from PIL import Image

    if not path.is_file():  # a FIFO would block the read
        return False
    try:
        with Image.open(path) as image:
            mark = {"PNG": image.info.get("Software"), "GIF": image.info.get("comment")}
            return mark.get(image.format) in (SOFTWARE, SOFTWARE.encode())
    except (OSError, ValueError, Image.DecompressionBombError):  # not an image, or not ours
        return False


def check_picture_path(path: Path, option: str, suffix: str = ".png") -> None:
    """`option` names a file with `suffix` (.png, .gif), not a directory, in a folder that
    exists or can be made, and can be written to."""
    if path.suffix.lower() != suffix:
        raise MinitfmError(f"{option} ('{path}') must be a {suffix} file")
    if path.is_dir():
        raise MinitfmError(f"{option} ('{path}') is a directory: give a {suffix} file in it")
    folder = next(folder for folder in path.absolute().parents if folder.exists())
    if not folder.is_dir():
        raise MinitfmError(f"cannot write '{path}' ('{folder}' is a file, not a folder): "
                           f"choose another {option}")
    if not os.access(folder, os.W_OK):  # a read-only file system too, even for root
        raise MinitfmError(f"cannot write '{path}' (its folder '{folder}' is read-only): "
                           f"choose another {option}")


def check_output(path: Path, option: str, force: bool, suffix: str = ".png") -> None:
    """The picture rule (module docstring): `option`'s path may be written, and an existing
    file is minitfm's picture, or `force`."""
    check_picture_path(path, option, suffix)
    if path.exists() and not force and not is_minitfm_picture(path):
        raise MinitfmError(f"{option} ('{path}') exists and is not a picture minitfm wrote: "
                           f"choose another {option}, or pass --force to replace it")


def save_png(fig, path: Path, option: str = "--out", force: bool = False) -> None:
    """Write `fig` as a PNG marked as minitfm's, by the picture rule (`check_output`)."""
    check_output(path, option, force)
    write_picture(path, option,
                  lambda buffer: fig.savefig(buffer, format="png", metadata={"Software": SOFTWARE}))


def write_picture(path: Path, option: str, write) -> None:
    """`write(buffer)` a picture into memory, then onto `path` atomically (see
    `files.write_atomic`). An unwritable path is one line naming the picture and `option`."""
    buffer = io.BytesIO()
    write(buffer)
    try:
        write_atomic(path, buffer.getbuffer())
    except OSError as err:
        raise MinitfmError(f"cannot write '{path}' ({err.strerror or err}): choose another "
                           f"{option}") from None


# --- `minitfm plot` ---

def plot_runs(runs: list[Path], out: Path | None = None, force: bool = False,
              notes: list[str] | None = None) -> Path:
    """Loss and exact match against step of `runs` (default: the latest run), as one PNG;
    `notes` gets a line per run whose metrics.jsonl has lines that were skipped."""
    run_dirs = [run_directory(run) for run in runs] or [run_directory(None)]
    out = out if out is not None else default_plot_path(run_dirs)
    check_output(out, "--out", force)  # before any drawing
    curves = [run_curves(run_dir, notes) for run_dir in run_dirs]
    save_png(curves_figure(curves, run_labels(run_dirs)), out, "--out", force)
    return out


def default_plot_path(run_dirs: list[Path]) -> Path:
    """plot.png in the run directory; for several runs, in the folder holding the first (`runs/`
    for runs under ./runs, git-ignored), so that a comparison never litters a checkout."""
    return run_dirs[0] / PLOT_NAME if len(run_dirs) == 1 else run_dirs[0].parent / PLOT_NAME


def run_curves(run_dir: Path, notes: list[str] | None = None) -> dict[str, list[dict]]:
    """The run's train and eval records, one per step (a resumed run's later record wins);
    lines that hold no record are skipped, and said in `notes`."""
    records, bad = scan_metrics(run_dir)
    if not records and bad:
        raise CheckpointError(f"run '{run_dir}' has no metrics to plot: {skipped(bad)} (an "
                              f"object with step, split and loss per line)")
    if not records:
        raise CheckpointError(f"run '{run_dir}' has no metrics yet (metrics.jsonl is missing "
                              f"or empty): train it first")
    if bad and notes is not None:
        notes.append(f"run '{run_dir}': {skipped(bad)}: skipped")
    curves = {}
    for split in ("train", "eval"):
        by_step = {r["step"]: r for r in records if r["split"] == split}
        curves[split] = [by_step[step] for step in sorted(by_step)]
    return curves


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
    `rundir.read_run_config`) is a CheckpointError naming the run."""
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


# --- `minitfm eval --plot` ---

def length_chart(report: dict[str, Any], path: Path, force: bool = False) -> None:
    """`eval --plot`: write `length_figure` of an `eval_report` report to `path`."""
    save_png(length_figure(report), path, "--plot", force)


def length_figure(report: dict[str, Any]):
    """Exact match per input length as bars, the trained lengths and those beyond in two
    colours (beyond also hatched)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    lo, hi = report["trained_lengths"]
    rows = sorted((int(n), row["exact_match"]) for n, row in report["per_length"].items())
    fig = Figure(figsize=(max(6.0, 1.5 + 0.25 * len(rows)), 4.0), dpi=100,
                 layout="constrained")
    ax = fig.add_subplot()
    for inside, colour, hatch, label in ((True, TRAINED, None, f"trained lengths {lo}..{hi}"),
                                         (False, BEYOND, "//", "beyond the trained lengths")):
        chosen = [(n, exact) for n, exact in rows if (lo <= n <= hi) == inside]
        if chosen:
            bars = ax.bar(*zip(*chosen, strict=True), color=colour, hatch=hatch,
                          edgecolor="white", label=label)
            # rounded down: 99.9% is no "100%"; a 0% bar is visible by its label
            ax.bar_label(bars, [f"{math.floor(exact * 100)}%" for _, exact in chosen],
                         fontsize=7, rotation=90, padding=2)
    checkpoint = Path(report["checkpoint"])
    run_dir = find_run_dir(checkpoint)
    where = f"{run_dir.name}/{checkpoint.name}" if run_dir else checkpoint.name
    title = f"exact match per input length · {report['task']} · {where} · step {report['step']}"
    ax.set_title(wrap_to_width(title, fig.get_figwidth() - 0.3, 11), fontsize=11)
    ax.set(xlabel="input length", ylabel="exact match (greedy decoding, held-out)",
           ylim=(0, 1.15))  # room for the labels of 100% bars
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
