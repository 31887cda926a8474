"""The training loop: AdamW, warmup + decay, one step, evaluation and early stopping.

One step: sample a batch from the task's training stream, teacher-forced cross-entropy on
`target + EOS` (PAD ignored), backward, the scheduled lr, clip and AdamW step. Every random draw
comes from a state that the checkpoint saves (torch's RNG for init and dropout, the data
generator), so N straight steps and N/2 + resume give bit-identical losses.

The loop itself does three things: a step, a greedy evaluation every train.eval_every steps,
and early stopping once an evaluation reaches train.target_exact_match. Whatever else a run does
between steps (train lines, checkpoints, pictures, signals) is the run's: the loop tells it
through three events (`Events`), as minGPT's `Trainer` calls its callbacks, and
`minitfm.run.session.Training` does the rest.

Shapes: B batch, T target length, V vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from minitfm.book.model import Seq2SeqTransformer, sequence_loss
from minitfm.book.optim import AdamW
from minitfm.config import Config, TrainConfig
from minitfm.tasks.base import Batch, Task, make_batch


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak lr after `step` steps: linear warmup, then the schedule."""
    warmup = cfg.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / max(step, 1))
    progress = (step - warmup) / max(cfg.steps - warmup, 1)  # cosine to 0 at cfg.steps
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def warmup_warning(cfg: TrainConfig) -> str | None:
    """A run that ends inside its warmup never reaches the decay that lr_factor schedules."""
    if cfg.steps >= cfg.warmup_steps:
        return None
    decay = "" if cfg.schedule == "constant" else f", so its {cfg.schedule} decay never starts"
    return (f"train.steps ({cfg.steps}) is below train.warmup_steps ({cfg.warmup_steps}): "
            f"the learning rate rises for the whole run{decay}; lower train.warmup_steps "
            f"(e.g. train.warmup_steps={cfg.steps // 10}) or raise train.steps")


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> AdamW:
    """AdamW (see `optim`) with weight decay on matrices only (not on biases, norms' γ/δ)."""
    return AdamW(model, lr=cfg.lr, weight_decay=cfg.weight_decay)  # the loop sets each lr


@dataclass
class TrainState:
    """What the loop trains: the task's data stream, the model, its optimizer and the step."""

    cfg: Config
    task: Task
    model: Seq2SeqTransformer
    optimizer: AdamW
    data_rng: torch.Generator
    step: int = 0
    best_exact_match: float = -1.0  # the best evaluation so far (-1: none yet)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # What a step calls for the logits: the model itself, or the run's wrapper around it (see
    # minitfm.run.state.step_forward).
    model_or_wrapper: Callable[[Tensor, Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.model_or_wrapper is None:
            self.model_or_wrapper = self.model


def next_lr(state: TrainState) -> float:
    """The learning rate of the step after `state.step` (what the train line reports)."""
    return state.cfg.train.lr * lr_factor(state.step, state.cfg.train)


def train_step(state: TrainState, batch: Batch) -> tuple[Tensor, Tensor]:
    """One optimizer step on `batch`; returns the (detached) mean loss per target token and
    the gradient norm before clipping, both tensors left for the run to read."""
    cfg = state.cfg.train
    logits = state.model_or_wrapper(batch.src, batch.tgt_in)  # (B, T, V)
    loss = sequence_loss(logits, batch.tgt_out, state.task.vocab.pad_id, cfg.label_smoothing)
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.lr = next_lr(state)  # the schedule: warmup, decay
    grad_norm = state.optimizer.step(cfg.grad_clip)
    state.step += 1
    return loss.detach(), grad_norm


def due(step: int, every: int) -> bool:
    """Whether something done every `every` steps (0: never) is done after `step`."""
    return every > 0 and step % every == 0


def reached_target(exact_match: float, cfg: TrainConfig) -> bool:
    """Early stopping: the exact match reached train.target_exact_match (if set)."""
    return cfg.target_exact_match is not None and exact_match >= cfg.target_exact_match


class Events(Protocol):
    """What the loop tells the run it trains in (`run.session.Training` is minitfm's)."""

    def after_step(self, state: TrainState, batch: Batch, loss: Tensor,
                   grad_norm: Tensor) -> bool:
        """After each step, before its evaluation: the run's own work (a train line, say).
        True asks for an evaluation at this step besides those every train.eval_every."""

    def evaluate(self, state: TrainState) -> float:
        """Greedy evaluation on held-out data; its exact match."""

    def should_stop(self, state: TrainState) -> bool:
        """The step is over, evaluated or not: whether to pause here (a signal came, say). The
        run saves the step's checkpoint here, after its evaluation."""


def run_loop(state: TrainState, events: Events) -> str:
    """Step until train.steps, the target exact match or a pause; returns which ended it:
    "finished", "stopped at target" or "paused"."""
    cfg, task = state.cfg.train, state.task
    while state.step < cfg.steps:
        batch = make_batch(task.sample(cfg.batch_size, state.data_rng), task.vocab)
        loss, grad_norm = train_step(state, batch.to(state.device))
        asked = events.after_step(state, batch, loss, grad_norm)
        if (asked or due(state.step, cfg.eval_every)) and \
                reached_target(events.evaluate(state), cfg):
            break  # early stopping
        if events.should_stop(state):
            return "paused"
    return "finished" if state.step >= cfg.steps else "stopped at target"
