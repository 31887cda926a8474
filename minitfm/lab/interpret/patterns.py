"""Where each attention head looks, named: a small family of patterns that fit algorithmic tasks.

A pattern gives each query row of a head the one key it would attend to, or none (-1) where it
has no such key: `mirror` gives cross-attention row t the source position n-1-t. How well a head
fits a pattern is its alignment score (`probe.alignment_score`, the definition
`visualize-attention` uses): the mean weight the head puts on the pattern's key over the rows
that have one, on teacher-forced maps of the true targets; its hard form, the share of those
rows whose strongest key it is.

The family, by kind of attention (n: source length, i or t: the query's position):

- cross-attention (row t writes output t): `mirror` n-1-t, `same` t, `offset -2..+2` t+k, `content`
  the source position the task's own rule picks (`task.alignment`: by value in sort, say), and
  the sinks `first` 0 and `last` n-1;
- encoder self-attention: `current` i, `previous` i-1, `next` i+1, `mirror` n-1-i, `first`, `last`;
- decoder self-attention: `current` t, `previous` t-1, `first` (the `<bos>` it starts from).

A head is named after the pattern it fits best (the highest alignment score) when that pattern's
key is the strongest in at least half of its rows (`FITS`) and holds at least `WEIGHT` of its
attention: a head that leans towards a key but spreads most of its weight elsewhere is not
that pattern's. Otherwise it is `diffuse` when its
rows spread out (on average no key gets half of a row's weight) and `unclear` when they focus
on keys no pattern of the family names.

Shapes: B batch, L layers, H n_heads, T_q and T_k query and key len.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from minitfm.book.model import eval_mode
from minitfm.lab.attention.probe import KINDS, alignment_score
from minitfm.tasks.base import Pair, Task, make_batch

FITS = 0.5  # a head is named after a pattern whose key is the strongest in this share of rows
WEIGHT = 0.4  # ... and that holds this share of its weight (the alignment score)
OFFSETS = (-2, -1, 1, 2)
FAMILY = {
    "encoder": ("current", "previous", "next", "mirror", "first", "last"),
    "decoder": ("current", "previous", "first"),
    "cross": ("mirror", "same", *(f"offset {k:+d}" for k in OFFSETS), "first", "last",
              "content"),  # last: where the task's rule is a position pattern, that one wins
}
PHRASES = {
    "mirror": "reads the mirrored position (n-1-i)", "same": "reads the same position (i)",
    "current": "attends to its own position", "previous": "attends to the token before it",
    "next": "attends to the token after it", "first": "rests on the first token (a sink)",
    "last": "rests on the last token (a sink)",
    "content": "reads the source token the task's rule picks (by value)",
    **{f"offset {k:+d}": f"reads the source position i{k:+d}" for k in OFFSETS},
    "diffuse": "spreads its attention (diffuse)", "unclear": "pattern unclear",
}


def pattern_keys(name: str, row: int, n: int, rule: list[int] | None) -> int:
    """The key `name` gives query row `row` of a sequence with n keys (-1: none); `rule` is
    the task's alignment, for `content`."""
    if name.startswith("offset"):
        key = row + int(name.split()[1])
    else:
        key = {"current": row, "same": row, "previous": row - 1, "next": row + 1,
               "mirror": n - 1 - row, "first": 0, "last": n - 1,
               "content": rule[row] if rule is not None and row < len(rule) else -1}[name]
    return key if 0 <= key < n else -1


@dataclass
class HeadPattern:
    """One head's best fit in the family: its name, scores and how focused its rows are."""

    kind: str
    layer: int
    head: int
    pattern: str  # a name of FAMILY[kind], "diffuse" or "unclear"
    best_fit: str  # the family's best pattern, also when it holds less than FITS
    score: float  # the best fit's alignment score (mean weight on its keys)
    rows: float  # the share of rows whose strongest key is the best fit's (hard score)
    focus: float  # the mean over rows of the largest weight (1: one key a row)

    @property
    def phrase(self) -> str:
        return PHRASES[self.pattern]


@torch.no_grad()
def teacher_forced_maps(model, task: Task, pairs: list[Pair]):
    """The maps of one teacher-forced pass on the true targets, the batch, and the valid rows
    per kind (B, T_q): source tokens for the encoder, written tokens (EOS too) otherwise."""
    batch = make_batch(pairs, task.vocab).to(next(model.parameters()).device)
    with eval_mode(model):
        _, maps = model(batch.src, batch.tgt_in, return_attention=True)
    written = batch.tgt_out != task.vocab.pad_id  # (B, T)
    valid = {"encoder": batch.src != task.vocab.pad_id, "decoder": written, "cross": written}
    return maps, valid


def ideal_keys(kind: str, name: str, task: Task, pairs: list[Pair], shape) -> Tensor:
    """The key of every row of every pair under pattern `name` (B, T_q); -1 where none."""
    rows, keys = shape
    ideal = torch.full((len(pairs), rows), -1, dtype=torch.long)
    for b, (src, _) in enumerate(pairs):
        rule = task.alignment(src) if name == "content" else None
        for row in range(rows):
            n = row + 1 if kind == "decoder" else len(src)  # causal: keys 0..t
            ideal[b, row] = pattern_keys(name, row, min(n, keys), rule)
    return ideal


def head_patterns(model, task: Task, pairs: list[Pair]) -> list[HeadPattern]:
    """Every head of every kind and layer with its pattern, from one teacher-forced pass."""
    maps, valid = teacher_forced_maps(model, task, pairs)
    patterns = []
    for kind in KINDS:
        family = [name for name in FAMILY[kind]
                  if name != "content" or task.alignment(pairs[0][0]) is not None]
        rows = valid[kind].cpu()  # (B, T_q)
        shape = getattr(maps, kind)[0].shape[2:]
        ideals = {name: torch.where(rows, ideal_keys(kind, name, task, pairs, shape), -1)
                  for name in family}  # padded rows have no key
        for layer, weights in enumerate(getattr(maps, kind)):  # (B, H, T_q, T_k)
            weights = weights.float().cpu()
            soft = {name: alignment_score(weights, ideal) for name, ideal in ideals.items()}
            hard = {name: alignment_score(weights, ideal, hard=True)
                    for name, ideal in ideals.items()}
            focus = (weights.amax(-1) * rows[:, None, :]).sum((0, 2)) / rows.sum()  # (H,)
            for head in range(weights.size(1)):
                scores = {name: float(soft[name][head]) for name in family}
                best = max(family, key=scores.__getitem__)  # the first on ties
                score = scores[best]
                named = float(hard[best][head]) >= FITS and score >= WEIGHT
                name = best if named else \
                    "diffuse" if float(focus[head]) < FITS else "unclear"
                patterns.append(HeadPattern(kind, layer, head, name, best, score,
                                            float(hard[best][head]), float(focus[head])))
    return patterns


def mean_maps(model, task: Task, pairs: list[Pair]) -> dict[tuple[str, int], Tensor]:
    """Each layer's maps (H, T_q, T_k) averaged over the pairs of the commonest shape (source
    and target lengths; the longer on ties): what a role card draws."""
    shapes = [(len(src), len(tgt)) for src, tgt in pairs]
    common = max(set(shapes), key=lambda shape: (shapes.count(shape), shape))
    chosen = [pair for pair, shape in zip(pairs, shapes, strict=True) if shape == common]
    maps, _ = teacher_forced_maps(model, task, chosen)
    return {(kind, layer): weights.float().mean(0).cpu()
            for kind in KINDS for layer, weights in enumerate(getattr(maps, kind))}
