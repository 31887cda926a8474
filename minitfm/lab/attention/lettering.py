"""Letters in pictures: every PNG figure and Pillow picture writes in DejaVu Sans (`FONT`,
matplotlib's own font); a symbol it has no glyph for (Korean, say) is drawn from another
installed font that has one, else written as its code point (U+D55C), as is a control
character (`Lettering`): never an empty box, never a warning per glyph.

matplotlib is imported inside functions, so `minitfm --help` does not pay for it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from minitfm.lab.attention.probe import MapBlock

FONT = "DejaVu Sans"  # matplotlib's own font, and MapGrid's (`font_path`)
# What minitfm's own pictures write besides the tokens: printable ASCII and these, all of them
# in DejaVu Sans (a test checks).
FONT_HAS = frozenset(map(chr, range(0x20, 0x7F))) | frozenset("\n·→∝√✓✗")


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


def font_path() -> str:
    """matplotlib's DejaVu Sans (the PNG figures' letters), found without importing it."""
    import importlib.util

    package = Path(importlib.util.find_spec("matplotlib").submodule_search_locations[0])
    return str(package / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf")
