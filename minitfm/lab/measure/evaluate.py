"""What `minitfm eval` and `minitfm predict` report about a trained run.

The measuring itself (greedy decoding, exact match, token accuracy, the loss) is the book's
`book/metrics.py`; here it is applied to a loaded run (`lab/loaded.py`): lengths checked
against the model's positions, the memory a decoding needs checked before it starts, outputs
turned into text.
"""

from __future__ import annotations

from dataclasses import dataclass

from minitfm.book.metrics import EVAL_BATCH_SIZE, evaluate, predict
from minitfm.catalog import position_shortfall
from minitfm.errors import MinitfmError, quote
from minitfm.lab.loaded import Loaded
from minitfm.lab.options import EvalOptions
from minitfm.run.limits import check_fits, decoding_parts
from minitfm.tasks.base import Task, eval_set


def check_representable(cfg, task: Task, max_len: int) -> None:
    """Lengths up to `max_len` need positions the model has: say so instead of crashing."""
    needed = task.positions_for_source(task.max_source_len(max_len))
    short = position_shortfall(cfg.model, needed)
    if short is not None:
        key, limit, needed = short
        raise MinitfmError(f"--max-len {max_len} needs {needed} positions but this model's "
                           f"positions stop at {key} ({limit}); evaluate up to a shorter length")


def eval_report(loaded: Loaded, options: EvalOptions = EvalOptions()) -> dict:
    """`minitfm eval`: decode held-out data with a loaded run; a JSON-ready report."""
    cfg, task = loaded.config, loaded.task
    lo = options.min_len if options.min_len is not None else cfg.task.min_len
    hi = options.max_len if options.max_len is not None else max(cfg.task.max_len, lo)
    if lo > hi:
        raise MinitfmError(f"--min-len ({lo}) must be <= --max-len ({hi})")
    check_representable(cfg, task, hi)
    check_fits(decoding_parts(cfg, options.samples, hi, options.batch_size), "evaluation")
    seed = cfg.task.eval_seed if options.seed is None else options.seed
    pairs = eval_set(task, options.samples, seed, lo, hi)
    result = evaluate(loaded.model, task, pairs, loaded.device, options.batch_size)
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
