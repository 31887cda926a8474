"""The pictures of `explain` and `patch`: a page of role cards, and the patching heatmaps.

A role card is one head: its mean attention map over held-out inputs of one shape (queries down,
keys across, in the palette every attention picture uses), titled with the head, its pattern and
effect, and its role underneath. The cards sit in a grid, a row per kind and layer, a column per
head. The patching picture shows each head's restored share, and the residual stream's at every
position, on one diverging scale from -1 to 1.
"""

from __future__ import annotations

import textwrap

import numpy as np

from minitfm.lab.attention.probe import KINDS
from minitfm.lab.interpret.patterns import FITS, WEIGHT
from minitfm.lab.pictures import GAMMA, wrap_to_width

EFFECT_COLOURS = {"essential": "#D55E00", "helps": "#0072B2", "minor": "#555555",
                  "negligible": "#999999"}


def cards_figure(report, maps: dict):
    """Every head's card of an `explain.ExplainReport`: rows kind and layer, columns heads;
    `maps` (kind, layer) -> (H, T_q, T_k) mean maps (see `patterns.mean_maps`). Each map has
    its positions on the axes; under the cards, a legend says what they show and why a head
    is unclear."""
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    rows = sorted({(c.pattern.kind, c.pattern.layer) for c in report.cards},
                  key=lambda key: (KINDS.index(key[0]), key[1]))
    n_heads = max(c.pattern.head for c in report.cards) + 1
    width = 2.7 * n_heads
    fig = Figure(figsize=(width, 3.2 * len(rows) + 1.3), dpi=100, layout="constrained")
    title = (f"role cards · {report.task} · {report.checkpoint.name} · step {report.step} · "
             f"exact match {report.exact_match:.1%} on {report.samples} held-out sequences")
    fig.suptitle(wrap_to_width(title, width - 0.3, 10), fontsize=10)
    axes = fig.subplots(len(rows), n_heads, squeeze=False)
    for card in report.cards:
        p = card.pattern
        ax = axes[rows.index((p.kind, p.layer)), p.head]
        ax.imshow(maps[(p.kind, p.layer)][p.head].numpy(), cmap="viridis",
                  norm=PowerNorm(GAMMA, 0.0, 1.0), aspect="auto")
        position_ticks(ax, *maps[(p.kind, p.layer)].shape[1:], labelled=p.head == 0)
        drop, mode = card.drop
        named = p.pattern if p.pattern == p.best_fit else \
            f"{p.pattern} ({p.best_fit} {p.score:.2f})"  # the fit it fell short with
        ax.set_title(f"{card.label} · {named}\n{card.effect} · {100 * drop:.0f} pts "
                     f"({mode})", fontsize=8, color=EFFECT_COLOURS[card.effect])
        ax.set_xlabel("\n".join(textwrap.wrap(card.sentence, 34)), fontsize=6.5)
    fig.supxlabel(wrap_to_width(CARDS_LEGEND, width - 0.3, 7.5, prefer=()), fontsize=7.5)
    return fig


# Under the role cards: what a map shows, and the naming rule (patterns.FITS, WEIGHT).
CARDS_LEGEND = (
    f"Each map: a head's attention averaged over the held-out inputs of the commonest length; "
    f"rows are queries (encoder: source positions; decoder and cross: output positions, the "
    f"last writing <eos>), columns keys (source positions; for the decoder its input "
    f"positions, 0 = <bos>), numbered on the first map of each row. A head is named after "
    f"its best-fitting pattern when that pattern's key is the strongest in at least "
    f"{FITS:.0%} of its rows and holds at least {WEIGHT:.0%} of the weight; otherwise it is "
    f"unclear (best fit and its score in brackets), or diffuse where no key gets half a row.")
MAX_TICKS = 16  # position labels an axis of a card holds at its size (every k-th beyond)


def position_ticks(ax, queries: int, keys: int, labelled: bool = True) -> None:
    """Number a map's rows and columns by position: each one while they fit, else every k-th
    (0 first); no numbers unless `labelled` (the maps of a row share them, and each label
    costs the layout time)."""
    for axis, n in ((ax.yaxis, queries), (ax.xaxis, keys)):
        step = -(-n // MAX_TICKS)  # ceil: at most MAX_TICKS labels
        positions = list(range(0, n, step)) if labelled else []
        axis.set_ticks(positions, [str(i) for i in positions], fontsize=5)
    ax.tick_params(length=0, pad=1)


def patch_figure(report):
    """Heatmaps of the restored share: the heads (a row per kind and layer), then the residual
    stream, a row per point: the encoder side by source position, the decoder side by output
    position (labelled read→written, as the explorer's page does)."""
    from matplotlib.figure import Figure

    heads = report.heads
    keys = sorted({(r["kind"], r["layer"]) for r in heads},
                  key=lambda key: (KINDS.index(key[0]), key[1]))
    n_heads = max(r["head"] for r in heads) + 1
    head_grid = np.zeros((len(keys), n_heads))
    for r in heads:
        head_grid[keys.index((r["kind"], r["layer"])), r["head"]] = r["restored"]
    sides = {side: report.streams(side) for side in ("encoder", "decoder")}
    heights = [len(keys) + 1, *(len(points) + 1.5 for points in sides.values())]
    fig = Figure(figsize=(9, 2.6 + 0.35 * sum(heights)), dpi=100, layout="constrained")
    fig.suptitle(wrap_to_width(report.title(), 8.6, 9), fontsize=9)
    top, encoder, decoder = fig.subplots(3, 1, height_ratios=heights)
    image = draw_grid(top, head_grid, [f"head {h}" for h in range(n_heads)],
                      [f"{kind} L{layer}" for kind, layer in keys], "heads (output before W^O)")
    for ax, side, labels, title in (
            (encoder, "encoder", report.source_labels(),
             "residual stream, encoder side: source positions"),
            (decoder, "decoder", report.output_labels(),
             "residual stream, decoder side: output positions (read→written)")):
        grid = np.array([values for _, values in sides[side]])  # (points, positions)
        draw_grid(ax, grid, labels, [name for name, _ in sides[side]], title)
    for label in decoder.get_xticklabels():  # `14: 2→2/0` is wider than a cell
        label.set(rotation=45, ha="right", rotation_mode="anchor")
    fig.colorbar(image, ax=[top, encoder, decoder], label="restored share (0: corrupted, "
                                                          "1: clean)", shrink=0.8)
    return fig


def draw_grid(ax, grid: np.ndarray, columns: list[str], rows: list[str], title: str):
    """One heatmap of restored shares with the value in each cell; the image, for a colour bar."""
    image = ax.imshow(grid, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto")
    for (r, c), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=6.5,
                    color="white" if abs(value) > 0.6 else "black")
    ax.set_xticks(range(len(columns)), columns, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_title(title, fontsize=8)
    ax.tick_params(length=0)
    return image
