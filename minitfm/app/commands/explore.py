"""`minitfm explore`: a trained run in one offline web page (the page is
`lab/explore/explorer.py`'s).
"""

from __future__ import annotations

from pathlib import Path

import typer

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads, loaded_run
from minitfm.app.output import console, warn, wrote
from minitfm.app.parameters import checkpoint_option, force_option, run_argument, threads_option


@clean_errors
def explore(
    run: Path | None = run_argument(),
    out: Path | None = typer.Option(None, metavar="FILE", help="HTML path (default: "
                                    "explorer.html in the run directory; for a .pt outside "
                                    "any run, a file beside it)."),
    force: bool = force_option("the page file (--out or the default)", "page"),
    open_page: bool = typer.Option(False, "--open", help="Open the page in your browser."),
    checkpoint: str = checkpoint_option(),
    threads: str = threads_option(),
) -> None:
    """Write one offline web page where the trained model runs: type inputs, watch decoding
    and every attention map, switch heads off, scrub attention over training, read each head's
    role card (after `minitfm explain`), patch activations and read the logit lens."""
    from minitfm.lab.explore.explorer import check_page_path, size_warning, write_explorer

    if out is not None:
        check_page_path(out, force)  # before the checkpoint is read
    with claimed_threads(threads):  # its forward passes share the cores, as eval's do
        loaded = loaded_run(run, checkpoint)
        if too_large := size_warning(loaded):
            warn(too_large)
        page = write_explorer(loaded, out, force)
    wrote(page.path, size=page.size)
    if open_page:
        import webbrowser

        if not webbrowser.open(page.path.resolve().as_uri()):
            console.print("(no browser found here: open the file above in one)", markup=False,
                          highlight=False)
