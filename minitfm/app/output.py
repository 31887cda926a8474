"""How `minitfm` prints: stdout and stderr (`console`, `err_console`: on a terminal text wraps
at word boundaries; piped, nothing is wrapped, so lines stay whole), one line per message
(`fail`, `warn`, `note`, `say`), tables (`show`), the files written (`wrote`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console, ConsoleDimensions
from rich.table import Table

from minitfm.app.text import heading_lines, printable
from minitfm.errors import shown_path

PIPED_WIDTH = 10_000  # piped output has no width to wrap to: this keeps every line whole
MAX_ERROR_CHARS = 500  # one line, however long the user's input was
# How messages name `train`'s options here (see `errors.option`): as this command line's.
CLI_OPTIONS = {"resume": "--resume", "resume_of": "--resume {}", "run_dir": "--run-dir",
               "overwrite": "--overwrite", "again": "minitfm train --resume {}",
               "book": "--book {}", "mode": "--mode", "samples": "--samples",
               "min_len": "--min-len", "max_len": "--max-len"}


class Output(Console):
    """stdout: on a terminal, text wraps at word boundaries to its width; piped to a file or a
    program, nothing is wrapped and tables take their natural width, so lines stay whole."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(PIPED_WIDTH, size.height)


console = Output()
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str | list[str], code: int = 2, kind: str = "error"):
    """Print one clean line on stderr (`error: ...`, or `interrupted: ...` when the user
    stopped the command), one per problem given a list of them, and exit with `code`."""
    for text in [message] if isinstance(message, str) else message:
        line = printable(text)
        if len(line) > MAX_ERROR_CHARS:
            line = line[:MAX_ERROR_CHARS - 1] + "…"
        err_console.print(f"{kind}: {line}", markup=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print one `warning: ...` line on stderr; the command goes on."""
    err_console.print(f"warning: {printable(message)}", markup=False)


def note(message: str) -> None:
    """Print one `note: ...` line on stderr."""
    err_console.print(f"note: {printable(message)}", markup=False)


def show(renderable) -> None:
    """Print to stdout; a table's title and caption go on lines of their own, where they wrap
    like any text (at a terminal's width, never when piped), not to the table's width. They
    may hold paths: control characters come out escaped."""
    if not isinstance(renderable, Table):
        console.print(renderable)
        return
    title, caption = renderable.title, renderable.caption
    renderable.title = renderable.caption = None
    for line in heading_lines(printable(str(title or "")), console.width):
        console.print(line, style="table.title", markup=False, highlight=False)
    console.print(renderable)
    if caption:
        console.print(printable(str(caption)), style="table.caption", markup=False,
                      highlight=False)


def say(text: str) -> None:
    """One line on stdout as written (no markup); it may name paths: control characters come
    out escaped."""
    console.print(printable(text), markup=False, highlight=False)


def wrote(path: Path, stream: Console = console, size: int | None = None) -> None:
    """`wrote PATH` on `stream` (`shown_path`: relative inside the current folder, else
    absolute), and `(N kB)` given its `size` in bytes: a path never cut in two, its control and
    format characters escaped."""
    kb = "" if size is None else f" ({size / 1000:,.0f} kB)"
    stream.print(f"wrote {printable(shown_path(path))}{kb}", markup=False, highlight=False,
                 soft_wrap=True)


def widest(renderable) -> int:
    """The cells the widest line of `renderable` takes (of a Columns: of its widest item)."""
    parts = getattr(renderable, "renderables", [renderable])
    unbounded = console.options.update_width(PIPED_WIDTH)  # measures are capped at the width
    return max((console.measure(part, options=unbounded).maximum for part in parts), default=0)
