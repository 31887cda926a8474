"""`minitfm patch`: activation patching, which heads and which positions of the residual
stream carry the clean input's answer (`stream_table`); the lab's `interpret/patching.py` measures,
this prints."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads, loaded_run
from minitfm.app.output import show, warn, wrote
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
from minitfm.lab.options import PatchOptions
from minitfm.run.files import to_json


@clean_errors
def patch(
    run: Path | None = run_argument(),
    clean: str | None = option(PatchOptions, "clean"),
    corrupt: str | None = option(PatchOptions, "corrupt"),
    checkpoint: str = checkpoint_option(),
    out: Path | None = option(PatchOptions, "out"),
    force: bool = option(PatchOptions, "force"),
    as_json: bool = json_option("Print one JSON object instead of tables."),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Activation patching: how much of the clean input's answer each head, and the residual
    stream at each position, restores when patched into the corrupted input's run."""
    options = options_from(PatchOptions, locals())
    with claimed_threads(threads):
        from minitfm.lab.interpret.patching import patch as patch_run

        loaded = loaded_run(run, checkpoint, book)
        with loaded.running(as_json):
            report = patch_run(loaded, options)
    if report.warning:
        warn(report.warning)
    if as_json:
        print(to_json(report.as_dict()))
        return
    show(Text(printable(report.title())))
    heads = Table(title="heads: restored share (0: as corrupted, 1: as clean)")
    n_heads = max(row["head"] for row in report.heads) + 1
    heads.add_column("layer")
    for head in range(n_heads):
        heads.add_column(f"head {head}", justify="right")
    layers: dict[str, list[str]] = {}
    for row in report.heads:
        layers.setdefault(f"{row['kind']} L{row['layer']}", []).append(f"{row['restored']:.2f}")
    for name, cells in layers.items():
        heads.add_row(name, *cells)
    show(heads)
    show(stream_table(report, "encoder", "residual stream, encoder side: restored share at "
                                         "each source position (clean/corrupted token)"))
    show(stream_table(report, "decoder", "residual stream, decoder side: restored share at "
                                         "each output position (read→written in the clean run; "
                                         "clean/corrupted where the answers differ)"))
    wrote(report.png)


def stream_table(report, side: str, title: str) -> Table:
    """The residual points of one side, a column per position labelled as the explorer's page
    labels it (source tokens; output positions read→written)."""
    table = Table(title=title)
    table.add_column("point")
    labels = report.source_labels() if side == "encoder" else report.output_labels()
    for label in labels:
        table.add_column(printable(label), justify="right")
    for name, values in report.streams(side):
        table.add_row(name, *(f"{v:.2f}" for v in values))
    return table
