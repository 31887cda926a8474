"""`minitfm plot`: loss and exact match against step, several runs overlaid, as a PNG."""

from __future__ import annotations

from pathlib import Path

import typer

from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import note, wrote
from minitfm.app.parameters import force_option


@clean_errors
def plot(
    runs: list[Path] | None = typer.Argument(
        None, metavar="[RUN]...", help="Run directories (or checkpoints in them) to overlay; "
        "default: the most recent run under ./runs."),
    out: Path | None = typer.Option(None, help="PNG path (default: plot.png in the run "
                                    "directory; for several runs, in the folder holding the "
                                    "first, e.g. runs/plot.png)."),
    force: bool = force_option("--out"),
) -> None:
    """Plot loss and exact match against step, several runs overlaid (no TensorBoard needed)."""
    from minitfm.lab.many.plots import plot_runs

    notes: list[str] = []
    path = plot_runs(runs or [], out, force, notes)
    for line in notes:
        note(line)
    wrote(path)
