"""What `minitfm eval` and `minitfm predict` report about a trained run, and `eval --plot`'s
bars of exact match per input length.

The measuring itself (greedy decoding, exact match, token accuracy, the loss) is the book's
`book/metrics.py`; here it is applied to a loaded run (`lab/loaded.py`): lengths checked
against the model's positions, the memory a decoding needs checked before it starts, outputs
turned into text. matplotlib is imported inside functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minitfm.book.metrics import EVAL_BATCH_SIZE, EvalResult, evaluate, predict
from minitfm.catalog import position_shortfall
from minitfm.errors import MinitfmError, option, quote
from minitfm.lab.loaded import Loaded
from minitfm.lab.options import EvalOptions
from minitfm.lab.pictures import LINE_COLOURS, save_png, wrap_to_width
from minitfm.run.limits import check_fits, decoding_parts
from minitfm.run.rundir import find_run_dir
from minitfm.tasks.base import Task, eval_set

TRAINED, BEYOND = LINE_COLOURS[:2]  # eval --plot: lengths trained on, and beyond


def check_representable(cfg, task: Task, max_len: int) -> None:
    """Lengths up to `max_len` need positions the model has: say so instead of crashing."""
    needed = task.positions_for_source(task.max_source_len(max_len))
    short = position_shortfall(cfg.model, needed)
    if short is not None:
        key, limit, needed = short
        raise MinitfmError(f"{option('max_len')} {max_len} needs {needed} positions but this "
                           f"model's positions stop at {key} ({limit}); evaluate up to a "
                           f"shorter length")


def eval_report(loaded: Loaded, options: EvalOptions = EvalOptions()) -> dict:
    """`minitfm eval`: decode held-out data with a loaded run; a JSON-ready report."""
    pairs = held_out(loaded, options)
    result = evaluate(loaded.model, loaded.task, pairs, loaded.device, options.batch_size)
    return report(loaded, pairs, result)


def held_out(loaded: Loaded, options: EvalOptions) -> list:
    """The held-out pairs `options` ask for, each length checked against the model's positions
    and the decoding's memory against this machine's, before anything is decoded."""
    cfg, task = loaded.config, loaded.task
    lo = options.min_len if options.min_len is not None else cfg.task.min_len
    hi = options.max_len if options.max_len is not None else max(cfg.task.max_len, lo)
    if lo > hi:
        raise MinitfmError(f"{option('min_len')} ({lo}) must be <= {option('max_len')} ({hi})")
    check_representable(cfg, task, hi)
    check_fits(decoding_parts(cfg, options.samples, hi, options.batch_size,
                              (option("samples"), option("max_len"))), "evaluation")
    seed = cfg.task.eval_seed if options.seed is None else options.seed
    return eval_set(task, options.samples, seed, lo, hi)


def report(loaded: Loaded, pairs: list, result: EvalResult) -> dict:
    """What `minitfm eval --json` prints of `result`, the metrics of `loaded` on `pairs`."""
    cfg, task = loaded.config, loaded.task
    unknown = task.count_unknown(pairs)  # pairs: symbols never trained on, read as <unk>
    return {**result.as_dict(), "checkpoint": str(loaded.checkpoint), "step": loaded.step,
            "task": cfg.task.name, "trained_lengths": [cfg.task.min_len, cfg.task.max_len],
            **({} if unknown is None else {"unknown_symbols": unknown})}


@dataclass
class Predictions:
    """What `predict` gives: a row per input decoded, in order, up to the first bad input."""

    rows: list[dict]
    warning: str | None = None  # inputs longer than the trained lengths
    error: MinitfmError | None = None  # the first input that could not be read


def predict_lines(loaded: Loaded, lines: list[tuple[int, str]],
                  where: str = "input") -> Predictions:
    """`minitfm predict`: parse (number, text) lines up to the first bad one (its error names
    `where` and its number), decode those, and write each output as its input is written
    ("12+34" -> "46")."""
    cfg, task = loaded.config, loaded.task
    sources, error = [], None
    for number, text in lines:
        try:
            sources.append(task.parse(text, max_tokens=input_limit(cfg, task)))
        except MinitfmError as err:
            error = type(err)(f"{where} {number} ({quote(text)}): {err}")
            break
    if not sources:
        return Predictions([], None, error)
    longest = max(len(src) for src in sources)
    check_fits(decoding_parts(cfg, len(sources), longest, EVAL_BATCH_SIZE,
                              names=("the number of inputs", "the longest input")), "decoding")
    outputs = predict(loaded.model, task, sources, loaded.device)
    rows = []
    for (_, text), src, out in zip(lines, sources, outputs):
        expected = task.target(src)  # pairs: None for a source not in its data
        rows.append({"input": text, "output": task.format_like(out, text),
                     "expected": None if expected is None else task.format_like(expected, text),
                     "match": None if expected is None else out == expected})
        if unknown := task.unknown_symbols(text):
            rows[-1]["unknown"] = unknown
    return Predictions(rows, length_warning(cfg, task, sources, where), error)


def length_warning(cfg, task: Task, sources: list[list[int]], where: str) -> str | None:
    """One line when some inputs are longer than the lengths the model was trained on."""
    lengths = [task.input_length(src) for src in sources]
    longer = [n for n in lengths if n > cfg.task.max_len]
    if not longer:
        return None
    count = f"1 {where} is" if len(longer) == 1 else f"{len(longer)} {where}s are"
    return (f"{count} longer than the lengths trained on ({cfg.task.min_len}.."
            f"{cfg.task.max_len}; the longest has {max(longer)}): expect mistakes")


def input_limit(cfg, task: Task) -> int | None:
    """Longest input (tokens) the model has positions for (`position_shortfall`); None: any."""
    n = cfg.model.max_len
    if position_shortfall(cfg.model, task.positions_for_source(n + 1)) is None:  # no end
        return None
    while n > 0 and position_shortfall(cfg.model, task.positions_for_source(n)) is not None:
        n -= 1
    return n


# --- `minitfm eval --plot` ---

def length_chart(report: dict[str, Any], path: Path, force: bool = False) -> None:
    """`eval --plot`: write `length_figure` of an `eval_report` report to `path`."""
    save_png(length_figure(report), path, "--plot", force)


def length_figure(report: dict[str, Any]):
    """Exact match per input length as bars, the trained lengths and those beyond in two
    colours (beyond also hatched)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    lo, hi = report["trained_lengths"]
    rows = sorted((int(n), row["exact_match"]) for n, row in report["per_length"].items())
    fig = Figure(figsize=(max(6.0, 1.5 + 0.25 * len(rows)), 4.0), dpi=100,
                 layout="constrained")
    ax = fig.add_subplot()
    for inside, colour, hatch, label in ((True, TRAINED, None, f"trained lengths {lo}..{hi}"),
                                         (False, BEYOND, "//", "beyond the trained lengths")):
        chosen = [(n, exact) for n, exact in rows if (lo <= n <= hi) == inside]
        if chosen:
            bars = ax.bar(*zip(*chosen, strict=True), color=colour, hatch=hatch,
                          edgecolor="white", label=label)
            # rounded down: 99.9% is no "100%"; a 0% bar is visible by its label
            ax.bar_label(bars, [f"{math.floor(exact * 100)}%" for _, exact in chosen],
                         fontsize=7, rotation=90, padding=2)
    checkpoint = Path(report["checkpoint"])
    run_dir = find_run_dir(checkpoint)
    where = f"{run_dir.name}/{checkpoint.name}" if run_dir else checkpoint.name
    title = f"exact match per input length · {report['task']} · {where} · step {report['step']}"
    # over the whole figure, as wide as it: over the axes alone, the legend beside them would
    # push a title wrapped to the figure's width off its left edge
    fig.suptitle(wrap_to_width(title, fig.get_figwidth() - 0.3, 11), fontsize=11)
    ax.set(xlabel="input length", ylabel="exact match (greedy decoding, held-out)",
           ylim=(0, 1.15), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1])  # room for 100% bars' labels
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
