"""`minitfm stack`: what `minitfm sweep` runs for a stack of its runs (hidden from the help: a
sweep's building block, as `minitfm eval --json` is its evaluations'; see docs/operations.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads
from minitfm.app.output import fail, say, warn
from minitfm.app.parameters import option
from minitfm.lab.options import SweepOptions


@clean_errors
def stack(
    folder: Path = typer.Argument(..., metavar="SWEEP", help="The sweep folder."),
    ids: list[str] = typer.Argument(..., metavar="RUN...", help="Runs of the sweep (their "
                                    "folder names) that share a model shape."),
    threads: int = typer.Option(1, "--threads", min=1, help="CPU threads."),
    eval_samples: int = option(SweepOptions, "eval_samples"),
    eval_lengths: list[str] | None = option(SweepOptions, "eval_lengths"),
) -> None:
    """Train runs of a sweep as one stacked model, then evaluate each as the sweep does."""
    from minitfm.app.api import instruments
    from minitfm.lab.many.grid import parse_lengths
    from minitfm.lab.many.stacking import run_stack_job, stack_members

    ranges = [parse_lengths(text) for text in eval_lengths or ()]
    specs = stack_members(folder, ids, threads)
    with claimed_threads(str(threads)) as claim:
        failed = run_stack_job(specs, eval_samples, ranges, lambda: instruments(warn=warn), say,
                               claim)
    if failed:
        fail(f"{len(failed)} of {len(specs)} runs of the stack failed ({', '.join(failed)}): "
             f"see their summary.json", 1)
