"""`minitfm visualize-attention`: one input through a loaded run, its attention maps as a PNG,
and how well each cross-attention head aligns (the terminal's heatmaps:
`app/commands/visualize_attention.py`).

The probe and the scores are `probe.py`'s, the figure `figures.py`'s; here they meet a loaded
run (`lab/loaded.py`) and the command's options (`lab/options.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from torch import Tensor

from minitfm.errors import MinitfmError, quote
from minitfm.lab.attention.figures import attention_figure
from minitfm.lab.attention.lettering import lettering
from minitfm.lab.attention.probe import (
    ALIGNMENT_SAMPLES,
    KINDS,
    MapBlock,
    Probe,
    alignment_scores,
    map_blocks,
    only,
    pick_probe,
    run_probe,
)
from minitfm.lab.loaded import Loaded
from minitfm.lab.measure.evaluate import input_limit
from minitfm.lab.options import VisualizeOptions
from minitfm.lab.pictures import check_output, save_png
from minitfm.tasks.base import Pair, Task

MAX_DRAWN_TOKENS = 64  # --input: a map of 64 x 130 cells per head is already a poster


@dataclass
class AttentionReport:
    """What `visualize-attention` shows: the probe, where the PNG went, the alignment scores."""

    task: Task
    checkpoint: Path
    step: int
    probe: Probe
    target: list[int]
    blocks: list[MapBlock]
    png: Path
    scores: Tensor | None  # (L, H) on this input
    held_out_scores: Tensor | None  # (L, H) on ALIGNMENT_SAMPLES held-out pairs
    held_out_hits: Tensor | None  # (L, H) the same with each row's argmax
    terminal_blocks: list[MapBlock]  # what the terminal shows (see `terminal_selection`)
    note: str | None = None  # symbols the PNG labels by code point (`Lettering.note`)


def check_options(options: VisualizeOptions) -> None:
    """`--kind` and `--out` (the picture rule, `pictures.check_output`), before the checkpoint
    is read."""
    parse_kind(options.kind)
    if options.out is not None:
        check_output(options.out, "--out", options.force)


def visualize(loaded: Loaded, options: VisualizeOptions = VisualizeOptions()) -> AttentionReport:
    """Run one input through a loaded run, write its attention maps as a PNG, score alignment.
    An existing PNG is replaced if minitfm wrote it, or with `options.force`."""
    check_options(options)
    kinds, task = parse_kind(options.kind), loaded.task
    check_selection(loaded.config, kinds, options.layer, options.head)
    png = options.out if options.out is not None else default_png(loaded, options)
    check_output(png, "--out", options.force)  # before anything is drawn
    held_out = loaded.held_out()  # as in training
    src = read_input(loaded, options.input_text, held_out)
    probe = run_probe(loaded.model, task, src)
    target = task.target(src)
    here = alignment_scores(loaded.model, task, [(src, target)])
    scores = alignment_scores(loaded.model, task, held_out[:ALIGNMENT_SAMPLES])
    soft, hard = (None, None) if scores is None else (scores.soft, scores.hard)
    here_soft = None if here is None else here.soft
    blocks = [with_scores(only(b, options.layer, options.head), here_soft, soft)
              for b in map_blocks(probe, task, kinds, written=True)]
    note = draw_attention(blocks, figure_title(loaded, probe, target), png, options.force)
    shown = terminal_selection(options)
    return AttentionReport(task, loaded.checkpoint, loaded.step, probe, target, blocks, png,
                           here_soft, soft, hard, [b for b in blocks if b.kind in shown], note)


def with_scores(block: MapBlock, here: Tensor | None, held_out: Tensor | None) -> MapBlock:
    """A cross-attention block with each head's alignment scores (L, H) under its title, the
    best held-out head marked; other kinds, and tasks without an ideal alignment, as they are."""
    if block.kind != "cross" or here is None or held_out is None:
        return block
    best = divmod(int(held_out.argmax()), held_out.size(1))
    notes = np.array([[f"alignment {held_out[i, h]:.2f} · here {here[i, h]:.2f}"
                       + (" ← best" if (i, h) == best else "") for h in block.heads]
                      for i in block.layers], dtype=object)
    explained = (f"alignment: mean weight on the ideal source position, on {ALIGNMENT_SAMPLES} "
                 f"held-out pairs (here: on this input alone)")
    return replace(block, head_notes=notes, note="\n".join(filter(None, (explained, block.note))))


def draw_attention(blocks: list[MapBlock], title: str, png: Path, force: bool) -> str | None:
    """Write `attention_figure` to `png`, each symbol in a font that has it; the note for the
    user if some are labelled by code point (`Lettering`)."""
    letters = lettering([title, *(token for b in blocks for token in (*b.queries, *b.keys))])
    with letters.fonts():
        fig = attention_figure([letters.block(b) for b in blocks], letters.text(title))
        save_png(fig, png, "--out", force)
    return letters.note()


def parse_kind(kind: str) -> tuple[str, ...]:
    """`--kind`: one of KINDS, or all of them."""
    if kind == "all":
        return KINDS
    if kind not in KINDS:
        raise MinitfmError(f"--kind ({kind!r}) must be one of {', '.join(KINDS)}, all")
    return (kind,)


def terminal_selection(options: VisualizeOptions) -> tuple[str, ...]:
    """Kinds drawn in the terminal: a bare `--kind all` means cross only (the PNG has all)."""
    if options.kind == "all" and options.layer is None and options.head is None:
        return ("cross",)
    return parse_kind(options.kind)


def check_selection(cfg, kinds: tuple[str, ...], layer: int | None, head: int | None) -> None:
    """`--layer` and `--head` must exist in every kind asked for."""
    n_encoder, n_decoder = cfg.model.n_encoder_layers, cfg.model.n_decoder_layers
    n_layers = min(n_encoder if kind == "encoder" else n_decoder for kind in kinds)
    if layer is not None and not 0 <= layer < n_layers:
        raise MinitfmError(f"--layer ({layer}) must be in 0..{n_layers - 1} for --kind "
                           f"{'/'.join(kinds)}: the model has {n_encoder} encoder and "
                           f"{n_decoder} decoder layers")
    n_heads = cfg.model.n_heads
    if head is not None and not 0 <= head < n_heads:
        raise MinitfmError(f"--head ({head}) must be in 0..{n_heads - 1}: the model has "
                           f"{n_heads} heads per layer")


def read_input(loaded: Loaded, text: str | None, held_out: list[Pair],
               option: str = "--input") -> list[int]:
    """`--input` parsed in task syntax (messages call it `option`), or (none given) the
    held-out probe of training."""
    if text is None:
        return pick_probe(held_out)[0]
    limit = input_limit(loaded.config, loaded.task)
    try:
        return loaded.task.parse(text, max_tokens=min(limit or MAX_DRAWN_TOKENS,
                                                      MAX_DRAWN_TOKENS))
    except MinitfmError as err:
        raise type(err)(f"{option} ({quote(text)}): {err}") from None


def default_png(loaded: Loaded, options: VisualizeOptions) -> Path:
    """`<run>/attention/<checkpoint>-step<N>[-<kind>][-layer<L>][-head<H>].png`; for a
    checkpoint outside any run, `<checkpoint>-attention-step<N>....png` beside the file."""
    suffix = f"step{loaded.step}"
    suffix += "" if options.kind == "all" else f"-{options.kind}"
    suffix += "" if options.layer is None else f"-layer{options.layer}"
    suffix += "" if options.head is None else f"-head{options.head}"
    if loaded.code is not None and loaded.code.workbook is not None:
        suffix += "-workbook"  # a learner's code draws its own picture, beside the book's
    return loaded.picture_path("attention", f"{suffix}.png")


def figure_title(loaded: Loaded, probe: Probe, target: list[int]) -> str:
    """Task, checkpoint and step; the input, the prediction and (if wrong) the target."""
    fmt = loaded.task.format
    if target is None:  # pairs: an input that is not in the data
        verdict = "(expected: unknown)"
    else:
        verdict = "✓" if probe.prediction == target else f"✗ (expected {fmt(target)})"
    return (f"{loaded.task.name} · {loaded.checkpoint.name} · step {loaded.step}\n"
            f"input {fmt(probe.src)} → prediction {fmt(probe.prediction)} {verdict}")
