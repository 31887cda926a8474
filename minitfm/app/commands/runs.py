"""`minitfm runs`: the runs under a folder, a row each (`runs_table`), or as JSON; those with
given settings (`--where`), or a row per value of some keys with its figures (`--group-by`,
`groups_table`). Both tables fit an 80-column terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from minitfm.app.commands.sweep import plus_minus, rate_cell
from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import note, say, show
from minitfm.app.parameters import json_option, option
from minitfm.app.text import printable
from minitfm.errors import shown_path
from minitfm.lab.options import RunsOptions
from minitfm.run.files import to_json

RUN_WIDTH = 38  # the run column's: a longer name or list of changes wraps in it (80 in all)
GROUP_CAPTION = "mean ± half its 95% interval (t; Wilson at target); a miss: all its steps"


@clean_errors(uses_torch=False)
def runs_command(
    folder: Path = typer.Argument(Path("runs"), metavar="[DIR]",
                                  help="A folder of runs (and sweep folders), or a sweep folder."),
    where: list[str] | None = option(RunsOptions, "where"),
    group_by: list[str] | None = option(RunsOptions, "group_by"),
    as_json: bool = json_option("Print a JSON list instead of a table."),
) -> None:
    """List the runs: task, changes from the defaults, steps, best exact match, status; those
    with given settings (--where), or a row of figures per value of some keys (--group-by)."""
    from minitfm.lab.many import query
    from minitfm.lab.many.runs import describe_run, list_runs

    if not (where or group_by):
        print_runs(list_runs(folder), folder, title(folder, where), as_json)
        return
    records, conditions = query.load_records(folder), query.parse_where(where or [])
    query.check_keys(records, group_by or [], folder, "--group-by")
    chosen = query.select(records, conditions, folder)
    if not (group_by and chosen):
        rows = [describe_run(Path(record["run_dir"]), folder) for record in chosen]
        print_runs(rows, folder, title(folder, where), as_json,
                   query.unmatched(records, conditions))
        return
    for record in chosen:  # a damaged run counts in its group's runs, not in its n
        if "note" in record:
            note(f"run '{record['run']}' is {record['status']}: {record['note']}")
    groups = query.group_rows(chosen, group_by)
    if as_json:
        print(to_json(groups, default=str))
    else:
        count = f"{len(chosen)} run{'' if len(chosen) == 1 else 's'}"
        show(groups_table(groups, group_by, f"{title(folder, where)}, by "
                                            f"{', '.join(group_by)} ({count})"))


def print_runs(rows: list[dict[str, Any]], folder: Path, heading: str, as_json: bool,
               why: str = "") -> None:
    """The rows of `runs.list_runs` as a table (`runs_table`) or JSON, a note for each damaged
    run; `no runs ...` and `why` when there are none."""
    from minitfm.lab.many.runs import SWEEP_FILE

    for row in rows:  # a damaged run is listed, and this says why
        if "note" in row:
            damaged = " is unreadable" if row["status"] == "unreadable" else ""
            note(f"run '{row['name']}'{damaged}: {row['note']}")
    if as_json:
        print(to_json(rows, default=str))  # a hand-edited config may hold dates
    elif rows:
        show(runs_table(rows, heading, folder.name if (folder / SWEEP_FILE).is_file() else ""))
    else:
        say(f"no {heading}{why}")


def title(folder: Path, where: list[str] | None) -> str:
    """`runs under runs`, `runs under runs where train.lr=0.005`."""
    return f"runs under {shown_path(folder)}" + (f" where {', '.join(where)}" if where else "")


def runs_table(rows: list[dict[str, Any]], title: str, sweep: str = "") -> Table:
    """The rows of `runs.list_runs`: a run's name and, below it, its task and changes from the
    defaults (short names: `lr=0.005, positional=rope`); steps, best exact match, wall time,
    status. A sweep's runs come under its folder's name (`sweep`: that of the sweep listed,
    whose runs the rows are), with its task and the changes they all share; each run says the
    others. Every cell is text as read from the run's files, control characters escaped; a
    long one folds in its column, never cut (`model.positiona…` would say nothing)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("run: task, changes", overflow="fold", max_width=RUN_WIDTH)
    for column in ("steps", "best", "wall s"):
        table.add_column(column, justify="right", no_wrap=True, overflow="fold")
    table.add_column("status", overflow="fold", max_width=11)  # `stopped at` over `target`
    for folder, runs in by_sweep(rows, sweep):
        shared: dict[str, Any] = {}
        tasks = {task_of(row) for row in runs}
        said_above = bool(folder) and len(tasks) == 1  # the sweep's task, on its heading
        if folder:
            shared = {key: value for key, value in runs[0]["changes"].items()
                      if all(row["changes"].get(key, object()) == value for row in runs)}
            table.add_row(described(f"{folder}/", 0, changes_line(
                shared, tasks.pop() if said_above else None)))
        for row in runs:
            best, wall_s = row["best_exact_match"], row["wall_s"]
            left = {key: value for key, value in row["changes"].items() if key not in shared}
            name = row["name"].rpartition("/")[2] if folder else row["name"]
            table.add_row(described(name, 2 if folder else 0,
                                    changes_line(left, None if said_above else task_of(row))),
                          str(row["step"]), "-" if best is None else f"{best:.1%}",
                          "-" if wall_s is None else f"{wall_s:.1f}", row["status"])
    return table


def task_of(row: dict[str, Any]) -> str:
    """A row's task, `?` when its config could not be read."""
    return "?" if row["task"] is None else str(row["task"])


def by_sweep(rows: list[dict[str, Any]], sweep: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows in order, those of one sweep folder together: [(its name, its rows)]; a run of
    its own under "" (`sweep`: the rows are that sweep's)."""
    found: list[tuple[str, list[dict[str, Any]]]] = []
    for row in rows:
        folder = row["name"].rpartition("/")[0] or sweep
        if folder and found and found[-1][0] == folder:
            found[-1][1].append(row)
        else:
            found.append((folder, [row]))
    return found


def described(name: str, indent: int, line: str) -> Group:
    """A run column's cell: the name in bold, indented by `indent`, the line below it dim."""
    return Group(Padding(Text(printable(name), style="bold"), (0, 0, 0, indent)),
                 *([Padding(Text(printable(line), style="dim"), (0, 0, 0, indent + 2))]
                   if line else []))


def changes_line(changes: dict[str, Any], task: str | None) -> str:
    """`copy: lr=0.005, positional=rope`: `task` (None: left out), then the changes by their
    short names (`runs.short_names`)."""
    from minitfm.lab.many.runs import short_names

    changes = {key: value for key, value in changes.items() if key != "task.name"}
    names = short_names(list(changes))
    listed = ", ".join(f"{names[key]}={value}" for key, value in changes.items())
    if task is None:
        return listed
    return f"{task}: {listed}" if listed else task


def groups_table(rows: list[dict[str, Any]], keys: list[str], title: str) -> Table:
    """The rows of `query.group_rows`: the keys' values, then n, held-out exact match, runs at
    target and steps, each mean ± the half-width of its 95% interval."""
    from minitfm.lab.many.query import HELD_OUT, shown
    from minitfm.lab.many.runs import short_names

    names = short_names(keys)
    target = any("success_rate mean" in row for row in rows)
    table = Table(title=title, caption=GROUP_CAPTION, box=box.SIMPLE_HEAD, show_edge=False)
    for key in keys:
        table.add_column(names[key], overflow="fold", max_width=16)
    for column in ("n", "exact match", *(["at target"] if target else []), "steps"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        n = str(row["n"]) if row["n"] == row["runs"] else f"{row['n']} of {row['runs']}"
        cells = [printable(shown(row[key])) for key in keys]
        cells += [n, plus_minus(row, f"exact_match {HELD_OUT}", "{:.1%}")]
        cells += [rate_cell(row)] if target else []
        middle = row["steps median"]
        cells.append(plus_minus(row, "steps", "{:.0f}") + (
            "" if middle is None or row["n"] < 2 else f"\nmedian {middle:.0f}"))
        table.add_row(*cells)
    return table
