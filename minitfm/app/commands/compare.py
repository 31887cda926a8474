"""`minitfm compare`: two configurations side by side, figure by figure, each difference with
its 95% interval and a permutation test, in words where nothing is detectable (the lab's
`many/compare.py` and `many/stats.py` compute; this prints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import note, say, show
from minitfm.app.parameters import json_option
from minitfm.app.text import printable
from minitfm.run.files import to_json

SIDE_HELP = ("a run directory, or a folder of runs (a sweep folder: all its runs); repeat for "
             "more. With --{other}, instead of SWEEP A B.")


@clean_errors(uses_torch=False)
def compare(
    args: list[str] | None = typer.Argument(
        None, metavar="[SWEEP A B | SWEEP_A A SWEEP_B B]",
        help="A sweep folder and two of its configurations, each by its # in the sweep's table "
             "or its label (positional=rope); or a configuration of each of two sweeps."),
    a: list[Path] | None = typer.Option(None, "--a", metavar="DIR",
                                        help="Side A: " + SIDE_HELP.format(other="b")),
    b: list[Path] | None = typer.Option(None, "--b", metavar="DIR",
                                        help="Side B: " + SIDE_HELP.format(other="a")),
    effect: list[str] | None = typer.Option(
        None, "--effect", metavar="FIGURE=SIZE",
        help="The difference to size in seeds, per figure (repeatable): exact_match, steps, "
             "seconds or success, rates as fractions, e.g. steps=50 (default: the observed "
             "difference)."),
    as_json: bool = json_option("Print one JSON object instead of the table."),
) -> None:
    """Is there a difference? Two configurations' exact match, steps and seconds to the target
    and success rate: A - B with its 95% interval and a permutation test (paired by seed when
    both sides hold the same seeds), or the smallest difference these seeds could detect."""
    from minitfm.lab.many.compare import choose_sides, compare_sides, parse_effects

    effects = parse_effects(effect or [])  # before any run is read
    side_a, side_b = choose_sides(args or [], a or [], b or [])
    report = compare_sides(side_a, side_b, effects)
    for side in (side_a, side_b):
        if side.left_out:
            note(f"{side.name} leaves out {len(side.left_out)} run(s) that did not end: "
                 f"{', '.join(side.left_out)}")
        if side.mixed:
            note(f"the runs of {side.name} differ in {', '.join(side.mixed[:5])}: compare pools "
                 f"them as one configuration")
    for line in report["notes"]:
        note(line)
    if as_json:
        print(to_json(report))
        return
    show(compare_table(report))
    for found in report["figures"]:
        say(f"{found['name']}: {found['verdict']}")
        if "seeds_line" in found:
            say(f"  seeds: {found['seeds_line']}")


def compare_table(report: dict[str, Any]) -> Table:
    """A row per figure: each side's mean ± the half-width of its interval, A - B with its
    interval, the p-value; the caption names the interval and the test."""
    from minitfm.lab.many.verdicts import amount, ends

    table = Table(title=printable(heading(report)), caption=caption(report))
    for column in ("figure", "A", "B", "A - B [95% interval]", "p"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for found in report["figures"]:
        if "p_value" not in found:
            table.add_row(found["name"], "-", "-", "-", "-")
            continue
        figure = found["figure"]
        interval = ends(figure, found["lo"], found["hi"])
        table.add_row(found["name"], side_cell(figure, found["a"]), side_cell(figure, found["b"]),
                      amount(figure, found["difference"], True)
                      + (f"\n{interval}" if interval else ""), f"{found['p_value']:.2g}")
    return table


TITLE_WIDTH = 100  # a longer heading names the sides' settings in parts of their own


def heading(report: dict[str, Any]) -> str:
    """`A: #1 all (n = 8), train.lr=0.01  vs  B: #1 all (n = 8), train.lr=0.005, paired by seed
    (8 seeds)`: each side followed by the settings in which the two differ (`differs`, less
    those both sides' labels name: `#1 positional=rope`). Where that would be longer than
    TITLE_WIDTH, each side's settings follow as a part of its own, `· A: ... · B: ...`, which
    `show` puts on a line of its own where the terminal is narrower."""
    pairing = (f"paired by seed ({len(report['seeds'])} seeds)" if report["paired"]
               else f"unpaired ({report['unpaired']})")
    sides = [f"{name.upper()}: {report[name]['label']} (n = {report[name]['n']})"
             for name in "ab"]
    named = set(report["a"]["label_keys"]) & set(report["b"]["label_keys"])
    keys = [key for key in report["differs"] if key not in named]
    if not keys:
        return f"{sides[0]}  vs  {sides[1]}, {pairing}"
    settings = [", ".join(f"{key}={','.join(map(str, report['differs'][key][name]))}"
                          for key in keys) for name in "ab"]
    line = f"{sides[0]}, {settings[0]}  vs  {sides[1]}, {settings[1]}, {pairing}"
    if len(line) <= TITLE_WIDTH:
        return line
    return f"{sides[0]}  vs  {sides[1]}, {pairing} · A: {settings[0]} · B: {settings[1]}"


def side_cell(figure: str, side: dict[str, Any]) -> str:
    """`97.3% ± 1.2%` (`7/8 47-100%` for a rate): a side's mean and its interval."""
    from minitfm.lab.many.verdicts import amount

    if side["lo"] is None:
        return amount(figure, side["mean"])
    if figure == "success":
        return (f"{round(side['mean'] * side['n'])}/{side['n']}\n"
                f"{side['lo']:.0%}-{side['hi']:.0%}")
    half = amount(figure, (side["hi"] - side["lo"]) / 2, unit=False)
    return f"{amount(figure, side['mean'])}\n± {half}"


def caption(report: dict[str, Any]) -> str:
    """Which intervals and which test, in words."""
    from minitfm.lab.many.stats import EXACT_LIMIT, MONTE_CARLO, SEED

    test = ("sign-flip permutation test of the paired differences" if report["paired"]
            else "permutation test, the runs' labels shuffled")
    interval = ("Student's t of the paired differences" if report["paired"]
                else "Welch's t")
    return (f"A and B: mean ± the half-width of its 95% Student's t interval (a rate: runs at "
            f"target, Wilson interval). A - B: {interval} (a rate: Newcombe's); p: two-sided "
            f"{test} (exact up to {EXACT_LIMIT:,} arrangements, else {MONTE_CARLO:,} random "
            f"ones, seed {SEED}). A run "
            f"that missed the target counts at the step budget.")
