"""What a command that runs a model does first: claim its threads (`claimed_threads`), load
the run (`loaded_run`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from minitfm.app.output import CLI_OPTIONS, note, warn
from minitfm.errors import MinitfmError, spell

if TYPE_CHECKING:
    from minitfm.lab.loaded import Loaded
    from minitfm.run.threads import ThreadClaim


@contextmanager
def claimed_threads(threads: str) -> Iterator[ThreadClaim]:
    """This process's threads for `--threads` while the block runs: registered with the other
    minitfm processes (see minitfm.run.threads), then given to torch; released at its end."""
    from minitfm.config import parse_threads
    from minitfm.run.threads import ThreadClaim

    try:
        claim = ThreadClaim(parse_threads(threads), warn=warn)
    except ValueError as err:
        raise MinitfmError(f"--{err}") from None
    with claim:
        claim.apply()
        yield claim


def loaded_run(run: Path | None, which: str, book: Path | None = None) -> Loaded:
    """The checkpoint RUN and --checkpoint mean, loaded (`lab.loaded.load`), running the
    workbook --book names if given; a fallback from best.pt to last.pt, and a workbook's run
    loaded with the book's code, are notes on stderr."""
    from minitfm.lab.loaded import load

    loaded = load(run, which, book=book)
    for text in (loaded.note, loaded.code_note):
        if text:
            note(spell(text, CLI_OPTIONS))
    return loaded
