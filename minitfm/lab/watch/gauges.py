"""Gauges: what moves inside a run while its exact match sits flat, read while it trains.

Every log.gauge_every steps, one teacher-forced pass with attention over the first
GAUGE_SAMPLES held-out pairs (those the attention scores use; no gradient) makes a `Reading`, a
line of metrics.jsonl (split `gauges`) with the forecast made from it (`forecast.py`):

- `exact`: the share of pairs whose every target token and EOS is the pass's argmax. A greedy
  decoder writes exactly those tokens (each step's argmax, given a right prefix), so this is
  greedy exact match, near-ties aside, without decoding;
- `loss`: the mean cross-entropy per output token (EOS included), as an evaluation's;
- `token_accuracy`, and `positions`: the token accuracy at each output position (0 = the first
  token written; EOS at its own position);
- `hard_loss`: the mean cross-entropy of the hardest HARD_SHARE of output positions;
- `align`: for tasks with an ideal alignment (`task.alignment`), the best cross-attention
  head's alignment score (`probe`), as visualize-attention and TensorBoard's `4_alignment/best`
  give it; `heads` has every head's; `coverage`: for each output row the most weight any head of
  a layer puts on the ideal position, averaged over rows, in the best layer. For add a row's
  ideal is a pair of positions (`add_keys`: both operands' digits of the significance it
  writes). None for pairs of one's own;
- `weight_norm`: the L2 norm of all weight matrices (what weight decay shrinks);
- whatever the task's own gauges add (`TASK_GAUGES`).

Why these move before exact match does, and what they showed on the default run, is
docs/looking-inside.md, "Watching it click".

Shapes: B batch (the gauge pairs), T output positions (target + EOS), S source len, L layers,
H n_heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from minitfm.lab.attention.probe import ALIGNMENT_SAMPLES, LatestPass, has_alignment
from minitfm.lab.curves import read_metrics
from minitfm.lab.watch.forecast import Course, Forecast, gauge_readings, make_forecast
from minitfm.lab.watch.grokking import modadd_gauges
from minitfm.run.instruments import GaugesDue, Instrument, Started, append_metrics
from minitfm.tasks.base import Pair, Task

GAUGE_SAMPLES = ALIGNMENT_SAMPLES  # held-out pairs a reading runs through the model
HARD_SHARE = 0.25  # hard_loss: the mean loss of this share of positions, the hardest ones
# A task's own gauges, by task name: a function of the model and the task to named numbers.
TASK_GAUGES: dict[str, Callable[[torch.nn.Module, Task], dict[str, float]]] = {
    "modadd": modadd_gauges,  # grokking's: train_exact, restricted/excluded loss, sparsity
}
# The gauge the progress line shows, by task name, where it is none of the usual (`shown`):
# in grokking's plateau it is the Fourier sparsity that moves.
SHOWN = {"modadd": ("fourier_sparsity", "sparsity")}


@dataclass
class Reading:
    """The gauges at one step (see the module docstring)."""

    step: int
    exact: float
    loss: float
    token_accuracy: float
    positions: list[float]
    hard_loss: float
    align: float | None  # the best head's alignment score
    coverage: float | None  # the best layer's coverage of the ideal alignment
    heads: list[list[float]] | None  # (L, H) each cross-attention head's alignment score
    weight_norm: float
    extra: dict[str, float] = field(default_factory=dict)  # the task's own (TASK_GAUGES)
    forecast: Forecast | None = None  # made from this reading and those before it

    def record(self) -> dict[str, Any]:
        """The line of metrics.jsonl: split `gauges`, the task's own gauges beside the rest."""
        values = asdict(self)  # the forecast as a dict, or None
        extra = values.pop("extra")
        return {"step": self.step, "split": "gauges", **{k: v for k, v in values.items()
                                                         if k != "step"}, **extra}


@torch.no_grad()
def read_gauges(model: torch.nn.Module, task: Task, pairs: list[Pair], step: int,
                passes: LatestPass | None = None) -> Reading:
    """The gauges of `model` on `pairs` (held-out), from one teacher-forced pass (the one the
    attention snapshot of the same step makes, through `passes`)."""
    forced = (passes or LatestPass()).at(step, model, task, pairs)
    logits, maps = forced.logits, forced.maps  # (B, T, V)
    targets = forced.batch.tgt_out  # (B, T): target + EOS, PAD after
    valid = targets != task.vocab.pad_id
    right = (logits.argmax(-1) == targets) & valid
    losses = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none",
                             ignore_index=task.vocab.pad_id)  # (B, T), 0 at PAD
    counts = valid.sum(0)  # (T,) pairs with an output at each position
    seen = counts > 0
    position_loss = (losses.sum(0)[seen] / counts[seen])  # (T',) mean loss at each position
    hardest = position_loss.topk(max(1, round(HARD_SHARE * len(position_loss)))).values
    coverage, heads = alignment(maps.cross, task, pairs, targets.size(1))
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    return Reading(
        step=step,
        exact=float((right | ~valid).all(1).float().mean()),
        loss=float(losses.sum() / valid.sum()),
        token_accuracy=float(right.sum() / valid.sum()),
        positions=(right.sum(0)[seen] / counts[seen]).tolist(),
        hard_loss=float(hardest.mean()),
        align=None if heads is None else max(max(layer) for layer in heads),
        coverage=coverage, heads=heads,
        weight_norm=float(torch.sqrt(sum((p.float() ** 2).sum() for p in matrices))),
        extra=TASK_GAUGES[task.name](model, task) if task.name in TASK_GAUGES else {})


def alignment(cross: list[Tensor], task: Task, pairs: list[Pair],
              T: int) -> tuple[float | None, list[list[float]] | None]:
    """The best layer's coverage of the ideal alignment and each head's score (see the module
    docstring); (None, None) for a task without an ideal alignment."""
    keys = ideal_keys(task, pairs, T, cross[0].size(-1))
    if keys is None:
        return None, None
    keys = keys.to(cross[0].device)
    rows = keys.any(-1).sum().clamp(min=1)  # output rows that have an ideal (EOS, PAD: none)
    coverage, heads = [], []
    for layer in cross:  # (B, H, T, S)
        mass = (layer.float() * keys[:, None]).sum(-1)  # (B, H, T): weight on the ideal keys
        coverage.append(float(mass.amax(1).sum() / rows))
        heads.append((mass.sum(dim=(0, 2)) / rows).tolist())
    return max(coverage), heads


def ideal_keys(task: Task, pairs: list[Pair], T: int, S: int) -> Tensor | None:
    """(B, T, S) True at the source positions each output row should read: the task's ideal
    position (`task.alignment`), or add's pair (`add_keys`); None for a task without."""
    if task.name == "add":
        rows = [add_keys(task, src, len(target)) for src, target in pairs]
    elif has_alignment(task, pairs):
        rows = [[[position] for position in task.alignment(src)] for src, _ in pairs]
    else:
        return None
    # the (pair, row, position) of every True, set in one indexing: one per pair and row costs
    # more than the model's whole pass over the pairs
    marks = [(b, t, s) for b, row in enumerate(rows) for t, positions in enumerate(row)
             for s in positions]
    keys = torch.zeros(len(pairs), T, S, dtype=torch.bool)
    if marks:
        keys[tuple(torch.tensor(marks).T)] = True
    return keys


def add_keys(task: Task, src: list[int], n_out: int) -> list[list[int]]:
    """For each digit of a sum (most significant first) the source positions of the operands'
    digits of its significance: in 47+85 -> 132, the 3 reads 4 and 8, the 2 reads 7 and 5, and
    the carry-out 1, which has no digits of its own, reads the leading 4 and 8."""
    plus = src.index(task.plus_id)
    length_a, length_b = plus, len(src) - plus - 1

    def digits(j: int) -> list[int]:  # positions of significance j (0: the units)
        return [plus - 1 - j] * (j < length_a) + [plus + length_b - j] * (j < length_b)

    return [digits(j) or digits(j - 1) for j in range(n_out - 1, -1, -1)]


class GaugeReader(Instrument):
    """Reads the gauges when the run says they are due, forecasts from them, appends each
    reading to metrics.jsonl and hands it (as `due.reading`) to the instruments after it:
    TensorBoard, the console."""

    def __init__(self, passes: LatestPass | None = None) -> None:
        self.passes = passes or LatestPass()  # shared with the attention recorder (`LatestPass`)
        self.task: Task | None = None
        self.pairs: list[Pair] = []
        self.run_dir = None
        self.course: Course | None = None
        self.history: list[tuple[int, float, float]] = []  # (step, exact, token accuracy)

    def on_start(self, run: Started) -> None:
        self.task, self.run_dir = run.task, run.run_dir
        self.pairs = run.eval_pairs[:GAUGE_SAMPLES]
        if self.pairs:
            self.course = Course(run.cfg.train, [len(t) + 1 for _, t in self.pairs],
                                 run.task.name)
        # a resumed run forecasts from its earlier readings too
        self.history = gauge_readings(read_metrics(run.run_dir), run.step) if run.step else []

    def on_gauges(self, due: GaugesDue) -> None:
        if self.task is None or not self.pairs:
            return
        reading = read_gauges(due.model, self.task, self.pairs, due.step, self.passes)
        self.history.append((reading.step, reading.exact, reading.token_accuracy))
        reading.forecast = make_forecast(self.history, self.course)
        record = reading.record()
        append_metrics(self.run_dir, record)
        due.reading.update(record, shown=shown(record, self.task))


def shown(record: dict, task: Task) -> tuple[str, float]:
    """The gauge the progress line shows, named: the task's own (`SHOWN`), else the best head's
    alignment, else (no ideal alignment) the token accuracy."""
    if task.name in SHOWN:
        key, name = SHOWN[task.name]
        return name, record[key]
    if record["align"] is not None:
        return "align", record["align"]
    return "tokens", record["token_accuracy"]
