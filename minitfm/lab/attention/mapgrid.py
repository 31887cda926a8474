"""TensorBoard's pictures and the frames of the --over-training GIF: one kind's maps of a probe
as RGB pictures drawn with numpy and Pillow (`MapGrid`), milliseconds each instead of the second
a matplotlib figure takes, so that a run can draw one at every evaluation.

Rows are layers, columns heads, tokens on the axes (`<bos>`, `<eos>`, `<pad>` as `^`, `$`, `_`),
a colour bar on the figures' scale (`pictures.colours`), a title. Pillow is imported inside
functions.

Shapes: L layers, H n_heads, T_q and T_k query and key len.
"""

from __future__ import annotations

import math

import numpy as np

from minitfm.lab.attention.lettering import FONT_HAS, Lettering, font_path, glyphs, lettering
from minitfm.lab.attention.probe import MapBlock
from minitfm.lab.pictures import GAMMA, colours, wrap_words

SHORT_TOKENS = {"<bos>": "^", "<eos>": "$", "<pad>": "_"}  # column labels are 2 cells wide
GRID_MAP_PIXELS = 256  # a map's longer side, at most (cells <= 16 px); TensorBoard's: tb.py
GRID_PAD, GRID_GAP, GRID_BAR = 8, 12, 12  # pixels: the border, between maps, the bar's width


class MapGrid:
    """One kind's maps of a fixed probe as RGB pictures, drawn with numpy and Pillow: rows
    layers, columns heads, tokens on the axes, a colour bar, a title. Labels and title are
    drawn once; a frame pastes the maps and writes its caption. Milliseconds, where a
    matplotlib figure takes about a second: TensorBoard gets one at every evaluation."""

    def __init__(self, block: MapBlock, header: str, longest_caption: str, size: int = 11,
                 map_pixels: int = GRID_MAP_PIXELS, captions: Captions | None = None):
        from PIL import Image, ImageDraw, ImageFont

        # Pillow draws with one font: what it lacks is written as its code point
        self.glyphs: dict[int, int] | None = None  # its character map, read when needed
        letters = self.lettering([header, *block.queries, *block.keys])
        block, header = letters.block(block), letters.text(header)
        self.font = ImageFont.truetype(font_path(), size)
        self.title_font = ImageFont.truetype(font_path(), size + 2)
        self.layout = GridLayout(self.font, self.title_font, block, map_pixels)
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
        self.captions = captions or Captions()  # see `caption_band`
        # what a caption is drawn on and where: the rows above the maps, in the title's font
        above = self.background[:self.top]
        self.above = (size, self.caption_y, above.shape, above.tobytes())

    def frame(self, block: MapBlock, caption: str) -> np.ndarray:
        """The picture of the block's weights (L, H, T_q, T_k) with `caption`: RGB
        (height, width, 3) uint8."""
        canvas, cell = self.background.copy(), self.layout.cell
        for r, c, x, y in self.layout.maps(self.top):
            cells = colours(block.weights[r, c])  # (T_q, T_k, 3)
            canvas[y:y + self.layout.map_h, x:x + self.layout.map_w] = \
                cells.repeat(cell, axis=0).repeat(cell, axis=1)
        lines, first, band = self.caption_band(caption)
        if first + len(band) <= self.top:  # above the maps: the band drawn once per caption
            canvas[first:first + len(band)] = band
            return canvas
        from PIL import Image, ImageDraw  # longer than the longest planned for: over the maps

        image = Image.fromarray(canvas)
        self.write(ImageDraw.Draw(image), lines, self.caption_y)
        return np.asarray(image)

    def caption_band(self, caption: str) -> tuple[list[str], int, np.ndarray]:
        """`caption`'s lines and the rows of the background they cover, drawn: (the lines, the
        first row, the rows (n, width, 3)). Drawn on those rows of the background, the text
        blends with the pixels under it as it would on the whole picture, so the frame is the
        same. Kept (`Captions`) for the next frame with that caption on the same rows."""
        return self.captions.get(caption, self.above, lambda: self.draw_caption(caption))

    def draw_caption(self, caption: str) -> tuple[list[str], int, np.ndarray]:
        """`caption_band`, drawn."""
        from PIL import Image, ImageDraw

        lines = self.wrap(self.lettering([caption]).text(caption))  # the model's output
        tops, bottoms = [], []
        for i, line in enumerate(lines):  # never none: wrap gives a line at least
            y = self.caption_y + i * self.layout.title_line  # where `write` draws it
            _, top, _, bottom = self.title_font.getbbox(line)
            tops.append(y + top)
            bottoms.append(y + bottom)
        first = max(0, min(tops) - 2)  # 2 rows more each side, for the glyphs' soft edges
        end = min(len(self.background), max(bottoms) + 2)
        image = Image.fromarray(self.background[first:end])
        self.write(ImageDraw.Draw(image), lines, self.caption_y - first)
        return lines, first, np.asarray(image)

    def lettering(self, texts: list[str]) -> Lettering:
        """How `texts` are drawn (see `lettering`). Text of FONT_HAS needs no look at the font's
        character map, which costs importing matplotlib in the first picture of a run."""
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
        """Draw `lines` from `y` down, in the title's font."""
        for i, line in enumerate(lines):
            draw.text((GRID_PAD, y + i * self.layout.title_line), line, fill="black",
                      font=self.title_font)


class Captions:
    """The latest caption, drawn, by what it was drawn on (`MapGrid.above`): the pictures of
    one snapshot all have its caption, and TensorBoard's pictures of one kind of attention
    (one per head) the same rows above their maps, so a snapshot draws it once per kind."""

    def __init__(self) -> None:
        self.caption: str | None = None
        self.drawn: dict = {}  # MapGrid.above -> MapGrid.caption_band

    def get(self, caption: str, above, draw):
        """The band of `caption` on `above`, drawn by `draw()` the first time."""
        if caption != self.caption:  # a new snapshot: the last one's are done with
            self.caption, self.drawn = caption, {}
        if above not in self.drawn:
            self.drawn[above] = draw()
        return self.drawn[above]


class GridLayout:
    """Where `MapGrid` puts each map, label and the colour bar, in pixels."""

    def __init__(self, font, title_font, block: MapBlock, map_pixels: int = GRID_MAP_PIXELS):
        n_layers, n_heads, n_queries, n_keys = block.weights.shape
        self.font, self.line = font, font.size + 4
        self.title_line = title_font.size + 4
        self.cell = max(4, min(16, map_pixels // max(n_queries, n_keys)))
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
