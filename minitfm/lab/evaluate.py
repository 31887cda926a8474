"""Honest measurement: free-running greedy decoding that never sees the target.

- exact match: the whole predicted sequence equals the target, length included.
- token accuracy: position-wise agreement with the target, where a missing or an extra
  token counts as wrong: sum over sequences of matches / sum of max(len(pred), len(target)).
- loss: teacher-forced cross-entropy per target token (EOS included), PAD ignored.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minitfm.book.model import (
    HeadEdits,
    Seq2SeqTransformer,
    build_model,
    default_device,
    eval_mode,
    greedy_decode,
    sequence_loss,
)
from minitfm.config import Config, validate
from minitfm.errors import MinitfmError, quote
from minitfm.run.checkpoint import check_vocab, does_not_fit, load_checkpoint
from minitfm.run.limits import check_fits, decoding_parts, model_parts
from minitfm.run.rundir import resolve_checkpoint
from minitfm.tasks.base import Task, eval_set, make_batch, make_task, positions_short

Pair = tuple[list[int], list[int]]


@dataclass
class LengthStats:
    """Counts for one input length."""

    count: int = 0
    exact: int = 0
    correct_tokens: int = 0
    total_tokens: int = 0

    def add(self, pred: list[int], target: list[int]) -> None:
        """Score one prediction against its target."""
        self.count += 1
        self.exact += pred == target
        self.correct_tokens += sum(p == t for p, t in zip(pred, target))
        self.total_tokens += max(len(pred), len(target))

    def merge(self, other: LengthStats) -> None:
        self.count += other.count
        self.exact += other.exact
        self.correct_tokens += other.correct_tokens
        self.total_tokens += other.total_tokens

    @property
    def exact_match(self) -> float:
        return self.exact / max(self.count, 1)

    @property
    def token_accuracy(self) -> float:
        return self.correct_tokens / max(self.total_tokens, 1)


@dataclass
class EvalResult:
    """Metrics over a set of pairs, in total and per input length."""

    loss: float
    total: LengthStats
    per_length: dict[int, LengthStats]
    predictions: list[list[int]] = field(repr=False)

    @property
    def exact_match(self) -> float:
        return self.total.exact_match

    @property
    def token_accuracy(self) -> float:
        return self.total.token_accuracy

    def as_dict(self) -> dict:
        """Plain numbers for metrics.jsonl and --json."""
        return {
            "loss": self.loss,
            "token_accuracy": self.token_accuracy,
            "exact_match": self.exact_match,
            "samples": self.total.count,
            "per_length": {str(n): {"count": s.count, "exact_match": s.exact_match,
                                    "token_accuracy": s.token_accuracy}
                           for n, s in sorted(self.per_length.items())},
        }


def score(pairs: list[Pair], predictions: list[list[int]],
          length=len) -> tuple[LengthStats, dict]:
    """Exact match and token accuracy of `predictions`, in total and per input `length`."""
    per_length: dict[int, LengthStats] = defaultdict(LengthStats)
    for (src, target), pred in zip(pairs, predictions, strict=True):
        per_length[length(src)].add(pred, target)
    total = LengthStats()
    for stats in per_length.values():
        total.merge(stats)
    return total, dict(per_length)


def strip_eos(row: list[int], eos_id: int) -> list[int]:
    """Tokens up to (not including) the first EOS."""
    return row[:row.index(eos_id)] if eos_id in row else row


# Sequences decoded at once. On a CPU 250 is as fast as 1000 (the matmuls are already large)
# and needs a quarter of the memory: a batch of 1000 added ~120 MB to a training run's peak.
EVAL_BATCH_SIZE = 250


def length_chunks(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped by length into chunks of `batch_size`: similar lengths pad less, and a
    chunk of short inputs stops decoding early."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def predict(model, task: Task, sources: list[list[int]], device,
            batch_size: int = EVAL_BATCH_SIZE, use_cache: bool = True,
            edits: HeadEdits | None = None) -> list[list[int]]:
    """Greedy-decode each source; the target is never looked at. Outputs keep the input order.

    `edits` change head outputs while decoding (`minitfm ablate`).
    """
    out = [[] for _ in sources]
    for chunk in length_chunks([len(s) for s in sources], batch_size):
        src = make_batch([(sources[i], []) for i in chunk], task.vocab).src.to(device)
        decoded = decode_chunk(model, task, src, [len(sources[i]) for i in chunk], use_cache,
                               edits)
        for i, row in zip(chunk, decoded):
            out[i] = row
    return out


def decode_chunk(model, task: Task, src, lengths: list[int], use_cache: bool = True,
                 edits: HeadEdits | None = None, encoded=None) -> list[list[int]]:
    """Greedy-decode one chunk of padded sources (B, S) whose lengths are `lengths`, up to the
    longest target they allow (+ EOS); the outputs without EOS. `encoded`: see greedy_decode."""
    vocab = task.vocab
    cap = max(task.max_target_len(n) for n in lengths) + 1  # + EOS
    tokens = greedy_decode(model, src, vocab.bos_id, vocab.eos_id, cap, use_cache, edits, encoded)
    return [strip_eos(row, vocab.eos_id) for row in tokens.tolist()]


@torch.no_grad()
def evaluate(model, task: Task, pairs: list[Pair], device,
             batch_size: int = EVAL_BATCH_SIZE) -> EvalResult:
    """Loss, token accuracy and exact match of `model` on `pairs` (eval mode, restored after).

    Each chunk's sources are encoded once, for both measurements: greedy decoding, which
    never sees the target, and the teacher-forced loss, which feeds the true previous tokens.
    """
    vocab, predictions = task.vocab, [[] for _ in pairs]
    loss_sum, tokens = 0.0, 0
    with eval_mode(model):
        for chunk in length_chunks([len(src) for src, _ in pairs], batch_size):
            batch = make_batch([pairs[i] for i in chunk], vocab).to(device)
            memory, src_mask, _ = model.encode(batch.src)  # (B, S, D), (B, 1, 1, S)
            decoded = decode_chunk(model, task, batch.src, [len(pairs[i][0]) for i in chunk],
                                   encoded=(memory, src_mask))
            for i, row in zip(chunk, decoded):
                predictions[i] = row
            logits, _, _ = model.decode(batch.tgt_in, memory, src_mask)  # (B, T, V)
            loss_sum += sequence_loss(logits, batch.tgt_out, vocab.pad_id,
                                      reduction="sum").item()
            tokens += batch.n_target_tokens
    total, per_length = score(pairs, predictions, task.input_length)
    return EvalResult(loss_sum / max(tokens, 1), total, per_length, predictions)


def load_model(path: Path, device: torch.device | str = "cpu"
               ) -> tuple[Config, Task, Seq2SeqTransformer, int]:
    """(config, task, model in eval mode, step) from a checkpoint file."""
    state = load_checkpoint(path)
    try:
        cfg = validate(state["config"])
        task = make_task(cfg.task, state)
        check_vocab(state, task, path)
        check_fits(model_parts(cfg), "the model")
        model = build_model(cfg, task)
        model.load_state_dict(state["model"])
    except (KeyError, RuntimeError, TypeError, ValueError) as err:
        raise does_not_fit(path, err) from None
    return cfg, task, model.to(device).eval(), state["step"]


def check_representable(cfg, task: Task, max_len: int) -> None:
    """Lengths up to `max_len` need positions the model has: say so instead of crashing."""
    short = positions_short(cfg.model, task, task.max_source_len(max_len))
    if short is not None:
        key, limit, needed = short
        raise MinitfmError(f"--max-len {max_len} needs {needed} positions but this model's "
                           f"positions stop at {key} ({limit}); evaluate up to a shorter length")


def evaluate_run(run, checkpoint: str = "best", samples: int = 1000, min_len: int | None = None,
                 max_len: int | None = None, seed: int | None = None,
                 batch_size: int = EVAL_BATCH_SIZE) -> dict:
    """`minitfm eval`: decode held-out data with a run's checkpoint; a JSON-ready report."""
    path = resolve_checkpoint(run, checkpoint)
    device = default_device()
    cfg, task, model, step = load_model(path, device)
    return eval_report(cfg, task, model, device, path, step, samples=samples, min_len=min_len,
                       max_len=max_len, seed=seed, batch_size=batch_size)


def eval_report(cfg, task: Task, model, device, path, step: int, *, samples: int = 1000,
                min_len: int | None = None, max_len: int | None = None, seed: int | None = None,
                batch_size: int = EVAL_BATCH_SIZE) -> dict:
    """The report of `evaluate_run` for a model already loaded from the checkpoint `path`."""
    lo = min_len if min_len is not None else cfg.task.min_len
    hi = max_len if max_len is not None else max(cfg.task.max_len, lo)
    if lo > hi:
        raise MinitfmError(f"--min-len ({lo}) must be <= --max-len ({hi})")
    check_representable(cfg, task, hi)
    check_fits(decoding_parts(cfg, samples, hi, batch_size), "evaluation")
    pairs = eval_set(task, samples, cfg.task.eval_seed if seed is None else seed, lo, hi)
    result = evaluate(model, task, pairs, device, batch_size)
    unknown = task.count_unknown(pairs)  # pairs: symbols never trained on, read as <unk>
    return {**result.as_dict(), "checkpoint": str(path), "step": step, "task": cfg.task.name,
            "trained_lengths": [cfg.task.min_len, cfg.task.max_len],
            **({} if unknown is None else {"unknown_symbols": unknown})}


def eval_tables(report: dict) -> list:
    """A rich table per length (count, exact match, token accuracy) and the totals."""
    from rich.table import Table

    lo, hi = report["trained_lengths"]
    table = Table(title=f"{report['task']} · {report['checkpoint']} · step {report['step']}")
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
    return [table]


@dataclass
class Predictions:
    """What `predict` gives: a row per input decoded, in order, up to the first bad input."""

    rows: list[dict]
    warning: str | None = None  # inputs longer than the trained lengths
    error: MinitfmError | None = None  # the first input that could not be read


def predict_texts(run, checkpoint: str, lines: list[tuple[int, str]],
                  where: str = "input") -> Predictions:
    """`minitfm predict`: decode (number, text) lines with a run's checkpoint."""
    path = resolve_checkpoint(run, checkpoint)
    device = default_device()
    cfg, task, model, _ = load_model(path, device)
    if not lines:
        raise MinitfmError("no input: give INPUT arguments or pipe one input per line on stdin")
    return predict_lines(cfg, task, model, device, lines, where)


def predict_lines(cfg, task: Task, model, device, lines: list[tuple[int, str]],
                  where: str = "input") -> Predictions:
    """Parse lines up to the first bad one (its error names `where` and its number), decode
    those, and write each output as its input is written ("12+34" -> "46")."""
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
    outputs = predict(model, task, sources, device)
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
    """Longest input (tokens) the model has positions for (see `positions_short`); None: any."""
    n = cfg.model.max_len
    if positions_short(cfg.model, task, n + 1) is None:  # even past model.max_len: no end
        return None
    while n > 0 and positions_short(cfg.model, task, n) is not None:
        n -= 1
    return n
