"""`minitfm visualize-attention`: what every attention head does, as a PNG grid, heatmaps in
the terminal (`attention_text`) and alignment scores; with --over-training, the heads' scores
at each evaluation of training (`over_training_table`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.columns import Columns
from rich.table import Table
from rich.text import Text

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads, loaded_run
from minitfm.app.output import console, note, say, show, widest, wrote
from minitfm.app.parameters import (
    book_option,
    checkpoint_option,
    option,
    options_from,
    run_argument,
    threads_option,
)
from minitfm.app.text import heading_lines, printable
from minitfm.errors import MinitfmError, shown_path
from minitfm.lab.options import VisualizeOptions

if TYPE_CHECKING:
    import numpy as np

    from minitfm.lab.attention.over_training import OverTrainingReport
    from minitfm.lab.attention.probe import MapBlock
    from minitfm.lab.attention.visualize import AttentionReport


@clean_errors
def visualize_attention(
    run: Path | None = run_argument(),
    input_text: str | None = option(VisualizeOptions, "input_text"),
    kind: str = option(VisualizeOptions, "kind"),
    layer: int | None = option(VisualizeOptions, "layer"),
    head: int | None = option(VisualizeOptions, "head"),
    out: Path | None = option(VisualizeOptions, "out"),
    over_training: bool = typer.Option(
        False, "--over-training", help="Draw the cross-attention recorded at each evaluation "
        "of training (the run's attention.jsonl) as one PNG strip: a column per step, a row "
        "per head of the best aligned layer (or --layer); takes RUN, --layer, --out, --gif, "
        "--force."),
    gif: Path | None = typer.Option(None, metavar="FILE", help="With --over-training, also an "
                                    "animated GIF: a frame per recorded step."),
    force: bool = option(VisualizeOptions, "force"),
    terminal: bool = typer.Option(True, "--terminal/--no-terminal",
                                  help="Also draw the heatmaps in the terminal; a bare --kind "
                                       "all draws only cross-attention there (the PNG has "
                                       "all kinds)."),
    checkpoint: str = checkpoint_option(),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Show what every attention head does: a PNG grid, terminal heatmaps, alignment scores."""
    if over_training or gif is not None:
        check_over_training(over_training, {"--input": input_text, "--kind": kind,
                                            "--head": head, "--no-terminal": terminal,
                                            "--checkpoint": checkpoint, "--threads": threads,
                                            "--book": book})
        return show_over_training(run, layer, out, gif, force)
    options = options_from(VisualizeOptions, locals())
    with claimed_threads(threads):
        from minitfm.lab.attention.visualize import check_options, visualize

        check_options(options)  # before the checkpoint is read
        loaded = loaded_run(run, checkpoint, book)
        with loaded.running():
            report = visualize(loaded, options)
    if report.note:
        note(report.note)
    for item in attention_text(report, terminal, console.width, widest):
        if isinstance(item, str):
            say(item)
        else:
            show(item)
    wrote(report.png)


def show_over_training(run: Path | None, layer: int | None, out: Path | None,
                       gif: Path | None, force: bool = False) -> None:
    """`visualize-attention --over-training`: a table of the heads' scores per step, the files."""
    from minitfm.lab.attention.over_training import over_training

    report = over_training(run, layer, out, gif, force)
    if report.note:
        note(report.note)
    console.print(printable(shown_path(report.timeline.run_dir)) + " · cross-attention over "
                  "training", markup=False, highlight=False, soft_wrap=True)
    show(over_training_table(report))
    for path in (report.png, report.gif):
        if path is not None:
            wrote(path)


# What --over-training leaves unused: their defaults (a value the drawing agrees with, too).
OVER_TRAINING_UNUSED = {"--input": (None,), "--kind": ("all", "cross"), "--head": (None,),
                        "--no-terminal": (True,), "--checkpoint": ("best",),
                        "--threads": ("auto",), "--book": (None,)}


def check_over_training(over_training: bool, given: dict) -> None:
    """--gif needs --over-training, which draws what training recorded: no options of a model."""
    if not over_training:
        raise MinitfmError("--gif needs --over-training (the GIF shows the maps recorded "
                           "during training)")
    unused = [name for name, value in given.items() if value not in OVER_TRAINING_UNUSED[name]]
    if unused:
        raise MinitfmError(f"--over-training cannot be combined with {', '.join(unused)}: it "
                           f"draws the cross-attention recorded during training (it takes RUN, "
                           f"--layer, --out, --gif and --force)")


def attention_text(report: AttentionReport, terminal: bool, width: int,
                   widest: Callable[[Any], int]) -> list:
    """What `visualize-attention` prints before the PNG's path, in order: plain lines (str:
    heading, input, prediction, expected) and renderables (the terminal heatmaps when asked for
    and when they fit `width`, which `widest` measures; their legend; the alignment table)."""
    heading = f"{report.task.name} · {shown_path(report.checkpoint)} · step {report.step}"
    out: list = [*heading_lines(printable(heading), width), *probe_lines(report)]
    maps = attention_heatmaps(report.terminal_blocks) if terminal else []
    needed = max(map(widest, maps), default=0)
    if needed > width:  # wrapped, a map's rows would fall apart
        out.append(f"(the terminal heatmaps need {needed} columns, this terminal has {width}: "
                   f"see the PNG, or widen the terminal)")
    elif terminal:
        out += [*maps, heatmap_legend(report.terminal_blocks)]
        if len(report.terminal_blocks) < len(report.blocks):
            out.append("(terminal: cross-attention only; --kind encoder|decoder or --layer/"
                       "--head for the others, all of them are in the PNG)")
    return [*out, alignment_table(report)]


def probe_lines(report: AttentionReport) -> list[str]:
    """The input, the prediction (right or wrong) and the expected output, a line each."""
    fmt, probe = report.task.format, report.probe
    lines = [f"input:      {printable(fmt(probe.src))}"]
    if report.target is None:  # pairs: an input that is not in the data
        return [*lines, f"prediction: {printable(fmt(probe.prediction))}",
                "expected:   (unknown: this input is not a held-out pair)"]
    verdict = "correct" if probe.prediction == report.target else "wrong"
    return [*lines, f"prediction: {printable(fmt(probe.prediction))}  ({verdict})",
            f"expected:   {printable(fmt(report.target))}"]


SHADES = (" ", "·", "░", "░", "▒", "▒", "▓", "▓", "█")  # the palette's levels without colour


def palette_cells(width: int = 2) -> list[tuple[str, str]]:
    """The palette's coloured blocks; their shade characters show only where colour is off
    (pipes, NO_COLOR)."""
    from minitfm.lab.pictures import PALETTE

    return [(shade * width, f"{colour} on {colour}")
            for shade, colour in zip(SHADES, PALETTE, strict=True)]


def heatmap(weights: np.ndarray, queries: list[str], keys: list[str], title: str) -> Text:
    """One map: a row per query token, a 2-wide cell per key token."""
    from minitfm.lab.attention.mapgrid import SHORT_TOKENS
    from minitfm.lab.pictures import level

    cells = palette_cells()
    width = max(len(q) for q in queries)
    header = " " * (width + 1) + "".join(f"{SHORT_TOKENS.get(k, k)[:2]:>2}" for k in keys)
    text = Text()
    text.append(title, style="bold")
    text.append("\n" + header)
    for query, row in zip(queries, weights, strict=True):
        text.append(f"\n{query:>{width}} ")
        for weight in row:
            text.append(*cells[level(float(weight))])
    return text


def heatmap_legend(blocks: list[MapBlock]) -> Text:
    """The palette from weight 0 to 1, and how to read the maps: the rows, the columns, and
    the short names of the column tokens that appear in them (`^ = <bos>`)."""
    from minitfm.lab.attention.mapgrid import SHORT_TOKENS

    text = Text("weight 0 ")
    for cell in palette_cells():
        text.append(*cell)
    shown = {key for block in blocks for key in block.keys}
    short = [f"{SHORT_TOKENS[token]} = {token}" for token in SHORT_TOKENS if token in shown]
    rows = "query tokens" if all(b.kind == "encoder" or b.note is None for b in blocks) \
        else "query tokens (decoder: token read → token written)"
    text.append(f" 1  (colour ∝ √weight)\nrows: {rows}, columns: key tokens"
                + "".join(f", {s}" for s in short))
    return text


def attention_heatmaps(blocks: list[MapBlock]) -> list:
    """A heading per kind and layer, then its heads side by side."""
    from minitfm.lab.attention.probe import KIND_TITLES

    out = []
    for block in blocks:
        for r, layer in enumerate(block.layers):
            out.append(Text(f"\n{KIND_TITLES[block.kind]} · layer {layer}", style="bold cyan"))
            maps = [heatmap(block.weights[r, c], block.queries, block.keys, f"head {head}")
                    for c, head in enumerate(block.heads)]
            out.append(Columns(maps, padding=(1, 3)))
    return out


def alignment_table(report: AttentionReport) -> Table | Text:
    """Every cross-attention head's alignment score, the best head in bold."""
    import numpy as np

    from minitfm.lab.attention.probe import ALIGNMENT_SAMPLES

    if report.scores is None:
        return Text(f"task '{report.task.name}' has no ideal alignment: no alignment score")
    best = divmod(int(report.held_out_scores.argmax()), report.held_out_scores.size(1))
    table = Table(title="alignment score of each cross-attention head")
    held_out = f"held-out ({ALIGNMENT_SAMPLES})"
    for column in ("layer", "head", "this input", held_out, "held-out argmax"):
        table.add_column(column, justify="right")
    table.add_column("")
    for layer, head in np.ndindex(*report.scores.shape):
        is_best = (layer, head) == best
        table.add_row(str(layer), str(head), f"{report.scores[layer, head]:.3f}",
                      f"{report.held_out_scores[layer, head]:.3f}",
                      f"{report.held_out_hits[layer, head]:.3f}", "← best" if is_best else "",
                      style="bold green" if is_best else None)
    table.caption = ("weight on the ideal source position, mean over target positions (EOS "
                     "excluded), teacher-forced on the true target: 1 = exact, about 1/S = "
                     f"uniform; held-out argmax: share of the target positions of the same "
                     f"{ALIGNMENT_SAMPLES} held-out pairs whose strongest key is the ideal one")
    return table


def over_training_table(report: OverTrainingReport) -> Table:
    """A row per recorded step: its exact match and each cross-attention head's scores."""
    from minitfm.lab.attention.over_training import head_text
    from minitfm.lab.attention.probe import ALIGNMENT_SAMPLES

    timeline, layer = report.timeline, report.layer
    aligned = timeline.alignment is not None
    scores = "alignment score · entropy" if aligned else "entropy"
    table = Table(title=f"{scores} of each cross-attention head of {report.why}")
    for column in ("step", "exact match", *(f"head {h}" for h in range(timeline.cross.shape[2]))):
        table.add_column(column, justify="right")
    for n, step in enumerate(timeline.steps):
        em = timeline.exact_match[n]
        heads = [head_text(timeline, n, layer, h, labelled=False)
                 for h in range(timeline.cross.shape[2])]
        table.add_row(str(step), "" if em is None else f"{em:.1%}", *heads)
    table.caption = (f"on {ALIGNMENT_SAMPLES} held-out pairs; entropy in nats (uniform over S "
                     f"source tokens: ln S; one token: 0)"
                     + ("; alignment: weight on the ideal source position" if aligned else ""))
    return table
