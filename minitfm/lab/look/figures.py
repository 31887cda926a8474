"""Attention you can see: heatmap figures (PNG), pictures for TensorBoard, the maps and colour
levels of the terminal heatmaps (drawn by `app.tables`), from a `Probe` (`lab/probe.py`).

The PNG figures are drawn with matplotlib; TensorBoard's pictures, one per kind at every
evaluation, with numpy and Pillow (`MapGrid`), milliseconds each instead of about a second.
Both write in DejaVu Sans; a symbol it has no glyph for (Korean, say) is drawn from another
installed font that has one, else written as its code point (U+D55C), as is a control
character (`Lettering`): never an empty box, never a warning per glyph.

Shapes: L layers, H n_heads, T_q and T_k query and key len.
matplotlib and Pillow are imported inside functions, so `minitfm --help` does not pay for them.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from minitfm.lab.plots import wrap_to_width, wrap_words
from minitfm.lab.probe import KINDS, Probe
from minitfm.tasks.base import Task

KIND_TITLES = {
    "encoder": "encoder self-attention (query: source, key: source)",
    "decoder": "decoder self-attention (query: decoder input, key: decoder input)",
    "cross": "cross-attention (query: decoder input, key: source)",
}
GAMMA = 0.5  # colour ∝ weight**GAMMA: diffuse rows (~1/S each) stay visible next to sharp ones
PALETTE = ("#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c",  # viridis, dark to light
           "#28ae80", "#5ec962", "#addc30", "#fde725")
# What minitfm's own pictures write besides the tokens: printable ASCII and these, all of them
# in DejaVu Sans (a test checks).
FONT_HAS = frozenset(map(chr, range(0x20, 0x7F))) | frozenset("\n·→∝√✓✗")
SHORT_TOKENS = {"<bos>": "^", "<eos>": "$", "<pad>": "_"}  # column labels are 2 cells wide
GRID_MAP_PIXELS = 256  # TensorBoard pictures: a map's longer side, at most (cells <= 16 px)
GRID_PAD, GRID_GAP, GRID_BAR = 8, 12, 12  # pixels: the border, between maps, the bar's width
COLOUR_BAR_LABEL = "attention weight\n(sqrt scale)"  # the colours follow weight**GAMMA
TITLE_SIZES = (11, 10)  # points: the figure's title, each kind's title
HEAD_SIZE, TICK_SIZE = 9, 9  # points: each map's title, the tokens on its axes
TITLE_MARGIN = 0.3  # inches of a figure's width that no title line may use (both sides)
FONT = "DejaVu Sans"  # matplotlib's own font, and MapGrid's (`font_path`)


# --- figures ---

@dataclass
class MapBlock:
    """Maps of one kind drawn as a grid: weights (L, H, T_q, T_k), tokens on both axes."""

    kind: str
    layers: list[int]
    heads: list[int]
    weights: np.ndarray
    queries: list[str]
    keys: list[str]
    head_notes: np.ndarray | None = None  # (L, H) a line under each head's title, if any
    note: str | None = None  # a line under the block's title: how to read `head_notes`


def map_blocks(probe: Probe, task: Task, kinds: tuple[str, ...] = KINDS,
               written: bool = False) -> list[MapBlock]:
    """Every layer and head of a probe's maps, of the kinds asked for (`only` narrows a block).

    With `written` (a probe decoded freely, not teacher-forced), the decoder's query rows say
    which token each read and which it wrote, `<bos>→3`, as the explorer's rows do: row t
    reads the output before it and writes output t, so a reverse model's anti-diagonal starts
    on the `<bos>` row."""
    source = [task.vocab.token(i) for i in probe.src]
    decoder = [task.vocab.token(i) for i in probe.decoder_input]
    rows = [f"{read}→{task.vocab.token(out)}" for read, out in
            zip(decoder, probe.decoded, strict=True)] if written else decoder
    axes = {"encoder": (source, source), "decoder": (rows, decoder), "cross": (rows, source)}
    note = "rows: the token each step read → the token it wrote" if written else None
    blocks = []
    for kind in kinds:
        weights = torch.stack(getattr(probe.maps, kind))  # (L, H, T_q, T_k)
        n_layers, n_heads = weights.shape[:2]
        blocks.append(MapBlock(kind, list(range(n_layers)), list(range(n_heads)),
                               weights.numpy(), *axes[kind],
                               note=None if kind == "encoder" else note))
    return blocks


def only(block: MapBlock, layer: int | None = None, head: int | None = None) -> MapBlock:
    """`block` with only layer `layer` and head `head` (None: all of them)."""
    layers = block.layers if layer is None else [layer]
    heads = block.heads if head is None else [head]
    return replace(block, layers=layers, heads=heads,
                   weights=block.weights[np.ix_(layers, heads)])  # (L', H', T_q, T_k)


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


# --- TensorBoard pictures ---

class MapGrid:
    """One kind's maps of a fixed probe as RGB pictures, drawn with numpy and Pillow: rows
    layers, columns heads, tokens on the axes, a colour bar, a title. Labels and title are
    drawn once; a frame pastes the maps and writes its caption. Milliseconds, where a
    matplotlib figure takes about a second: TensorBoard gets one at every evaluation."""

    def __init__(self, block: MapBlock, header: str, longest_caption: str, size: int = 11):
        from PIL import Image, ImageDraw, ImageFont

        # Pillow draws with one font: what it lacks is written as its code point
        self.glyphs: dict[int, int] | None = None  # its character map, read when needed
        letters = self.lettering([header, *block.queries, *block.keys])
        block, header = letters.block(block), letters.text(header)
        self.font = ImageFont.truetype(font_path(), size)
        self.title_font = ImageFont.truetype(font_path(), size + 2)
        self.layout = GridLayout(self.font, self.title_font, block)
        header_lines = self.wrap(header)
        self.caption_y = GRID_PAD + len(header_lines) * self.layout.title_line
        # room for the longest caption any frame can have: every frame has the same size
        self.top = self.caption_y + len(self.wrap(longest_caption)) * self.layout.title_line \
            + GRID_PAD // 2
        canvas = np.full((self.top + self.layout.height, self.layout.width, 3), 255, np.uint8)
        x, y, height = self.layout.bar(self.top)
        canvas[y:y + height, x:x + GRID_BAR] = colours(np.linspace(1, 0, height) ** 2)[:, None]
        image = Image.fromarray(canvas)
        draw = ImageDraw.Draw(image)
        self.write(draw, header_lines, GRID_PAD)
        self.layout.label(draw, block, self.top)
        self.background = np.asarray(image)

    def frame(self, block: MapBlock, caption: str) -> np.ndarray:
        """The picture of the block's weights (L, H, T_q, T_k) with `caption`: RGB
        (height, width, 3) uint8."""
        from PIL import Image, ImageDraw

        canvas, cell = self.background.copy(), self.layout.cell
        for r, c, x, y in self.layout.maps(self.top):
            cells = colours(block.weights[r, c])  # (T_q, T_k, 3)
            canvas[y:y + self.layout.map_h, x:x + self.layout.map_w] = \
                cells.repeat(cell, axis=0).repeat(cell, axis=1)
        image = Image.fromarray(canvas)
        caption = self.lettering([caption]).text(caption)  # the model's output
        self.write(ImageDraw.Draw(image), self.wrap(caption), self.caption_y)
        return np.asarray(image)

    def lettering(self, texts: list[str]) -> Lettering:
        """How `texts` are drawn (see `lettering`). Text of FONT_HAS needs no look at the font's
        character map, which costs importing matplotlib (~0.2 s, in the first picture of a run)."""
        if set("".join(texts)) <= FONT_HAS:
            return Lettering()
        if self.glyphs is None:
            self.glyphs = glyphs(font_path())
        return lettering(texts, self.glyphs, ())

    def wrap(self, text: str) -> list[str]:
        """`text`'s lines, each wrapped to the picture's width."""
        width = self.layout.width - 2 * GRID_PAD
        fits = lambda line: self.title_font.getlength(line) <= width  # noqa: E731
        return [part for line in text.split("\n") for part in wrap_words(line, fits)]

    def write(self, draw, lines: list[str], y: int) -> None:
        for i, line in enumerate(lines):
            draw.text((GRID_PAD, y + i * self.layout.title_line), line, fill="black",
                      font=self.title_font)


def colours(weights: np.ndarray) -> np.ndarray:
    """(...,) attention weights -> (..., 3) uint8 viridis, on the figures' scale (colour ∝
    weight**GAMMA), from the palette's 9 stops."""
    stops = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in PALETTE])  # (9, 3)
    scaled = np.clip(np.nan_to_num(weights), 0.0, 1.0) ** GAMMA
    position = np.linspace(0.0, 1.0, len(PALETTE))
    rgb = [np.interp(scaled, position, stops[:, i]) for i in range(3)]
    return np.stack(rgb, axis=-1).round().astype(np.uint8)


class GridLayout:
    """Where `MapGrid` puts each map, label and the colour bar, in pixels."""

    def __init__(self, font, title_font, block: MapBlock):
        n_layers, n_heads, n_queries, n_keys = block.weights.shape
        self.font, self.line = font, font.size + 4
        self.title_line = title_font.size + 4
        self.cell = max(4, min(16, GRID_MAP_PIXELS // max(n_queries, n_keys)))
        self.map_w, self.map_h = n_keys * self.cell, n_queries * self.cell
        self.queries = [SHORT_TOKENS.get(t, t) for t in block.queries]
        self.keys = [SHORT_TOKENS.get(t, t) for t in block.keys]
        # one label per row or column where they fit, else every n-th
        self.query_every = math.ceil(self.line / self.cell)
        self.key_every = math.ceil((max(map(self.font.getlength, self.keys)) + 3) / self.cell)
        self.left = GRID_PAD + math.ceil(max(map(self.font.getlength, self.queries))) + 4
        self.row_h = self.line + self.map_h + self.line + GRID_GAP  # head title, map, keys
        self.n_layers, self.n_heads = n_layers, n_heads
        self.bar_x = self.left + n_heads * (self.map_w + GRID_GAP)
        self.width = self.bar_x + GRID_BAR + 4 + math.ceil(self.font.getlength("0.25")) + GRID_PAD
        self.height = n_layers * self.row_h + GRID_PAD

    def maps(self, top: int):
        """(layer row, head column, x, y) of each map's top-left corner."""
        for r in range(self.n_layers):
            for c in range(self.n_heads):
                yield r, c, self.left + c * (self.map_w + GRID_GAP), \
                    top + r * self.row_h + self.line

    def bar(self, top: int) -> tuple[int, int, int]:
        """The colour bar's x, y and height: beside the first layer's maps."""
        return self.bar_x, top + self.line, self.map_h

    def label(self, draw, block: MapBlock, top: int) -> None:
        """Head titles, query tokens left of the first column, key tokens under every map,
        and the colour bar's ticks."""
        for r, c, x, y in self.maps(top):
            draw.text((x, y - 2), f"layer {block.layers[r]} · head {block.heads[c]}",
                      fill="black", font=self.font, anchor="ld")
            for j in range(0, len(self.keys), self.key_every):
                draw.text((x + (j + 0.5) * self.cell, y + self.map_h + 2), self.keys[j],
                          fill="black", font=self.font, anchor="mt")
            for i in range(0, len(self.queries) * (c == 0), self.query_every):
                draw.text((x - 4, y + (i + 0.5) * self.cell), self.queries[i], fill="black",
                          font=self.font, anchor="rm")
        x, y, height = self.bar(top)
        for weight in (0.0, 0.1, 0.25, 0.5, 1.0):  # placed on the sqrt scale, as coloured
            draw.text((x + GRID_BAR + 4, y + (1 - weight ** GAMMA) * (height - 1)), f"{weight:g}",
                      fill="black", font=self.font, anchor="lm")


def font_path() -> str:
    """matplotlib's DejaVu Sans (the PNG figures' letters), found without importing it."""
    import importlib.util

    package = Path(importlib.util.find_spec("matplotlib").submodule_search_locations[0])
    return str(package / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf")


# --- symbols the font has no glyph for ---

@dataclass(frozen=True)
class Lettering:
    """How a picture writes its symbols: in FONT, then in `fallbacks` (installed font families
    that have glyphs FONT lacks); a character that none has, or a control character, is
    written as its code point."""

    fallbacks: tuple[str, ...] = ()
    by_code_point: frozenset[str] = field(default_factory=frozenset)

    def text(self, text: str) -> str:
        """`text` as drawn: `a한b` -> `a[U+D55C]b` where no font has `한` (line breaks kept)."""
        if not self.by_code_point:
            return text
        return "".join(f"[{code_point(ch)}]" if ch in self.by_code_point and ch != "\n" else ch
                       for ch in text)

    def token(self, token: str) -> str:
        """An axis label: `한` -> `U+D55C`; in a longer token, as in `text` (line breaks too)."""
        if len(token) == 1 and token in self.by_code_point:
            return code_point(token)
        return self.text(token).replace("\n", f"[{code_point(chr(10))}]")

    def block(self, block: MapBlock) -> MapBlock:
        """`block` with its tokens as drawn."""
        return replace(block, queries=list(map(self.token, block.queries)),
                       keys=list(map(self.token, block.keys)))

    def fonts(self):
        """While drawing a matplotlib figure: its fonts, FONT then the fallbacks, glyph by glyph."""
        if not self.fallbacks:
            return nullcontext()
        from matplotlib import rc_context

        return rc_context({"font.family": [FONT, *self.fallbacks]})

    def note(self) -> str | None:
        """One line for the user when some symbols are written as code points."""
        shown = sorted(self.by_code_point - {"\n"})
        if not shown:
            return None
        controls = sum(map(is_control, shown))
        reason = ("they are not printable (control or unassigned characters)"
                  if controls == len(shown) else "no installed font has a glyph for them"
                  if not controls else "no installed font has a glyph for them, or they are not "
                  "printable")
        more = ", …" if len(shown) > 3 else ""
        return (f"the picture labels {len(shown)} symbol{'s' * (len(shown) > 1)} by code point "
                f"({', '.join(map(code_point, shown[:3]))}{more}): {reason}")


def is_control(ch: str) -> bool:
    """A control, format, unassigned or private character: nothing a font should draw."""
    return unicodedata.category(ch)[0] == "C"


def code_point(ch: str) -> str:
    """`한` -> `U+D55C`."""
    return f"U+{ord(ch):04X}"


def lettering(texts: Iterable[str], has: dict[int, int] | None = None,
              fallbacks: tuple[str, ...] | None = None) -> Lettering:
    """The Lettering of `texts`: the glyphs of the font drawn in (`has`; default FONT's, as
    matplotlib draws it), and the installed families that have the rest (default: looked up
    when that font lacks one)."""
    chars = set("".join(texts))
    control = set(filter(is_control, chars))  # ESC, unassigned, …
    has = glyphs(font_file(FONT)) if has is None else has
    lacking = {ch for ch in chars - control if ord(ch) not in has}
    if fallbacks is None:
        fallbacks, lacking = fallback_fonts(lacking)
    return Lettering(tuple(fallbacks), frozenset(control | lacking))


def glyphs(path: str) -> dict[int, int]:
    """The code points a font file has a glyph for (its character map)."""
    from matplotlib.ft2font import FT2Font

    return FT2Font(path).get_charmap()


def font_file(family: str) -> str:
    """The file matplotlib draws `family` from (regular weight)."""
    from matplotlib.font_manager import FontProperties, findfont

    return findfont(FontProperties(family=family), fallback_to_default=False)


def fallback_fonts(chars: set[str]) -> tuple[list[str], set[str]]:
    """Installed families that have glyphs for some of `chars` (each adding some), and the
    characters none has. Only asked when FONT lacks one: it reads the families' maps."""
    from matplotlib.font_manager import fontManager

    found: list[str] = []
    # Only families with a regular face: for another, matplotlib logs a complaint per figure.
    regular = {font.name: font.fname for font in reversed(fontManager.ttflist)
               if font.style == "normal" and font.weight in (400, "normal", "regular")}
    for name, path in sorted(regular.items()):
        if not chars:
            break
        if name == FONT or name.startswith("Last Resort"):  # its "glyphs" are placeholder boxes
            continue
        try:
            has = glyphs(path)
        except (OSError, RuntimeError, ValueError):  # a broken or vanished font file
            continue
        covered = {ch for ch in chars if ord(ch) in has}
        if covered:
            found.append(name)
            chars = chars - covered
    return found, chars


# --- terminal (the heatmaps are drawn by app/tables.py) ---

def level(weight: float) -> int:
    """Palette index of an attention weight, on the figures' scale (colour ∝ weight**GAMMA)."""
    if not np.isfinite(weight):  # a diverged model's NaN: the blank end of the scale
        return 0
    return min(int(max(weight, 0.0) ** GAMMA * len(PALETTE)), len(PALETTE) - 1)
