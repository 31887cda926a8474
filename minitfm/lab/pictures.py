"""The colours of every picture with several lines (`minitfm plot`, `eval --plot`, the sweep's
results.png), in one place: the plot and the sweep modules both draw with them."""

from __future__ import annotations

from typing import Any

# Lines of several runs: colour-blind-safe colours (Okabe & Ito's blue, vermillion, green,
# reddish purple and black, Tol's wine), each at least 3:1 against white (no light blue or
# yellow); past six, the same colours again with another dash and marker.
LINE_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#882255")
LINE_DASHES, LINE_MARKERS = ("-", "--", ":", "-."), ("o", "s", "^", "D")


def line_style(i: int) -> dict[str, Any]:
    """matplotlib's keywords for the line of the `i`-th run or configuration (see LINE_COLOURS):
    24 lines told apart by colour, dash and marker."""
    n = len(LINE_COLOURS)
    return {"color": LINE_COLOURS[i % n], "linestyle": LINE_DASHES[i // n % len(LINE_DASHES)],
            "marker": LINE_MARKERS[i // n % len(LINE_MARKERS)], "markersize": 3}
