"""`minitfm visualize-attention --over-training`: a run's recorded attention (`attention.jsonl`,
read by `timeline.py`) drawn as one PNG strip, a column per recorded step and a row per head of
one layer, and with `--gif` as an animated GIF, a frame per step.

The strip is a matplotlib figure at the sizes and scale of `figures.py`; the GIF's frames are
TensorBoard's pictures (`mapgrid.py`). Both follow the picture rule (`lab/pictures.py`).

Shapes: N snapshots, L layers, H n_heads, T_q and T_k query and key len.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from minitfm.errors import CheckpointError, MinitfmError
from minitfm.lab.attention.figures import (
    COLOUR_BAR_LABEL,
    HEAD_SIZE,
    TITLE_MARGIN,
    TITLE_SIZES,
    label_tokens,
    text_height,
)
from minitfm.lab.attention.lettering import Lettering, lettering
from minitfm.lab.attention.mapgrid import MapGrid
from minitfm.lab.attention.probe import ALIGNMENT_SAMPLES, KIND_TITLES, MapBlock
from minitfm.lab.attention.timeline import Timeline, read_timeline
from minitfm.lab.pictures import (
    GAMMA,
    SOFTWARE,
    check_output,
    save_png,
    wrap_to_width,
    write_picture,
)
from minitfm.run.summary import read_run_config
from minitfm.run.which_run import run_directory

MAX_COLUMNS = 12  # a strip of more recorded steps shows this many, evenly spread
GIF_FRAME_MS, GIF_LAST_MS = 700, 2500  # the last frame, the trained model, stays longer


@dataclass
class OverTrainingReport:
    """What `--over-training` shows: the timeline, the layer drawn (and why), the files."""

    timeline: Timeline
    layer: int
    why: str
    png: Path
    gif: Path | None
    note: str | None = None  # the default run taken; symbols labelled by code point


def over_training(run: Path | None, layer: int | None = None, out: Path | None = None,
                  gif: Path | None = None, force: bool = False) -> OverTrainingReport:
    """Draw a run's recorded cross-attention as one PNG strip (and, with `gif`, a GIF). An
    existing file is replaced if minitfm wrote it, or with `force` (`pictures.check_output`)."""
    notes: list[str] = []  # the run taken when RUN is left out
    run_dir = run_directory(run, "--over-training reads the run's attention.jsonl", notes)
    timeline = read_timeline(run_dir)
    layer, why = pick_layer(timeline, layer)
    png = out if out is not None else run_dir / "attention" / f"over-training-layer{layer}.png"
    check_output(png, "--out", force)
    if gif is not None:
        check_gif(gif, force)  # both, before anything is drawn
    title = strip_title(timeline, why, shown_columns(len(timeline.steps)))
    letters = lettering([title, *timeline.source, *timeline.decoder_input])
    with letters.fonts():
        save_png(strip_figure(timeline, layer, why, letters), png, "--out", force)
    if gif is not None:
        write_gif(timeline, gif, force)
    return OverTrainingReport(timeline, layer, why, png, gif,
                              "; ".join(filter(None, [*notes, letters.note()])) or None)


def pick_layer(timeline: Timeline, layer: int | None) -> tuple[int, str]:
    """The layer to draw and why: `layer`, else the one whose best head has the highest final
    alignment score, else (no ideal alignment) the last."""
    n_layers = timeline.cross.shape[1]
    if layer is not None:
        if not 0 <= layer < n_layers:
            raise MinitfmError(f"--layer ({layer}) must be in 0..{n_layers - 1}: the model has "
                               f"{n_layers} decoder layers")
        return layer, f"layer {layer} (--layer)"
    if timeline.alignment is None:
        return n_layers - 1, f"layer {n_layers - 1}, the last: the task has no ideal alignment"
    final = timeline.alignment[-1]  # (L, H)
    best = int(final.max(axis=1).argmax())
    head = int(final[best].argmax())
    return best, (f"layer {best}, where head {head} has the best final alignment score, "
                  f"{final[best, head]:.2f}")


def shown_columns(n: int) -> list[int]:
    """The snapshots a strip shows: all, or MAX_COLUMNS spread evenly, first and last kept."""
    return sorted({round(i) for i in np.linspace(0, n - 1, min(n, MAX_COLUMNS))})


def exact_match_text(value: float | None) -> str:
    return "no evaluation" if value is None else f"exact match {value:.1%}"


def head_text(timeline: Timeline, n: int, layer: int, head: int, labelled: bool = True) -> str:
    """A head's scores at snapshot `n`: alignment (if any) and entropy."""
    align, h = ("align ", "H ") if labelled else ("", "")
    entropy = f"{h}{timeline.entropy[n, layer, head]:.2f}"
    if timeline.alignment is None:
        return entropy
    return f"{align}{timeline.alignment[n, layer, head]:.2f} · {entropy}"


def strip_title(timeline: Timeline, why: str, columns: list[int]) -> str:
    """Task, run, layer and why; the probe; how to read the numbers."""
    shown = "" if len(columns) == len(timeline.steps) else \
        f" ({len(columns)} of {len(timeline.steps)} recorded steps; the GIF has all)"
    align = "align = alignment score, " if timeline.alignment is not None else ""
    return (f"{run_title(timeline)} · cross-attention over training{shown}\n"
            f"rows: the heads of {why}\n"
            f"probe: input {timeline.input} → target {timeline.target} (teacher-forced on the "
            f"target; colour ∝ √weight)\n{align}H = attention entropy in nats, on "
            f"{ALIGNMENT_SAMPLES} held-out pairs")


def run_title(timeline: Timeline) -> str:
    """The task's name and the run's."""
    try:
        task = (read_run_config(timeline.run_dir) or {}).get("task", {}).get("name", "?")
    except CheckpointError:  # a damaged config.yaml: the title does without the task
        task = "?"
    return f"{task} · {timeline.run_dir.name}"


def strip_figure(timeline: Timeline, layer: int, why: str, letters=None):
    """A matplotlib Figure: a column per recorded step (step and exact match on top), a row per
    head of `layer`, source tokens under every map and decoder input left of each row, axis
    titles, one colour bar; symbols as `letters` (a `lettering.Lettering`) writes them."""
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    letters = letters or Lettering()
    columns, n_heads = shown_columns(len(timeline.steps)), timeline.cross.shape[2]
    tokens = max(len(timeline.source), len(timeline.decoder_input))
    # inches: room for a label per token at TICK_SIZE points, and for the scores
    panel = max(1.8, 0.6 + 0.14 * tokens)
    width = len(columns) * panel + 1.5
    title = wrap_to_width(letters.text(strip_title(timeline, why, columns)),
                          width - TITLE_MARGIN, TITLE_SIZES[0])
    fig = Figure(figsize=(width, n_heads * (panel + 0.6) + 0.8 + text_height(title, 11)),
                 dpi=100, layout="constrained")
    fig.suptitle(title, fontsize=TITLE_SIZES[0])
    axes = fig.subplots(n_heads, len(columns), squeeze=False)
    norm = PowerNorm(GAMMA, vmin=0.0, vmax=1.0)  # one scale for every step and head
    for c, n in enumerate(columns):
        for head in range(n_heads):
            ax = axes[head, c]
            image = ax.imshow(timeline.cross[n, layer, head], cmap="viridis", norm=norm,
                              aspect="auto")
            scores = head_text(timeline, n, layer, head)
            top = f"step {timeline.steps[n]}\n{exact_match_text(timeline.exact_match[n])}\n"
            ax.set_title((top if head == 0 else "") + scores, fontsize=HEAD_SIZE)
            # source tokens under every map: each row of heads is read on its own
            label_axes(ax, timeline, bottom=True, left=c == 0, letters=letters)
            if c == 0:
                ax.set_ylabel(f"head {head}\nquery: decoder input", fontsize=HEAD_SIZE)
    fig.supxlabel(wrap_to_width("key: source token (the same input at every step)",
                                width - TITLE_MARGIN, HEAD_SIZE + 1), fontsize=HEAD_SIZE + 1)
    fig.colorbar(image, ax=axes, shrink=0.9, label=COLOUR_BAR_LABEL, pad=0.01)
    return fig


def label_axes(ax, timeline: Timeline, bottom: bool, left: bool, letters=None) -> None:
    """The probe's tokens: source under the map if `bottom`, decoder input left of it if `left`."""
    axes = MapBlock("cross", [], [], np.empty(0), timeline.decoder_input, timeline.source)
    label_tokens(ax, (letters or Lettering()).block(axes), bottom, left)


def check_gif(path: Path, force: bool = False) -> None:
    """--gif must name a .gif file (not a directory) that may be written (the picture rule)."""
    check_output(path, "--gif", force, ".gif")


def write_gif(timeline: Timeline, path: Path, force: bool = False) -> None:
    """An animated GIF, a frame per recorded step: every layer and head of cross-attention
    (TensorBoard's picture), captioned with the step, its exact match and the best alignment.
    Written atomically, as the PNGs, and marked as minitfm's by its comment."""
    from PIL import Image

    n_layers, n_heads = timeline.cross.shape[1:3]
    block = MapBlock("cross", list(range(n_layers)), list(range(n_heads)), timeline.cross[0],
                     timeline.decoder_input, timeline.source)
    captions = [gif_caption(timeline, n) for n in range(len(timeline.steps))]
    header = (f"{run_title(timeline)} · {KIND_TITLES['cross']}\ninput {timeline.input} → "
              f"target {timeline.target} (teacher-forced on the target; colour ∝ √weight; "
              f"^ = <bos>)")
    grid = MapGrid(block, header, max(captions, key=len))
    frames = [Image.fromarray(grid.frame(replace(block, weights=timeline.cross[n]), caption))
              for n, caption in enumerate(captions)]
    durations = [GIF_FRAME_MS] * (len(frames) - 1) + [GIF_LAST_MS]
    check_gif(path, force)
    write_picture(path, "--gif", lambda buffer: frames[0].save(
        buffer, format="GIF", save_all=True, append_images=frames[1:], duration=durations,
        loop=0, comment=SOFTWARE))


def gif_caption(timeline: Timeline, n: int) -> str:
    best = "" if timeline.alignment is None else \
        f" · best alignment {timeline.alignment[n].max():.2f}"
    return f"step {timeline.steps[n]} · {exact_match_text(timeline.exact_match[n])}{best}"
