"""`minitfm eval`: a trained run measured honestly, greedy decoding on held-out data, a row
per input length (`per_length_table`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads, loaded_run
from minitfm.app.output import console, err_console, show, wrote
from minitfm.app.parameters import (
    book_option,
    checkpoint_option,
    force_option,
    json_option,
    option,
    options_from,
    run_argument,
    threads_option,
)
from minitfm.errors import shown_path
from minitfm.lab.options import EvalOptions
from minitfm.run.files import to_json


@clean_errors
def eval_command(
    run: Path | None = run_argument(),
    checkpoint: str = checkpoint_option(),
    samples: int = option(EvalOptions, "samples"),
    min_len: int | None = option(EvalOptions, "min_len"),
    max_len: int | None = option(EvalOptions, "max_len"),
    seed: int | None = option(EvalOptions, "seed"),
    batch_size: int = option(EvalOptions, "batch_size"),
    as_json: bool = json_option("Print one JSON object instead of tables."),
    plot: Path | None = typer.Option(None, "--plot", metavar="FILE", help="Also draw exact "
                                     "match per length as a PNG bar chart (trained lengths and "
                                     "beyond in two colours)."),
    force: bool = force_option("the --plot file"),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Measure a trained run honestly: greedy decoding on held-out data, per-length table."""
    if plot is not None:
        from minitfm.lab.pictures import check_output

        check_output(plot, "--plot", force)  # before the decoding, not after
    options = options_from(EvalOptions, locals())
    with claimed_threads(threads):
        from minitfm.lab.measure.evaluate import eval_report

        loaded = loaded_run(run, checkpoint, book)
        with loaded.running(as_json):
            report = eval_report(loaded, options)
    if as_json:
        print(to_json(report))
    else:
        show(per_length_table(report))
    if plot is not None:
        from minitfm.lab.measure.evaluate import length_chart

        length_chart(report, plot, force)
        wrote(plot, err_console if as_json else console)  # --json: stdout stays one document


def per_length_table(report: dict) -> Table:
    """A row per length (count, exact match, token accuracy) and the totals."""
    lo, hi = report["trained_lengths"]
    where = shown_path(report["checkpoint"])
    table = Table(title=f"{report['task']} · {where} · step {report['step']}")
    for column in ("length", "count", "exact match", "token accuracy"):
        table.add_column(column, justify="right")
    for length, row in report["per_length"].items():
        outside = not lo <= int(length) <= hi
        table.add_row(f"{length}{' *' if outside else ''}", str(row["count"]),
                      f"{row['exact_match']:.1%}", f"{row['token_accuracy']:.1%}",
                      style="yellow" if outside else None)
    table.add_section()
    table.add_row("all", str(report["samples"]), f"{report['exact_match']:.1%}",
                  f"{report['token_accuracy']:.1%}", style="bold")
    table.caption = (f"teacher-forced loss {report['loss']:.4f}; trained on lengths {lo}..{hi}"
                     + ("; * outside the trained range" if any(
                         not lo <= int(n) <= hi for n in report["per_length"]) else "")
                     + (f"; {report['unknown_symbols']} symbols never trained on, read as <unk>"
                        if report.get("unknown_symbols") else ""))
    return table
