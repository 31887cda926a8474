"""What every minitfm picture shares: one rule for writing a picture file, titles wrapped to the
figure's width, and one palette.

The rule, for every picture (plot, eval --plot, visualize-attention's PNG, its --over-training
strip and GIF, ablate's PNG, the sweep's results.png) and for the explorer's page: its name has
the right suffix, its folder can take it (checked before anything is drawn), and an existing
file is replaced only if minitfm wrote it (a PNG's `Software` text, a GIF's comment, say
"minitfm"; a page's head, `PAGE_MARK`) or the user passes --force. A failed write names the
file, exits 2 and leaves the old file whole.

The palette: lines of several runs or configurations in colour-blind-safe colours
(`LINE_COLOURS`, `line_style`); attention weights in viridis on a square-root scale (`PALETTE`,
`GAMMA`), the same in the PNG figures, TensorBoard's pictures (`colours`), the terminal's
heatmaps (`level`) and the explorer's page.

matplotlib, Pillow and numpy are imported inside functions (`minitfm sweep` and `plot` read
this module), and nothing here needs torch.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minitfm.errors import MinitfmError
from minitfm.run.files import name_text, write_atomic

if TYPE_CHECKING:
    import numpy as np

SOFTWARE = "minitfm"  # a PNG's `Software` text and a GIF's comment: minitfm wrote it
PAGE_MARK = '<meta name="generator" content="minitfm">'  # in the head of an explorer page
PAGE_TITLE = "<title>minitfm explorer</title>"  # the head of a page written before the mark
PAGE_SUFFIXES = (".html", ".htm")
PREFERRED_BREAKS = (" → ", " (")  # where a title too wide for one line breaks first

# Lines of several runs: colour-blind-safe colours (Okabe & Ito's blue, vermillion, green,
# reddish purple and black, Tol's wine), each at least 3:1 against white (no light blue or
# yellow); past six, the same colours again with another dash and marker.
LINE_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#882255")
LINE_DASHES, LINE_MARKERS = ("-", "--", ":", "-."), ("o", "s", "^", "D")
FEW_POINTS = 5  # a curve of this many points or fewer is drawn as points (`points_or_line`)

GAMMA = 0.5  # colour ∝ weight**GAMMA: diffuse rows (~1/S each) stay visible next to sharp ones
PALETTE = ("#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c",  # viridis, dark to light
           "#28ae80", "#5ec962", "#addc30", "#fde725")


# --- titles ---

def wrap_to_width(text: str, width: float, size: float,
                  prefer: tuple[str, ...] = PREFERRED_BREAKS) -> str:
    """`text` broken into lines no wider than `width` inches at `size` points, measured with
    the Agg renderer that draws it: a line too wide breaks first before each of `prefer` (a
    title's " → " and " ("; none for prose), then at spaces (a word too long alone,
    anywhere)."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    renderer, font = RendererAgg(1, 1, 72), FontProperties(size=size)  # 72 dpi: 1 px = 1 pt
    text = name_text(text)  # a path that is not UTF-8: measured as it will be drawn

    def fits(line: str) -> bool:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0] <= width * 72

    lines = []
    for line in text.split("\n"):
        if not fits(line):
            for mark in prefer:
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


# --- the picture rule ---

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


def is_minitfm_page(path: Path) -> bool:
    """Whether `path` is an HTML file that minitfm wrote (its head holds PAGE_MARK, or the
    title of the explorer pages written before it)."""
    if not path.is_file():  # a FIFO would block the read
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return PAGE_MARK.encode() in head or PAGE_TITLE.encode() in head


def check_picture_path(path: Path, option: str, suffix: str | tuple[str, ...] = ".png") -> None:
    """`option` names a file with `suffix` (.png, .gif; or one of several, the first named), not
    a directory, in a folder that exists or can be made, and can be written to."""
    suffixes = (suffix,) if isinstance(suffix, str) else suffix
    if path.suffix.lower() not in suffixes:
        raise MinitfmError(f"{option} ('{path}') must be a {suffixes[0]} file")
    if path.is_dir():
        raise MinitfmError(f"{option} ('{path}') is a directory: give a {suffixes[0]} file "
                           f"in it")
    folder = next(folder for folder in path.absolute().parents if folder.exists())
    if not folder.is_dir():
        raise MinitfmError(f"cannot write '{path}' ('{folder}' is a file, not a folder): "
                           f"choose another {option}")
    if not os.access(folder, os.W_OK):  # a read-only file system too, even for root
        raise MinitfmError(f"cannot write '{path}' (its folder '{folder}' is read-only): "
                           f"choose another {option}")


def check_output(path: Path, option: str, force: bool,
                 suffix: str | tuple[str, ...] = ".png") -> None:
    """The picture rule (module docstring): `option`'s path may be written, and an existing
    file is minitfm's picture (or page, for an .html path), or `force`."""
    check_picture_path(path, option, suffix)
    page = path.suffix.lower() in PAGE_SUFFIXES
    ours, what = (is_minitfm_page, "page") if page else (is_minitfm_picture, "picture")
    if path.exists() and not force and not ours(path):
        raise MinitfmError(f"{option} ('{path}') exists and is not a {what} minitfm wrote: "
                           f"choose another {option}, or pass --force to replace it")


def save_png(fig, path: Path, option: str = "--out", force: bool = False) -> None:
    """Write `fig` as a PNG marked as minitfm's, by the picture rule (`check_output`). Its
    texts (titles, labels, legends) come from run and file names too: the bytes of a name that
    are not UTF-8, which no font can draw, are written `\\xe9` (`files.name_text`)."""
    from matplotlib.text import Text

    check_output(path, option, force)
    for text in fig.findobj(Text):
        text.set_text(name_text(text.get_text()))
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


# --- the palette ---

def line_style(i: int) -> dict[str, Any]:
    """matplotlib's keywords for the line of the `i`-th run or configuration (see LINE_COLOURS):
    24 lines told apart by colour, dash and marker."""
    n = len(LINE_COLOURS)
    return {"color": LINE_COLOURS[i % n], "linestyle": LINE_DASHES[i // n % len(LINE_DASHES)],
            "marker": LINE_MARKERS[i // n % len(LINE_MARKERS)], "markersize": 3}


def points_or_line(style: dict[str, Any], count: int) -> dict[str, Any]:
    """`style` (`line_style`'s) for a curve of `count` points: up to FEW_POINTS, its markers
    alone, larger (three evaluations joined by straight lines draw a course nobody measured);
    more, as it is."""
    if count > FEW_POINTS:
        return style
    return {**style, "linestyle": "none", "markersize": 5}


def colours(weights: np.ndarray) -> np.ndarray:
    """(...,) attention weights -> (..., 3) uint8 viridis, on the figures' scale (colour ∝
    weight**GAMMA), from the palette's 9 stops."""
    import numpy as np

    stops = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in PALETTE])  # (9, 3)
    scaled = np.clip(np.nan_to_num(weights), 0.0, 1.0) ** GAMMA
    position = np.linspace(0.0, 1.0, len(PALETTE))
    rgb = [np.interp(scaled, position, stops[:, i]) for i in range(3)]
    return np.stack(rgb, axis=-1).round().astype(np.uint8)


def level(weight: float) -> int:
    """Palette index of an attention weight, on the figures' scale (colour ∝ weight**GAMMA): the
    terminal's heatmaps (drawn by app/commands/visualize_attention.py)."""
    if not math.isfinite(weight):  # a diverged model's NaN: the blank end of the scale
        return 0
    return min(int(max(weight, 0.0) ** GAMMA * len(PALETTE)), len(PALETTE) - 1)
