"""When a run does what between the loop's steps, and how it reads their losses.

The book's loop evaluates every train.eval_every steps. The rest is the run's cadence: a train
line every log.log_every steps, quick checks near the target (`check_due`), a look at the
attention every log.attention_every steps (`attention_every`), the gauges every
log.gauge_every steps (lab/watch/gauges.py), and `last.pt` after each evaluation and every
train.checkpoint_every steps. `LossMeter` reads the steps' losses only when one of those comes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from minitfm.book.loop import due
from minitfm.config import Config, TrainConfig
from minitfm.errors import RunFailed


def train_line_due(step: int, cfg: Config) -> bool:
    """A train line after `step`: every log.log_every steps."""
    return step % cfg.log.log_every == 0


def check_due(step: int, cfg: TrainConfig, best_exact_match: float) -> bool:
    """A quick check after `step`: every train.check_every steps between evaluations, once an
    evaluation reached two thirds of train.target_exact_match. When a check sees the target, a
    full evaluation runs at once; so a run stops within check_every steps of reaching its
    target, not eval_every. Far from the target a check would find nothing: on the default task
    exact match climbs from about 50% to 99% over the last 100 steps, so checks begin after the
    evaluation that reads 70-90%."""
    target = cfg.target_exact_match
    near = target is not None and best_exact_match >= target * 2 / 3
    return near and due(step, cfg.check_every) and not due(step, cfg.eval_every)


def check_pairs(pairs: list) -> list:
    """The held-out pairs a quick check decodes: the first fifth (at least one)."""
    return pairs[:max(len(pairs) // 5, 1)]


def attention_every(cfg: Config) -> int:
    """Steps between attention snapshots: log.attention_every, or train.eval_every for `eval`."""
    every = cfg.log.attention_every
    return cfg.train.eval_every if every == "eval" else every


def save_due(step: int, cfg: Config, evaluated: bool) -> bool:
    """`last.pt` after `step`: after each evaluation (a kill -9 then loses little), and every
    train.checkpoint_every steps."""
    return evaluated or due(step, cfg.train.checkpoint_every)


def same_losses(losses: Tensor) -> Tensor:
    """One process alone: its losses are the run's."""
    return losses


class LossMeter:
    """Mean loss and target tokens/s of the training steps since the last train line; stops a
    run whose loss is not finite.

    The step's loss stays an unread tensor on its device: reading a CUDA tensor makes the CPU
    wait for the GPU, so `read` fetches the losses of many steps at once (every log.log_every
    steps, and before anything is evaluated or saved) and names the first non-finite one.
    """

    def __init__(self, step: int, cfg: TrainConfig,
                 shared: Callable[[Tensor], Tensor] = same_losses, workbook: str | None = None):
        self.unread: list[Tensor] = []  # 0-dim losses of the steps after `self.step`
        self.workbook = workbook  # a learner's code trains: a suspect the message names
        self.step = step  # the last step whose loss was read
        self.cfg = cfg
        self.shared = shared  # this process's losses as the run's (under torchrun, their mean)
        self.losses: list[float] = []  # read since the last train line
        self.tokens = 0
        self.since = time.perf_counter()

    def add(self, loss: Tensor, tokens: int) -> None:
        """One step's loss (unread) and its number of target tokens."""
        self.unread.append(loss)
        self.tokens += tokens

    def read(self) -> None:
        """Fetch the unread losses (one wait for the device); RunFailed at a non-finite one."""
        if not self.unread:
            return
        values = self.shared(torch.stack(self.unread)).tolist()  # (steps,)
        first = self.step + 1  # the step of values[0]
        self.unread, self.step = [], self.step + len(values)
        for i, value in enumerate(values):
            if not math.isfinite(value):
                cfg = self.cfg
                clip = "" if cfg.grad_clip is not None else " or set train.grad_clip (e.g. 1.0)"
                yours = (f", or your code: minitfm learn check {self.workbook}"
                         if self.workbook else "")
                raise RunFailed(f"loss became {value} at step {first + i}: lower train.lr "
                                f"({cfg.lr}){clip}{yours}; no checkpoint was written for it")
        self.losses += values

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Time spent in this block (evaluations, pictures, saves) is not counted as the
        steps': the train line's tokens/s measures training steps only."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.since += time.perf_counter() - start

    def flush(self, tokens: float | None = None) -> dict[str, float]:
        """The train line's loss and tokens/s (after `read`), and a fresh start for the next;
        `tokens` counts those of every process when several train together (default: ours)."""
        now = time.perf_counter()
        tokens = self.tokens if tokens is None else tokens
        record = {"loss": sum(self.losses) / max(len(self.losses), 1),
                  "tokens_per_s": tokens / max(now - self.since, 1e-9)}
        self.losses, self.tokens, self.since = [], 0, now
        return record
