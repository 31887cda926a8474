"""`minitfm runs`: the runs under a folder, a row each (`runs_table`), or as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import note, say, show
from minitfm.app.parameters import json_option
from minitfm.app.text import printable
from minitfm.errors import shown_path
from minitfm.run.files import to_json


@clean_errors(uses_torch=False)
def runs_command(
    folder: Path = typer.Argument(Path("runs"), metavar="[DIR]",
                                  help="A folder of runs (and sweep folders), or a sweep folder."),
    as_json: bool = json_option("Print a JSON list instead of a table."),
) -> None:
    """List the runs: task, changes from the defaults, steps, best exact match, status."""
    from minitfm.lab.many.runs import list_runs

    rows = list_runs(folder)
    for row in rows:  # a damaged run is listed, and this says why
        if "note" in row:
            damaged = " is unreadable" if row["status"] == "unreadable" else ""
            note(f"run '{row['name']}'{damaged}: {row['note']}")
    if as_json:
        print(to_json(rows, default=str))  # a hand-edited config may hold dates
    elif rows:
        show(runs_table(rows, f"runs under {shown_path(folder)}"))
    else:
        say(f"no runs under {shown_path(folder)}")


def runs_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The rows of `runs.list_runs`: a run's name with its changes, task, steps, best, status.
    Every cell is text as read from the run's files, control characters escaped."""
    # No vertical lines, and each run's changes under its name: the columns fit 80 cells.
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in ("run: changes from the defaults", "task", "steps", "best exact match",
                   "wall s", "status"):
        # folded, never cut: a change shown as "model.positiona…" says nothing
        table.add_column(column, justify="right" if column in ("steps", "wall s") else "left",
                         overflow="fold", no_wrap=column in ("steps", "wall s", "status"),
                         max_width=10 if column == "best exact match" else None)
    for row in rows:
        best = row["best_exact_match"]
        changes = "".join(f"\n  {printable(f'{key}={value}')}"
                          for key, value in row["changes"].items()
                          if key != "task.name")  # the task has its own column
        table.add_row(Text(printable(row["name"]), style="bold") + Text(changes),
                      Text("?" if row["task"] is None else printable(str(row["task"]))),
                      str(row["step"]), "-" if best is None else f"{best:.1%}",
                      "-" if row["wall_s"] is None else f"{row['wall_s']:.1f}", row["status"])
    return table
