"""`minitfm sweep`: a grid of configs trained in parallel, each evaluated, compared in one
table (`sweep_table`: a row per configuration, its figures over the seeds); with ranges, a
search (`search_table`: a row per trial)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
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
        help=escape("A YAML config, then the grid: KEY=V1,V2 sweeps a key, KEY=V sets it in "
                    "every run (e.g. model.positional=sinusoidal,rope "
                    "model.random_positions=null,64); a range makes it a search of --trials: "
                    "KEY=interval(A,B), KEY=tag(log,interval(A,B)), KEY=range(A,B,STEP), "
                    "KEY=choice(a,b) (pip install 'minitfm[search]').")),
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
    trials: int | None = option(SweepOptions, "trials"),
    sampler: str = option(SweepOptions, "sampler"),
    sampler_seed: int = option(SweepOptions, "sampler_seed"),
    prune: str = option(SweepOptions, "prune"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print one shell command line per "
                                 "run that still has work, and exit."),
) -> None:
    """Train a grid of configs in parallel, evaluate each, and compare them in one table; with
    ranges, search them (Optuna), stopping hopeless trials (--prune)."""
    from minitfm.lab.many.search import prepare_search
    from minitfm.lab.many.space import split_items
    from minitfm.lab.many.sweep import dry_run_lines, prepare, run_sweep
    from minitfm.lab.many.trials import run_search

    config, items = split_config_args(args, allow_config=True)
    options = options_from(SweepOptions, {**locals(), "seeds": seeds_once(seeds)})
    if dry_run and options.trials is not None:
        fail("--dry-run prints a grid's commands; a search draws its trials as it goes: leave "
             "out --dry-run")
    searching = bool(split_items(items)[0])  # a range to search
    plan = (prepare_search if searching else prepare)(config, items, options)
    if dry_run and plan.search is not None:
        fail("--dry-run prints a grid's commands; a search draws its trials as it goes: leave "
             "out --dry-run")
    if dry_run:
        for text in plan.notes(dry_run=True):  # stdout stays the shell lines alone
            note(text)
        for line in dry_run_lines(plan):
            print(line)
        return
    if searching:
        on_ray = None
        if plan.on == "ray":
            from minitfm.lab.many.ray_search import run_trials_on_ray as on_ray  # Ray's only
        result = run_search(plan, say, warn, on_ray)
    else:
        result = run_sweep(plan, say, warn)
    folder = shown_path(plan.folder)
    if plan.search is not None:
        objective = plan.search.objective.words(max(1, len(plan.search.seeds)))
        show(search_table(result.rows, result.keys, f"search {folder}", objective))
        for line in search_summary(result.rows, plan.search):
            say(line)
    else:
        show(sweep_table(result.rows, result.keys, f"sweep {folder}"))
    intervals = ", intervals.png" if (plan.folder / "intervals.png").is_file() else ""
    trials = ", trials.jsonl, study.db" if plan.search is not None else ""
    say(f"wrote {shown_path(plan.folder / 'results.jsonl')}, results.csv, results.png, "
        f"configurations.jsonl, configurations.csv{intervals}{trials}")
    if result.failed:
        fail(f"{len(result.failed)} of {len(result.rows)} runs failed "
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


def search_table(rows: list[dict[str, Any]], keys: list[str], title: str,
                 objective: str) -> Table:
    """A row per trial, in their order: its values, how it ended (its objective, or where it
    was pruned and why), its runs' mean steps and held-out exact match; the best marked `*`."""
    from minitfm.lab.many.results import range_labels
    from minitfm.lab.many.runs import short_names
    from minitfm.lab.many.space import shown

    names, spans = short_names(keys), range_labels(rows)
    searched = [key for key in keys if key != "seed"]
    best = best_trial(rows)
    table = Table(title=title, caption=f"* the best trial; objective: {objective}"
                  if best is not None else f"objective: {objective}")
    for column in ["trial", *(names[k] for k in searched), "runs", "ended", "objective",
                   "steps", *(f"exact match {s}" for s in spans)]:
        table.add_column(column, justify="left" if column in (*names.values(), "ended")
                         else "right", max_width=44 if column == "ended" else None)
    trials: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        trials.setdefault(row["trial"], []).append(row)
    for number, runs in trials.items():
        first = runs[0]
        ended = first["trial_state"]
        if ended == "pruned" and first["pruned"]:  # the first run's words, the rest in the files
            said = first["pruned"].split("; ")
            ended = said[0] + (" …" if len(said) > 1 else "")
        steps = [r["steps"] for r in runs if isinstance(r["steps"], int)]
        cells = [f"{number}{' *' if number == best else ''}",
                 *(printable(shown(str(first.get(k)))) for k in searched), str(len(runs)),
                 printable(ended),
                 "-" if first["objective"] is None else f"{first['objective']:.4g}",
                 f"{sum(steps) / len(steps):.0f}" if steps else "-"]
        for span in spans:
            found = [r["exact_match"].get(span) for r in runs]
            found = [v for v in found if v is not None]
            cells.append(f"{sum(found) / len(found):.1%}" if found else "-")
        table.add_row(*cells)
    return table


def best_trial(rows: list[dict[str, Any]]) -> int | None:
    """The number of the trial marked best in the rows (`trial_best`), if any."""
    return next((row["trial"] for row in rows if row.get("trial_best")), None)


def search_summary(rows: list[dict[str, Any]], search) -> list[str]:
    """`32 trials: 21 complete, 10 pruned; best: trial 17 (lr=0.0112, ...), objective 231`,
    the best's settings as overrides, and how to take a pruned run on by hand."""
    from minitfm.lab.many.search import values_text
    from minitfm.lab.many.trials import search_counts

    counts = search_counts(rows)
    parts = ", ".join(f"{counts[state]} {state}" for state in
                      ("complete", "pruned", "failed", "running") if counts.get(state))
    lines = [f"{sum(counts.values())} trials: {parts}; none complete"]
    best = next((row for row in rows if row["trial"] == best_trial(rows)), None)
    if best is not None:
        values = {d.key: best.get(d.key) for d in search.space}
        lines = [f"{sum(counts.values())} trials: {parts}; best: trial {best['trial']} "
                 f"({values_text(values)}), objective {best['objective']:.4g}",
                 "its settings: " + " ".join(f"{key}={value}" for key, value in values.items())]
    if counts.get("pruned"):
        lines.append("a pruned trial's runs keep their last.pt: minitfm train --resume RUN "
                     "takes one to its end")
    return lines
