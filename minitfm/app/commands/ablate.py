"""`minitfm ablate`: which heads matter, exact match with each head and each layer switched off
(`ablation_tables`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads, loaded_run
from minitfm.app.output import show, wrote
from minitfm.app.parameters import (
    book_option,
    checkpoint_option,
    json_option,
    option,
    options_from,
    run_argument,
    threads_option,
)
from minitfm.app.text import printable
from minitfm.errors import shown_path
from minitfm.lab.options import AblateOptions
from minitfm.run.files import to_json

if TYPE_CHECKING:
    from minitfm.lab.interpret.ablate import AblationReport


@clean_errors
def ablate(
    run: Path | None = run_argument(),
    mode: str = option(AblateOptions, "mode"),
    samples: int = option(AblateOptions, "samples"),
    checkpoint: str = checkpoint_option(),
    batch_size: int = option(AblateOptions, "batch_size"),
    out: Path | None = option(AblateOptions, "out"),
    force: bool = option(AblateOptions, "force"),
    as_json: bool = json_option("Print one JSON object instead of tables."),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Which heads matter: exact match with each attention head, then each layer, switched off."""
    options = options_from(AblateOptions, locals())
    with claimed_threads(threads):
        from minitfm.lab.interpret.ablate import ablate, check_options

        check_options(options)  # before RUN is looked for
        loaded = loaded_run(run, checkpoint, book)
        with loaded.running(as_json):
            report = ablate(loaded, options)
    if as_json:
        print(to_json(report.as_dict()))
        return
    for renderable in ablation_tables(report):
        show(renderable)
    wrote(report.png)


def ablation_tables(report: AblationReport) -> list:
    """The headline, a table per kind (rows layers, columns heads and the whole layer), a key."""
    from minitfm.lab.attention.probe import KIND_TITLES, KINDS
    from minitfm.lab.interpret.ablate import MARKED_DROP, grid, headline

    lines = headline(report, shown_path(report.checkpoint)).split("\n")  # escaped one by one
    out: list = [Text("\n".join(printable(line) for line in lines))]
    for kind in KINDS:
        rows = grid(report, kind)
        table = Table(title=KIND_TITLES[kind])
        table.add_column("layer", justify="right")
        for head in range(len(rows[0]) - 1):
            table.add_column(f"head {head}", justify="right")
        table.add_column("all heads", justify="right")
        for layer, row in enumerate(rows):
            table.add_row(str(layer), *(ablation_cell(cell) for cell in row))
        out.append(table)
    out.append(Text(f"cells: exact match with the head (or all heads of the layer) off, and "
                    f"its change in points; * = a drop of more than {100 * MARKED_DROP:.0f} "
                    f"points"))
    return out


def ablation_cell(row: dict) -> Text:
    """`12.4% (-87.4) *`: exact match, change in points, and the mark of a head that matters."""
    from minitfm.lab.interpret.ablate import MARKED_DROP

    marked = row["drop"] > MARKED_DROP
    return Text(f"{row['exact_match']:.1%} ({-100 * row['drop']:+.1f}){' *' if marked else '  '}",
                style="bold red" if marked else "")
