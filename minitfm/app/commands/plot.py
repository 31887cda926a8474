"""`minitfm plot`: loss and exact match against step, or any metric (`--metric`), several runs
overlaid, or a grokking run's three phases (`--phases`), as a PNG."""

from __future__ import annotations

from pathlib import Path

import typer

from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import note, say, wrote
from minitfm.app.parameters import force_option
from minitfm.errors import MinitfmError


@clean_errors
def plot(
    runs: list[Path] | None = typer.Argument(
        None, metavar="[RUN]...", help="Run directories (or checkpoints in them) to overlay; "
        "default: the most recent run under ./runs."),
    metric: list[str] | None = typer.Option(
        None, "--metric", metavar="KEY", help="A number of the runs' metrics.jsonl to draw "
        "instead, a panel each (repeatable): a record key (align, token_accuracy, "
        "restricted_loss, ...: a panel per split that has it) or SPLIT/KEY (gauges/loss, "
        "eval/exact_match)."),
    phases: bool = typer.Option(False, "--phases", help="Grokking's three phases of one "
                                "modadd run, from its gauges (default --out: phases.png in "
                                "the run directory)."),
    out: Path | None = typer.Option(None, help="PNG path (default: plot.png in the run "
                                    "directory; for several runs, in the folder holding the "
                                    "first, e.g. runs/plot.png)."),
    force: bool = force_option("--out"),
) -> None:
    """Plot loss and exact match (or any metric) against step, several runs overlaid, or a
    grokking run's phases (no TensorBoard needed)."""
    from minitfm.lab.many.plots import plot_phases, plot_runs
    from minitfm.lab.watch.phases import describe_phases

    notes: list[str] = []
    if phases:
        if metric or len(runs or []) > 1:
            raise MinitfmError("--phases draws one run's own panels: give one RUN, without "
                               "--metric")
        path, found = plot_phases(runs[0] if runs else None, out, force, notes)
    else:
        path = plot_runs(runs or [], out, force, notes, metric)
    for line in notes:
        note(line)
    if phases:
        say(f"phases: {describe_phases(found['phases'])}")
    wrote(path)
