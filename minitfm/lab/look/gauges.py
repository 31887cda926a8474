"""Gauges: what moves inside a run while its exact match sits flat, read while it trains.

The default run is a phase change: exact match near 10% at step 100, above 90% at step 200. Two
things hide under that jump. The first is arithmetic: a sequence is exactly right only when
every one of its tokens is, so its exact match is about the product of its tokens' accuracies,
and a token accuracy that climbs steadily from 80% to 99% takes a 16-token exact match from 3%
to 85%. The second is the mechanism: a reverse model can only write output t once some
cross-attention head reads source position n-1-t, and that alignment forms gradually, long
before the outputs come out right. Progress measures of this kind move smoothly while the
accuracy that everyone watches sits flat (Nanda et al. 2023, "Progress measures for grokking via
mechanistic interpretability"; Barak et al. 2022, "Hidden progress in deep learning").

Every log.gauge_every steps, one teacher-forced pass with attention over the first
GAUGE_SAMPLES held-out pairs (those the attention scores use; no gradient) reads:

- `exact`: the share of pairs whose every target token and EOS is the pass's argmax. A greedy
  decoder writes exactly those tokens (each step's argmax, given a right prefix), so this is
  greedy exact match, near-ties aside, without decoding;
- `loss`: the mean cross-entropy per output token (EOS included), as an evaluation's;
- `token_accuracy`, and `positions`: the token accuracy at each output position (0 = the first
  token written; EOS at its own position);
- `hard_loss`: the mean cross-entropy of the hardest quarter of output positions;
- `align`: for tasks with an ideal alignment (`task.alignment`: the diagonal for copy, the
  anti-diagonal for reverse, rank order for sort), the best cross-attention head's alignment
  score (`probe`: the mean weight it puts on the ideal source position), as visualize-attention
  and TensorBoard's `4_alignment/best` give it; `heads` has every head's. Heads share the work
  (one reads the first outputs, another the rest), so `coverage` says how well a layer reads
  what it must: for each output row the most weight any head of the layer puts on the ideal
  position, averaged over rows, in the best layer. For add, whose output digit is the sum of
  two digits and a carry, the ideal of a row is a pair of positions (`add_keys`): both
  operands' digits of the significance it writes (the carry-out digit, a sum's extra leading
  1: both leading digits), and a head's score is the weight it puts on the pair. None for pairs
  of one's own;
- `weight_norm`: the L2 norm of all weight matrices (what weight decay shrinks);
- whatever the task's own gauges add (`TASK_GAUGES`).

The forecast: when exact match will cross CLICK, and whether the run reaches its target. A
sequence is exactly right when each of its n target tokens and its EOS is, so with every token
right with probability p, exact match is mean(p^(n+1)) over the gauge pairs: 50% at p = 92.3%
for lengths 1..16 (the click accuracy; measured at the click of 80 default runs: 91.6% at the
median), 99% at p = 99.9% (the target's). What drives p up is the learning rate: the steps move
the weights by about the lr each, and a decaying lr lets them settle, which lifts the accuracy
on its own (the loss of a run, Tissue et al. 2024, "Scaling law with learning rate annealing": a
power law of the area under the lr, minus a term in the annealing area, how far the lr has come
down summed over the steps). So the forecast draws a line of the logit of token accuracy (its
best so far: a high lr knocks single readings down) through the readings of the last quarter of
train.steps, against the area under the lr, plus ANNEALING_GAIN times the annealing area
(`Course`), and reads where that line, carried on to the schedule's end, reaches the click
accuracy and the target's. The line leaves out the first reading and those of the warmup, where
the model learns the easy part (which symbols come) in a climb too steep to last.
ANNEALING_GAIN was fitted to 96 runs of the reverse task (the 240 steps of the default then, 150
and 100 steps, lr 0.002; 2026-11-29); the runs it was measured on after that are others
(docs/looking-inside.md, "How well it forecasts"). The target is forecast on course when the
line reaches it with MARGIN of the run to spare: in the 26 of those runs that reached it, it came
later than the line said by 4% of the run at the median and 11% at the latest, so a target in
the run's last eighth is a close call. No forecast in the warmup
(the lr still rising) nor before a fifth of train.steps. `lab/look/forecasts.py` measures how
well it forecasts, over finished runs.

Shapes: B batch (the gauge pairs), T output positions (target + EOS), S source len, L layers,
H n_heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from minitfm.book.loop import lr_factor
from minitfm.config import TrainConfig
from minitfm.errors import percent
from minitfm.lab.curves import read_metrics
from minitfm.lab.look.grokking import modadd_gauges
from minitfm.lab.look.probe import ALIGNMENT_SAMPLES, LatestPass, has_alignment
from minitfm.run.files import append_metrics
from minitfm.run.instruments import GaugesDue, Instrument, Started
from minitfm.tasks.base import Pair, Task

GAUGE_SAMPLES = ALIGNMENT_SAMPLES  # held-out pairs a reading runs through the model
HARD_SHARE = 0.25  # hard_loss: the mean loss of this share of positions, the hardest ones
CLICK = 0.5  # the click: exact match crossing this
FORECAST_FROM = 0.2  # no forecast before this share of train.steps (nor in the warmup)
WINDOW = 0.25  # the forecast's line goes through the readings of the last quarter of train.steps
MARGIN = 0.125  # on course: the target forecast with this share of train.steps to spare
ANNEALING_GAIN = 8.2  # logit of token accuracy per unit of annealing area (measured: docstring)
AREA_POINTS = 100_000  # Course sums the learning rate over at most this many steps
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


# --- the forecast ---

@dataclass
class Forecast:
    """What a reading says of the click and of the run's end (see the module docstring)."""

    click_step: int | None  # the step it is forecast at, or was seen at (None: none in the run)
    clicked: bool  # seen: the latest readings' exact reached CLICK
    end_exact: float | None  # the exact match the line gives the run's last step
    target_step: int | None  # where it gives train.target_exact_match (None: not in the run)
    verdict: str | None  # of the target: on course (MARGIN to spare), close call, short, or
    # passed (on the gauges' pairs: the evaluations decide); None with no target, or no line yet
    text: str  # for the progress line


def all_right(accuracy: float, lengths: list[int]) -> float:
    """Exact match if each of a pair's tokens (`lengths`: how many each pair must get right, EOS
    included) is right with probability `accuracy`, independently: mean(accuracy^n)."""
    return sum(accuracy ** n for n in lengths) / len(lengths)


def click_accuracy(lengths: list[int], click: float = CLICK) -> float:
    """The token accuracy at which `all_right` is `click`: bisection on a function that rises
    with the accuracy."""
    low, high = 0.0, 1.0
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if all_right(middle, lengths) < click else (low, middle)
    return (low + high) / 2


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


class Course:
    """What the forecast knows of a run before it starts: its learning-rate schedule's two
    areas, and the token accuracies (as logits) of the click and of the target."""

    def __init__(self, train: TrainConfig, lengths: list[int]) -> None:
        self.train, self.steps, self.lengths = train, train.steps, lengths
        self.click_logit = logit(click_accuracy(lengths))
        target = train.target_exact_match
        self.target_logit = None if target is None else logit(click_accuracy(lengths, target))
        # sum_{s < t} lr(s), on a grid of at most AREA_POINTS steps (every step, in most runs)
        self.stride = -(-self.steps // AREA_POINTS)
        self.sums = [0.0]
        for s in range(0, self.steps, self.stride):
            self.sums.append(self.sums[-1] + self.stride * self.lr(s))

    def lr(self, step: int) -> float:
        return self.train.lr * lr_factor(step, self.train)

    def lr_area(self, t: int) -> float:
        """The area under the learning rate before step t: the distance the steps could go."""
        k = min(t // self.stride, len(self.sums) - 1)
        return self.sums[k] + (t - k * self.stride) * self.lr(k * self.stride)

    def annealing_area(self, t: int) -> float:
        """The area between the peak learning rate and the learning rate, from the end of the
        warmup to step t: how far the decay has brought the lr down, summed over the steps."""
        warmup = min(self.train.warmup_steps, t)
        return self.train.lr * (t - warmup) - (self.lr_area(t) - self.lr_area(warmup))

    def exact(self, y: float) -> float:
        """Exact match if every token is right with the probability whose logit is y."""
        return all_right(1 / (1 + math.exp(-y)), self.lengths)


def fit_line(history: list[tuple[int, float, float]],
             course: Course) -> Callable[[int], float] | None:
    """The logit of token accuracy the run will have at step t, as a function of t, fitted to
    the readings (step, exact, token accuracy) so far; None while it is too early."""
    now = history[-1][0]
    if now < max(course.train.warmup_steps, FORECAST_FROM * course.steps):
        return None
    best, points = -math.inf, []
    for step, _, accuracy in history:
        best = max(best, logit(accuracy))  # a high learning rate knocks single readings down
        points.append((step, best))
    # the first reading is mostly the untrained model's, and while the warmup's lr rises the
    # model learns the easy part (which symbols come) in a climb too steep to last
    points = [p for p in points[1:] if p[0] >= course.train.warmup_steps]
    recent = [p for p in points if p[0] > now - WINDOW * course.steps]
    points = points[-max(3, len(recent)):]
    if len(points) < 3:
        return None
    xs = [course.lr_area(s) for s, _ in points]
    ys = [y - ANNEALING_GAIN * course.annealing_area(s) for s, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    slope = max(slope, 0.0)  # a run does not unlearn: a falling line says "flat"

    def line(t: int) -> float:
        return (mean_y + slope * (course.lr_area(t) - mean_x)
                + ANNEALING_GAIN * course.annealing_area(t))
    return line


def first_step(line: Callable[[int], float], level: float, now: int, steps: int) -> int | None:
    """The first step from `now` on where the line (which never falls) reaches `level`, if one
    comes by `steps`: bisection."""
    if line(steps) < level:
        return None
    low, high = now, steps
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if line(middle) < level else (low, middle)
    return low


def make_forecast(history: list[tuple[int, float, float]], course: Course) -> Forecast | None:
    """The forecast from readings (step, exact, token accuracy) so far; None while it is too
    early. A click is seen while the latest reading's exact is past CLICK (one knocked back
    below it forecasts again), from the first of that streak. A reading past the target has
    passed it on the gauges' pairs: the evaluations, on theirs, decide whether the run stops."""
    streak = 0
    while streak < len(history) and history[-1 - streak][1] >= CLICK:
        streak += 1
    now, exact_now = history[-1][0], history[-1][1]
    line = fit_line(history, course)
    if line is None and not streak:
        return None
    target = course.train.target_exact_match
    end = target_step = None
    if line is not None:
        end = course.exact(line(course.steps))
        if target is not None:
            target_step = first_step(line, course.target_logit, now, course.steps)
    if streak:
        click = history[-streak][0]
        words = f"clicked at step {click} (gauges: {share(exact_now)} exact"
    else:
        click = first_step(line, course.click_logit, now, course.steps)
        words = (f"click expected ~step {click}" if click is not None
                 else f"no click by the run's end (step {course.steps})")
    verdict = None if target is None else "passed" if exact_now >= target else None \
        if line is None else "short" if target_step is None \
        else "on course" if target_step <= (1 - MARGIN) * course.steps else "close call"
    if verdict == "passed":
        target_step = now
        words += f", past {percent(target)}: an evaluation decides)"
    elif streak:
        words += ")"
    if line is not None and verdict != "passed" and now < course.steps:
        words += ", " + ending_words(end, target, target_step, verdict, course.steps)
    return Forecast(click, bool(streak), end, target_step, verdict, words)


def ending_words(end: float, target: float | None, target_step: int | None,
                 verdict: str | None, steps: int) -> str:
    """How the forecast says the run ends: `on course for 99% ~step 225`, `close call: 99%
    ~step 270 of 280` (in the run's last MARGIN), `short of 99%: ~85% at the end`."""
    if verdict == "on course":
        return f"on course for {percent(target)} ~step {target_step}"
    if verdict == "close call":
        return f"close call: {percent(target)} ~step {target_step} of {steps}"
    if verdict == "short":
        return f"short of {percent(target)}: ~{share(end)} at the end"
    return f"~{share(end)} at the end"  # no target


def share(exact: float) -> str:
    """An exact match as the forecast writes it: `85%`, near the top `98.5%`, at most `99.9%`
    (a line carried on to the end may give 100%, which no run can promise)."""
    return f"{min(exact, 0.999):.1%}" if exact >= 0.95 else f"{exact:.0%}"


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
            self.course = Course(run.cfg.train, [len(t) + 1 for _, t in self.pairs])
        # a resumed run forecasts from its earlier readings too
        self.history = [(r["step"], r["exact"], r["token_accuracy"])
                        for r in read_metrics(run.run_dir)
                        if r["split"] == "gauges" and r["step"] <= run.step] if run.step else []

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
