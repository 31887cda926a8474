"""Text from users and files, made safe for the terminal: never a character that drives or
reorders it (`printable`); a shell word to paste (`shell_quote`); a title broken at its
separators (`heading_lines`)."""

from __future__ import annotations

import shlex
import unicodedata

from minitfm.run.files import name_text

# Unicode categories never printed raw: control characters (Cc: ESC, newline, ...), format
# characters (Cf: bidi overrides such as U+202E, zero-width ones) and the line and paragraph
# separators (Zl, Zp). Each is written as Python's repr writes it: \x1b, \n, \u202e.
UNPRINTED = ("Cc", "Cf", "Zl", "Zp")


def unprinted(ch: str) -> bool:
    """Whether `ch` is escaped before it reaches a terminal (see UNPRINTED)."""
    return unicodedata.category(ch) in UNPRINTED


def printable(text: str) -> str:
    """`text` with the UNPRINTED characters escaped, so that a file name or a model's output can
    neither drive the terminal, nor break a line, nor show reordered; the bytes of a name that
    are not UTF-8 as `\\xe9` (`files.name_text`), which any terminal can show."""
    return "".join(repr(ch)[1:-1] if unprinted(ch) else ch for ch in name_text(text))


def shell_quote(text: str) -> str:
    """`text` as one shell word to paste: shlex's quoting, or bash's `$'...'` with escapes
    when it holds UNPRINTED characters (shlex would leave them raw inside its quotes)."""
    if printable(text) == text:
        return shlex.quote(text)
    return "$'" + "".join(map(ansi_c, text)) + "'"


def ansi_c(ch: str) -> str:
    """One character inside bash's `$'...'`: UNPRINTED ones, `\\` and `'` escaped."""
    if ch in "\\'":
        return "\\" + ch
    if unprinted(ch):  # bash reads \xHH, \uHHHH and \UHHHHHHHH
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code < 0x10000 \
            else f"\\U{code:08x}"
    return name_text(ch)  # a byte that is not UTF-8: `\\xe9` makes it again


def heading_lines(title: str, width: int) -> list[str]:
    """`a · b · c` broken at its ` · ` separators into lines of at most `width` where it can:
    `matmul peak 60.9 GFLOP/s` stays in one piece."""
    lines: list[str] = []
    for item in filter(None, title.split(" · ")):
        if lines and len(lines[-1]) + 3 + len(item) <= width:
            lines[-1] += " · " + item
        else:
            lines.append(item)
    return lines
