"""The parameters several commands share (RUN, --checkpoint, --threads, --book, --json,
--force); those a command states in its options class (`option`, from `lab/options.py`), and
that class built from the command's parameters by name (`options_from`)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import typer
from rich.markup import escape

from minitfm.lab.options import option_field

RUN_HELP = "Run directory or checkpoint file; default: the most recent run under ./runs."
BOOK_HELP = ("A workbook of minitfm learn: the model runs its functions where written, the "
             "book's elsewhere (a run trained with one runs the book's code unless asked).")
CHECKPOINT_HELP = ("Which checkpoint of the run: best (highest exact match; last.pt while the "
                   "run has none) or last.")
THREADS_HELP = ("CPU threads: auto (the fastest alone, shared with other minitfm processes) "
                "or a fixed count N.")


def option(options: type, name: str):
    """The typer.Option of the field `name` of a command's options (`lab/options.py`), where
    its default, bounds and help are stated: plain text, which the help shows as written (its
    `[ray]` escaped, which Rich would read as a style and drop)."""
    spec = option_field(options, name)
    meta, cli = spec.metadata, spec.metadata["cli"]
    return typer.Option(spec.default, *cli.get("flags", ()), min=meta["low"], max=meta["high"],
                        metavar=cli.get("metavar"), help=escape(meta["help"]))


def run_argument():
    """RUN: a run directory or a checkpoint file (see `lab.loaded.load`)."""
    return typer.Argument(None, metavar="[RUN]", help=RUN_HELP)


def checkpoint_option():
    """--checkpoint best|last."""
    return typer.Option("best", metavar="best|last", help=CHECKPOINT_HELP)


def threads_option():
    """--threads auto|N (see `claimed_threads`)."""
    return typer.Option("auto", metavar="auto|N", help=THREADS_HELP)


def book_option():
    """--book DIR: run a learner's workbook (minitfm learn) instead of the run's code."""
    return typer.Option(None, "--book", metavar="DIR", help=BOOK_HELP)


def json_option(help_text: str):
    """--json: what the command prints instead of its tables."""
    return typer.Option(False, "--json", help=help_text)


def force_option(replaced: str, what: str = "picture"):
    """--force: replace the file `replaced` names even if it is not a `what` (picture, page)
    that minitfm wrote (the picture rule, `lab/pictures.py`)."""
    return typer.Option(False, "--force", help=f"Replace {replaced} even if it is not a {what} "
                                                f"minitfm wrote.")


def options_from(options: type, given: dict[str, Any]):
    """The options class `options` (`lab/options.py`) built from a command's parameters
    (`given`: its `locals()`) by field name, never by position: the parameters are the fields,
    declared once by `option`."""
    return options(**{spec.name: given[spec.name] for spec in fields(options)})
