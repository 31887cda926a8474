"""Chapter 6, the loop: the lr schedule, one step that learns, and a loop that evaluates every
train.eval_every steps, stops early at the target and pauses when the run asks."""

import math

import pytest
import torch

from minitfm.book.loop import TrainState, lr_factor, make_optimizer, run_loop, train_step
from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import load_config
from minitfm.tasks import make_task
from minitfm.tasks.base import make_batch


@pytest.mark.parametrize("schedule", ["cosine", "constant", "inverse_sqrt"])
def test_schedules_warm_up_linearly(schedule):
    cfg = load_config(None, [f"train.schedule={schedule}", "train.warmup_steps=10",
                             "train.steps=100"]).train
    warmup = [(s + 1) / 10 for s in range(10)]
    assert [lr_factor(s, cfg) for s in range(10)] == pytest.approx(warmup)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    end = {"cosine": 0.0, "constant": 1.0, "inverse_sqrt": (10 / 100) ** 0.5}[schedule]
    assert lr_factor(99, cfg) == pytest.approx(end, abs=0.02)
    # After warmup, the whole curve from its definition: a linear decay fails at every step
    # but the midpoint, where cosine is 0.5 (step 55); inverse_sqrt is 0.5 at 4x warmup (40).
    curve = {"cosine": lambda s: 0.5 * (1 + math.cos(math.pi * (s - 10) / 90)),
             "constant": lambda s: 1.0, "inverse_sqrt": lambda s: math.sqrt(10 / s)}[schedule]
    after = range(10, 100)
    assert [lr_factor(s, cfg) for s in after] == pytest.approx([curve(s) for s in after],
                                                               rel=1e-12, abs=1e-15)
    half = {"cosine": 55, "constant": None, "inverse_sqrt": 40}[schedule]
    if half is not None:
        assert lr_factor(half, cfg) == pytest.approx(0.5, rel=1e-12)
        assert lr_factor(half - 1, cfg) > 0.5 > lr_factor(half + 1, cfg)


def tiny_state(*overrides):
    cfg = load_config(None, ["task.name=copy", "task.max_len=5", "model.d_model=16",
                             "model.n_heads=2", "model.d_ff=32", "train.batch_size=16",
                             "train.warmup_steps=2", *overrides])
    task = make_task(cfg.task)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg.model, len(task.vocab), task.vocab.pad_id)
    return TrainState(cfg, task, model, make_optimizer(model, cfg.train),
                      torch.Generator().manual_seed(0))


def test_steps_on_one_batch_lower_its_loss():
    state = tiny_state("train.steps=40", "train.lr=3e-3")
    batch = make_batch(state.task.sample(16, state.data_rng), state.task.vocab)
    losses = [train_step(state, batch)[0].item() for _ in range(40)]
    assert state.step == 40 and state.optimizer.t == 40
    assert losses[-1] < 0.5 * losses[0]


class Recorded:
    """The loop's events, recorded: evaluations read `scores` in turn; a pause at `pause_at`."""

    def __init__(self, scores=(), ask_at=(), pause_at=None):
        self.scores, self.ask_at, self.pause_at = list(scores), set(ask_at), pause_at
        self.steps, self.evaluated = [], []

    def after_step(self, state, batch, loss, grad_norm):
        self.steps.append(state.step)
        assert torch.isfinite(loss) and grad_norm.dim() == 0
        return state.step in self.ask_at

    def evaluate(self, state):
        self.evaluated.append(state.step)
        return self.scores.pop(0) if self.scores else 0.0

    def should_stop(self, state):
        return state.step == self.pause_at


def test_the_loop_evaluates_every_eval_every_steps_and_when_asked():
    events = Recorded(ask_at={7})
    assert run_loop(tiny_state("train.steps=12", "train.eval_every=5"), events) == "finished"
    assert events.steps == list(range(1, 13)) and events.evaluated == [5, 7, 10]


def test_the_loop_stops_early_at_the_target_and_pauses_when_asked():
    events = Recorded(scores=[0.5, 0.995])
    state = tiny_state("train.steps=50", "train.eval_every=4", "train.target_exact_match=0.99")
    assert run_loop(state, events) == "stopped at target" and state.step == 8
    paused = Recorded(pause_at=3)
    state = tiny_state("train.steps=50", "train.eval_every=0")
    assert run_loop(state, paused) == "paused" and state.step == 3
    assert run_loop(state, Recorded()) == "finished" and state.step == 50  # it continues
