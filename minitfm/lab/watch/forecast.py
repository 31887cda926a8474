"""The forecast, made from the gauges' readings (`gauges.py`) as a run trains: when exact match
will cross CLICK, and whether the run reaches its target.

A sequence is exactly right when each of its n target tokens and its EOS is, so with every token
right with probability p, exact match is mean(p^(n+1)) over the gauge pairs: the click and the
target are each a token accuracy to reach (`click_accuracy`). What drives p up is the learning
rate: the steps move the weights by about the lr each, and a decaying lr lets them settle, which
lifts the accuracy on its own (the loss of a run, Tissue et al. 2024, "Scaling law with learning
rate annealing": a power law of the area under the lr, minus a term in the annealing area, how
far the lr has come down summed over the steps). So the forecast draws a line of the logit of
token accuracy (its best so far: a high lr knocks single readings down) through the readings of
the last WINDOW of train.steps, against the area under the lr, plus ANNEALING_GAIN times the
annealing area (`Course`), and reads where that line, carried on to the schedule's end, reaches
the click accuracy and the target's. The line leaves out the first reading and those of the
warmup, where the model learns the easy part (which symbols come) in a climb too steep to last.
The target is forecast on course when the line reaches it with MARGIN of the run to spare, a
close call when later. No forecast in the warmup (the lr still rising) nor before FORECAST_FROM
of train.steps. On a task not in CALIBRATED (add, grokking's modadd, pairs of one's own...) it
says `uncalibrated for TASK:` before the line's words and gives its figures without a verdict.
How ANNEALING_GAIN and MARGIN were fitted, and how well the forecast did where it was measured
(`forecast_check.py`), is docs/looking-inside.md, "Watching it click" and "How well it forecasts".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minitfm.book.loop import lr_factor
from minitfm.config import TrainConfig
from minitfm.errors import percent

CLICK = 0.5  # the click: exact match crossing this
FORECAST_FROM = 0.2  # no forecast before this share of train.steps (nor in the warmup)
WINDOW = 0.25  # the forecast's line goes through the readings of the last quarter of train.steps
MARGIN = 0.125  # on course: the target forecast with this share of train.steps to spare
ANNEALING_GAIN = 8.2  # logit of token accuracy per unit of annealing area (fitted: the docs)
AREA_POINTS = 100_000  # Course sums the learning rate over at most this many steps
# The tasks whose runs the forecast was held against what came (docs/looking-inside.md, "How well
# it forecasts"): reverse, on which it was fitted, then sort and copy. On any other its words
# say "uncalibrated for TASK".
CALIBRATED = ("reverse", "sort", "copy")


@dataclass
class Forecast:
    """What a reading says of the click and of the run's end (see the module docstring)."""

    click_step: int | None  # the step it is forecast at, or was seen at (None: none in the run)
    clicked: bool  # seen: the latest readings' exact reached CLICK
    end_exact: float | None  # the exact match the line gives the run's last step
    target_step: int | None  # where it gives train.target_exact_match (None: not in the run)
    verdict: str | None  # of the target: on course (MARGIN to spare), close call, short, or
    # passed (on the gauges' pairs: the evaluations decide); None with no target, or no line yet.
    # Made on every task (the replay measures it), said only on those in CALIBRATED
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
    areas, the token accuracies (as logits) of the click and of the target, and its task."""

    def __init__(self, train: TrainConfig, lengths: list[int], task: str) -> None:
        self.train, self.steps, self.lengths, self.task = train, train.steps, lengths, task
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


def gauge_readings(records: list[dict[str, Any]], last: int) -> list[tuple[int, float, float]]:
    """The readings (step, exact, token accuracy) a forecast is made from, out of a run's
    records of metrics.jsonl (`curves.read_metrics`: exact and token accuracy within 0..1):
    one per step from 1 to `last` (train.steps; a resumed run's step), the last written of a
    step, in step order. A record past `last` (a hand edit, a damaged copy) is left out."""
    by_step = {r["step"]: (r["step"], r["exact"], r["token_accuracy"]) for r in records
               if r["split"] == "gauges" and 1 <= r["step"] <= last}
    return [by_step[step] for step in sorted(by_step)]


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
    click = history[-streak][0] if streak else \
        first_step(line, course.click_logit, now, course.steps)
    verdict = None if target is None else "passed" if exact_now >= target else None \
        if line is None else "short" if target_step is None \
        else "on course" if target_step <= (1 - MARGIN) * course.steps else "close call"
    if verdict == "passed":
        target_step = now
    forecast = Forecast(click, bool(streak), end, target_step, verdict, "")
    forecast.text = forecast_words(forecast, exact_now, course, ended=line is None or
                                   verdict == "passed" or now >= course.steps)
    return forecast


def forecast_words(forecast: Forecast, exact_now: float, course: Course, ended: bool) -> str:
    """The forecast as the progress line says it: what the readings show (`clicked at step 160
    (gauges: 70% exact)`: `exact_now`, the latest reading's), then what the line says of the
    click and, unless `ended` (no line, the target passed, the run's last step), of the end. On
    a task the forecast was never measured on (not in CALIBRATED) the line's words come behind
    `uncalibrated for TASK:`, with its figures and no verdict: `uncalibrated for modadd: click
    expected ~step 7767, 99% ~step 7974`."""
    target = course.train.target_exact_match
    gauges = f"(gauges: {share(exact_now)} exact" + \
        (f", past {percent(target)}: an evaluation decides)" if forecast.verdict == "passed"
         else ")")
    if forecast.clicked:
        seen, ahead = f"clicked at step {forecast.click_step} {gauges}", []
    else:  # a target below the click passed with no click yet: said after the click's words
        seen = None
        ahead = [(f"click expected ~step {forecast.click_step}" if forecast.click_step is not None
                  else f"no click by the run's end (step {course.steps})")
                 + (f" {gauges}" if forecast.verdict == "passed" else "")]
    calibrated = course.task in CALIBRATED
    if not ended:
        ahead.append(ending_words(forecast.end_exact, target, forecast.target_step,
                                  forecast.verdict if calibrated else None, course.steps))
    caveat = "" if calibrated else f"uncalibrated for {course.task}: "
    said = ([seen] if seen else []) + ([caveat + ", ".join(ahead)] if ahead else [])
    return ", ".join(said)


def ending_words(end: float, target: float | None, target_step: int | None,
                 verdict: str | None, steps: int) -> str:
    """How the forecast says the run ends: `on course for 99% ~step 225`, `close call: 99%
    ~step 270 of 280` (in the run's last MARGIN), `short of 99%: ~85% at the end`; with no
    verdict to give (no target, an uncalibrated task), the line's figure alone: `99% ~step 225`,
    `~85% at the end`."""
    if verdict == "on course":
        return f"on course for {percent(target)} ~step {target_step}"
    if verdict == "close call":
        return f"close call: {percent(target)} ~step {target_step} of {steps}"
    if verdict == "short":
        return f"short of {percent(target)}: ~{share(end)} at the end"
    if target_step is not None:
        return f"{percent(target)} ~step {target_step}"
    return f"~{share(end)} at the end"


def share(exact: float) -> str:
    """An exact match as the forecast writes it: `85%`, near the top `98.5%`, at most `99.9%`
    (a line carried on to the end may give 100%, which no run can promise)."""
    return f"{min(exact, 0.999):.1%}" if exact >= 0.95 else f"{exact:.0%}"
