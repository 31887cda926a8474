"""Honest metrics: free-running greedy decoding that never sees the target.

- exact match: the whole predicted sequence equals the target, length included.
- token accuracy: position-wise agreement with the target, where a missing or an extra
  token counts as wrong: sum over sequences of matches / sum of max(len(pred), len(target)).
- loss: teacher-forced cross-entropy per target token (EOS included), PAD ignored.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from minitfm.book.model import eval_mode, greedy_decode, sequence_loss
from minitfm.config import EVAL_BATCH_SIZE  # sequences decoded at once (why 250: there)
from minitfm.tasks.base import Task, make_batch

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


def length_chunks(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped by length into chunks of `batch_size`: similar lengths pad less, and a
    chunk of short inputs stops decoding early."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def predict(model, task: Task, sources: list[list[int]], device,
            batch_size: int = EVAL_BATCH_SIZE, use_cache: bool = True) -> list[list[int]]:
    """Greedy-decode each source; the target is never looked at. Outputs keep the input order."""
    out = [[] for _ in sources]
    for chunk in length_chunks([len(s) for s in sources], batch_size):
        src = make_batch([(sources[i], []) for i in chunk], task.vocab).src.to(device)
        decoded = decode_chunk(model, task, src, [len(sources[i]) for i in chunk], use_cache)
        for i, row in zip(chunk, decoded):
            out[i] = row
    return out


def decode_chunk(model, task: Task, src, lengths: list[int], use_cache: bool = True,
                 encoded=None) -> list[list[int]]:
    """Greedy-decode one chunk of padded sources (B, S) whose lengths are `lengths`, each up to
    the longest target its own length allows (+ EOS); the outputs without EOS. `encoded`: see
    greedy_decode.

    The chunk decodes as long as its longest cap; decoding is causal, so a row's first tokens
    do not depend on how long that is, and each row is cut at its own cap: an answer is the one
    its input gets alone, whatever else shares the chunk."""
    vocab = task.vocab
    caps = [task.max_target_len(n) + 1 for n in lengths]  # + EOS
    tokens = greedy_decode(model, src, vocab, max(caps), use_cache, encoded)
    return [strip_eos(row[:cap], vocab.eos_id) for row, cap in zip(tokens.tolist(), caps)]


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
