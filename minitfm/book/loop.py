"""The training loop: AdamW, warmup + decay, one step, and the loop that calls back between steps.

One step: sample a batch from the task's training stream, teacher-forced cross-entropy on
`target + EOS` (PAD ignored), backward, the scheduled lr, clip and AdamW step. Every random draw
comes from a state that the checkpoint saves (torch's RNG for init and dropout, the data
generator), so N straight steps and N/2 + resume give bit-identical losses.

The loop decides when things happen (a train line every log.log_every steps, an evaluation
every train.eval_every, ...); what happens is its callbacks' (`Callbacks`, as minGPT's
`Trainer` calls its callbacks). `minitfm.run.session` implements them: checkpoints, the run
directory, signals, several processes under torchrun, progress and logs.

Shapes: B batch, T target length, V vocabulary size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from minitfm.book.model import Seq2SeqTransformer, sequence_loss
from minitfm.book.optim import AdamW
from minitfm.config import Config, TrainConfig
from minitfm.errors import RunFailed
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
    # What a step calls: the model, or a wrapper around it that shares the gradients of
    # several processes (DistributedDataParallel under torchrun, see run.distributed).
    model_or_wrapper: torch.nn.Module | None = None

    def __post_init__(self) -> None:
        if self.model_or_wrapper is None:
            self.model_or_wrapper = self.model


def next_lr(state: TrainState) -> float:
    """The learning rate of the step after `state.step` (what the train line reports)."""
    return state.cfg.train.lr * lr_factor(state.step, state.cfg.train)


def train_step(state: TrainState, batch: Batch) -> tuple[Tensor, Tensor]:
    """One optimizer step on `batch`; returns the (detached) mean loss per target token and
    the gradient norm before clipping, both unread tensors on the device."""
    cfg = state.cfg.train
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=state.device.type == "cuda"):
        logits = state.model_or_wrapper(batch.src, batch.tgt_in)  # (B, T, V)
    loss = sequence_loss(logits, batch.tgt_out, state.task.vocab.pad_id, cfg.label_smoothing)
    state.optimizer.zero_grad()
    loss.backward()  # a wrapper such as DDP averages the gradients over processes here
    state.optimizer.lr = next_lr(state)  # the schedule: warmup, decay
    grad_norm = state.optimizer.step(cfg.grad_clip)
    state.step += 1
    # Not read here: on CUDA, reading a value waits for the GPU; `LossMeter` reads the losses
    # every few steps and checks them then.
    return loss.detach(), grad_norm


def due(step: int, every: int) -> bool:
    """Whether something done every `every` steps (0: never) is done after `step`."""
    return every > 0 and step % every == 0


def attention_every(cfg: Config) -> int:
    """Steps between attention snapshots: log.attention_every, or train.eval_every for `eval`."""
    every = cfg.log.attention_every
    return cfg.train.eval_every if every == "eval" else every


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

    def __init__(self, step: int):
        self.unread: list[Tensor] = []  # 0-dim losses of the steps after `self.step`
        self.step = step  # the last step whose loss was read
        self.losses: list[float] = []  # read since the last train line
        self.tokens = 0
        self.since = time.perf_counter()

    def add(self, loss: Tensor, tokens: int) -> None:
        """One step's loss (unread) and its number of target tokens."""
        self.unread.append(loss)
        self.tokens += tokens

    def read(self, state: TrainState,
             shared: Callable[[Tensor], Tensor] = same_losses) -> None:
        """Fetch the unread losses (one wait for the device); RunFailed at a non-finite one.
        `shared` turns this process's losses into the run's (see `Callbacks.shared_losses`)."""
        if not self.unread:
            return
        values = shared(torch.stack(self.unread)).tolist()  # (steps,)
        first = self.step + 1  # the step of values[0]
        self.unread, self.step = [], self.step + len(values)
        for i, value in enumerate(values):
            if not math.isfinite(value):
                cfg = state.cfg.train
                clip = "" if cfg.grad_clip is not None else " or set train.grad_clip (e.g. 1.0)"
                raise RunFailed(f"loss became {value} at step {first + i}: lower train.lr "
                                f"({cfg.lr}){clip}; no checkpoint was written for it")
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


class Callbacks(Protocol):
    """What the loop calls between steps; `run.session.RunCallbacks` is the run's."""

    def shared_losses(self, losses: Tensor) -> Tensor:
        """This process's step losses as the run's (several processes: their mean), so that
        every process stops at the same non-finite loss."""

    def train_line(self, step: int, meter: LossMeter, grad_norm: Tensor) -> None:
        """Every log.log_every steps: the mean loss and speed since the last line."""

    def evaluate(self, step: int) -> float:
        """Every train.eval_every steps: greedy evaluation on held-out data; its exact match."""

    def check(self, step: int) -> float:
        """Between evaluations (see `check_due`): the exact match of greedy decoding on a part
        of the held-out data, cheaper than an evaluation and never reported as one."""

    def snapshot(self, step: int) -> None:
        """Every log.attention_every steps: a look at the attention maps."""

    def save(self, step: int) -> None:
        """After each evaluation and every train.checkpoint_every steps: a checkpoint."""

    def should_stop(self, step: int) -> bool:
        """Whether to pause after `step` (a signal came, or the caller asked for it)."""

    def after_step(self, step: int) -> None:
        """The last thing of every step that goes on (progress, pacing)."""


def run_loop(state: TrainState, callbacks: Callbacks) -> str:
    """Step until train.steps, the target exact match or a pause; returns which ended it:
    "finished", "stopped at target" or "paused"."""
    cfg, task = state.cfg, state.task
    meter = LossMeter(state.step)
    while state.step < cfg.train.steps:
        batch = make_batch(task.sample(cfg.train.batch_size, state.data_rng), task.vocab)
        loss, grad_norm = train_step(state, batch.to(state.device))
        meter.add(loss, batch.n_target_tokens)
        step = state.step
        log_now = step % cfg.log.log_every == 0
        evaluate_now = due(step, cfg.train.eval_every)
        check_now = not evaluate_now and check_due(step, cfg.train, state.best_exact_match)
        snapshot_now = due(step, attention_every(cfg))
        save_now = evaluate_now or due(step, cfg.train.checkpoint_every)
        if log_now or evaluate_now or check_now or snapshot_now or save_now:
            # A non-finite loss stops the run here, before anything is saved.
            meter.read(state, callbacks.shared_losses)
        if log_now:
            callbacks.train_line(step, meter, grad_norm)
        with meter.aside():  # the train line's tokens/s counts the steps only
            if check_now and reached_target(callbacks.check(step), cfg.train):
                evaluate_now = save_now = True  # the check decides nothing: an evaluation does
            if evaluate_now and reached_target(callbacks.evaluate(step), cfg.train):
                break
            if snapshot_now:
                callbacks.snapshot(step)
            if save_now:
                callbacks.save(step)  # after each evaluation too: a kill -9 loses little
        if callbacks.should_stop(step):
            meter.read(state, callbacks.shared_losses)
            return "paused"
        callbacks.after_step(step)
    meter.read(state, callbacks.shared_losses)
    return "finished" if state.step >= cfg.train.steps else "stopped at target"


def check_due(step: int, cfg: TrainConfig, best_exact_match: float) -> bool:
    """A quick check after `step`: every train.check_every steps between evaluations, once an
    evaluation reached two thirds of train.target_exact_match. When a check sees the target, a
    full evaluation runs at once; so a run stops within check_every steps of reaching its
    target, not eval_every. Far from the target a check would find nothing: on the default task
    exact match climbs from about 50% to 99% over the last 100 steps, so checks begin after the
    evaluation that reads 70-90%."""
    target = cfg.target_exact_match
    near = target is not None and best_exact_match >= target * 2 / 3
    return near and due(step, cfg.check_every)


def check_pairs(pairs: list) -> list:
    """The held-out pairs a quick check decodes: the first fifth (at least one)."""
    return pairs[:max(len(pairs) // 5, 1)]


def reached_target(exact_match: float, cfg: TrainConfig) -> bool:
    """Early stopping: the exact match reached train.target_exact_match (if set)."""
    return cfg.target_exact_match is not None and exact_match >= cfg.target_exact_match
