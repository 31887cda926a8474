"""Attention you can see as PNG figures: per kind of attention a titled grid of heatmaps (rows
layers, columns heads), tokens on the axes, one colour bar, drawn with matplotlib from the
`MapBlock`s of a probe (`probe.py`). visualize-attention's PNG is one; the --over-training strip
(`over_training.py`) shares its sizes and scale.

Titles are wrapped to the figure's width (`pictures.wrap_to_width`), and symbols the font lacks
are drawn as `lettering.py` says. The colours follow weight**GAMMA (`pictures.GAMMA`).

Shapes: L layers, H n_heads, T_q and T_k query and key len.
matplotlib is imported inside functions, so `minitfm --help` does not pay for it.
"""

from __future__ import annotations

from minitfm.lab.attention.probe import KIND_TITLES, MapBlock
from minitfm.lab.pictures import GAMMA, wrap_to_width

COLOUR_BAR_LABEL = "attention weight\n(sqrt scale)"  # the colours follow weight**GAMMA
TITLE_SIZES = (11, 10)  # points: the figure's title, each kind's title
HEAD_SIZE, TICK_SIZE = 9, 9  # points: each map's title, the tokens on its axes
TITLE_MARGIN = 0.3  # inches of a figure's width that no title line may use (both sides)


def attention_figure(blocks: list[MapBlock], title: str):
    """A matplotlib Figure: per block a titled grid (rows layers, columns heads), a colour bar.

    Titles are wrapped to the figure's width, and the figure grows by their extra lines, so no
    title is ever cut off, whatever the number of heads and the length of the input. Tokens are
    written at TICK_SIZE points, each panel wide enough for one label per token.
    """
    from matplotlib.figure import Figure

    n_cols = max(len(b.heads) for b in blocks)
    tokens = max(max(len(b.queries), len(b.keys)) for b in blocks)
    panel = max(2.6, 1.0 + 0.17 * tokens)  # inches: room for one readable label per token
    width = n_cols * panel + 1.2
    title_size, kind_size = TITLE_SIZES
    title = wrap_to_width(title, width - TITLE_MARGIN, title_size)
    kind_titles = [wrap_to_width(block_title(b), width - TITLE_MARGIN, kind_size)
                   for b in blocks]
    heights = [len(b.layers) * (panel + note_height(b)) + 0.3 + text_height(t, kind_size)
               for b, t in zip(blocks, kind_titles, strict=True)]
    fig = Figure(figsize=(width, sum(heights) + 0.2 + text_height(title, title_size)), dpi=100,
                 layout="constrained")
    fig.suptitle(title, fontsize=title_size)
    subfigures = fig.subfigures(len(blocks), 1, height_ratios=heights, squeeze=False)[:, 0]
    for subfigure, block, kind_title in zip(subfigures, blocks, kind_titles, strict=True):
        draw_block(subfigure, block, n_cols, kind_title)
    return fig


def block_title(block: MapBlock) -> str:
    """The kind's title, and the line that says how to read the heads' notes."""
    return KIND_TITLES[block.kind] + ("" if block.note is None else f"\n{block.note}")


def note_height(block: MapBlock) -> float:
    """Inches a line of head notes adds to each row of maps."""
    return 0.0 if block.head_notes is None else text_height("", HEAD_SIZE)


def text_height(text: str, size: float) -> float:
    """Inches that `text` takes up, at `size` points with matplotlib's line spacing (1.2)."""
    return (text.count("\n") + 1) * size * 1.2 / 72


def draw_block(subfigure, block: MapBlock, n_cols: int, title: str) -> None:
    """One kind's heatmaps into `subfigure`, tokens on the axes, one shared colour bar."""
    from matplotlib.colors import PowerNorm

    norm = PowerNorm(GAMMA, vmin=0.0, vmax=1.0)  # one scale for all maps: weights are comparable
    axes = subfigure.subplots(len(block.layers), n_cols, squeeze=False)
    subfigure.suptitle(title, fontsize=TITLE_SIZES[1])
    image = None
    for r, layer in enumerate(block.layers):
        for c in range(n_cols):
            ax = axes[r, c]
            if c >= len(block.heads):
                ax.set_axis_off()
                continue
            # aspect "auto": the map fills its panel (cells about square, as the panel is), so
            # constrained layout places every label inside the figure; a fixed aspect moves the
            # axes after layout and can push labels of large maps off the edge.
            image = ax.imshow(block.weights[r, c], cmap="viridis", norm=norm, aspect="auto")
            note = "" if block.head_notes is None else f"\n{block.head_notes[r, c]}"
            ax.set_title(f"layer {layer} · head {block.heads[c]}{note}", fontsize=HEAD_SIZE)
            label_tokens(ax, block, bottom=r == len(block.layers) - 1, left=c == 0)
    subfigure.colorbar(image, ax=axes, shrink=0.9, label=COLOUR_BAR_LABEL, pad=0.01)


def label_tokens(ax, block: MapBlock, bottom: bool, left: bool) -> None:
    """Key tokens under the bottom row of a grid, query tokens left of its first column (the
    maps of a grid share their axes; fewer labels also lay out and draw faster)."""
    keys = range(len(block.keys)) if bottom else []
    rotation = 90 if max(map(len, block.keys)) > 2 else 0  # <bos>
    ax.set_xticks(keys, block.keys if bottom else [], fontsize=TICK_SIZE, rotation=rotation)
    ax.set_yticks(range(len(block.queries)) if left else [], block.queries if left else [],
                  fontsize=TICK_SIZE)
    ax.tick_params(length=0)
