"""`minitfm sweep`: a grid of configs trained in parallel, each evaluated, compared in one
table (`sweep_table`: a row per configuration, its figures over the seeds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from minitfm.app.arguments import split_config_args
from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import fail, note, say, show, warn
from minitfm.app.parameters import option, options_from
from minitfm.app.text import printable
from minitfm.errors import shown_path
from minitfm.lab.options import SweepOptions, seeds_once


@clean_errors(uses_torch=False)
def sweep(
    args: list[str] = typer.Argument(
        ..., metavar="CONFIG [KEY=V1,V2,...]...",
        help="A YAML config, then the grid: KEY=V1,V2 sweeps a key, KEY=V sets it in every run "
             "(e.g. model.positional=sinusoidal,rope model.random_positions=null,64)."),
    seeds: list[str] | None = option(SweepOptions, "seeds"),
    jobs: int | None = option(SweepOptions, "jobs"),
    threads: int | None = option(SweepOptions, "threads"),
    eval_lengths: list[str] | None = option(SweepOptions, "eval_lengths"),
    eval_samples: int = option(SweepOptions, "eval_samples"),
    name: str | None = option(SweepOptions, "name"),
    out: Path | None = option(SweepOptions, "out"),
    skip_invalid: bool = option(SweepOptions, "skip_invalid"),
    on: str = option(SweepOptions, "on"),
    ray_address: str | None = option(SweepOptions, "ray_address"),
    stack: bool | None = option(SweepOptions, "stack"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print one shell command line per "
                                 "run that still has work, and exit."),
) -> None:
    """Train a grid of configs in parallel, evaluate each, and compare them in one table."""
    from minitfm.lab.many.sweep import dry_run_lines, prepare, run_sweep

    config, items = split_config_args(args, allow_config=True)
    options = options_from(SweepOptions, {**locals(), "seeds": seeds_once(seeds)})
    plan = prepare(config, items, options)
    if dry_run:
        for text in plan.notes(dry_run=True):  # stdout stays the shell lines alone
            note(text)
        for line in dry_run_lines(plan):
            print(line)
        return
    result = run_sweep(plan, say, warn)
    folder = shown_path(plan.folder)
    show(sweep_table(result.rows, result.keys, f"sweep {folder}"))
    intervals = ", intervals.png" if (plan.folder / "intervals.png").is_file() else ""
    say(f"wrote {shown_path(plan.folder / 'results.jsonl')}, results.csv, results.png, "
        f"configurations.jsonl, configurations.csv{intervals}")
    if result.failed:
        fail(f"{len(result.failed)} of {len(plan.runs)} runs failed "
             f"({', '.join(result.failed)}): see their .log files in {folder}", 1)


def sweep_table(rows: list[dict[str, Any]], keys: list[str], title: str) -> Table:
    """Rows = configurations (`#` as `minitfm compare` takes it): n, then each figure's mean ±
    the half-width of its 95% interval over the seeds (`lab/many/seeds.py`)."""
    from minitfm.lab.many.results import by_configuration, range_labels
    from minitfm.lab.many.runs import short_names
    from minitfm.lab.many.seeds import CAPTION, configuration_rows

    names, spans = short_names(keys), range_labels(rows)
    shown = [key for key in keys if key != "seed"]
    summaries = configuration_rows(by_configuration(rows), keys, spans)
    target = any("success_rate mean" in row for row in summaries)
    to = " to target" if target else ""
    table = Table(title=title, caption=CAPTION)
    for column in ["#", *(names[k] for k in shown), "n", *(f"exact match {s}" for s in spans),
                   *(["at target"] if target else []), f"steps{to}", f"seconds{to}"]:
        table.add_column(column, justify="left" if column in names.values() else "right")
    for row in summaries:
        cells = [str(row["#"]), *(printable(str(row[k])) if row[k] is not None else "null"
                                  for k in shown)]
        cells.append(str(row["n"]) if row["n"] == row["runs"] else f"{row['n']} of {row['runs']}")
        cells += [plus_minus(row, f"exact_match {s}", "{:.1%}") for s in spans]
        if target:
            cells.append(rate_cell(row))
        for name, form in (("steps", "{:.0f}"), ("seconds", "{:.1f}")):
            middle = row[f"{name} median"]
            cells.append(plus_minus(row, name, form) + ("" if middle is None or row["n"] < 2
                                                       else f"\nmedian {form.format(middle)}"))
        table.add_row(*cells)
    return table


def plus_minus(row: dict[str, Any], name: str, form: str) -> str:
    """`97.3% ± 1.2%`: the mean ± the half-width of its interval (a value alone: one run)."""
    centre, lo, hi = (row.get(f"{name} {end}") for end in ("mean", "lo", "hi"))
    if centre is None:
        return "-"
    if lo is None:
        return form.format(centre)
    return f"{form.format(centre)} ± {form.format((hi - lo) / 2)}"


def rate_cell(row: dict[str, Any]) -> str:
    """`7/8` over its Wilson interval `47-100%`."""
    if row.get("success_rate mean") is None:
        return "-"
    return (f"{row['reached']}/{row['n']}\n{row['success_rate lo']:.0%}-"
            f"{row['success_rate hi']:.0%}")
