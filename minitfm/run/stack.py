"""Runs of one model shape trained in one process as one stacked model (`minitfm sweep`'s
stacks; the maths is `fast/stack.py`).

Each run is prepared as `session.start_training` prepares a run alone (its directory, a fresh or
resumed state, its instruments) and keeps its own `Training`, which does the run's work between
steps on the run's own cadence: train lines, quick checks, evaluations, snapshots, checkpoints,
early stopping, its summary. Only the steps and the greedy decoding are done for all the runs
at once: the stack steps every run still training, decodes the checks and evaluations due at a
step together, and hands each `Training` its share (`RunInStack`). A run that ends (its target,
its steps, a non-finite loss) stops changing and leaves the steps; a signal pauses every run,
each with its last.pt, and the same command goes on from them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minitfm.book.loop import due, next_lr, reached_target
from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import Config
from minitfm.errors import Interrupted, MinitfmError, RunFailed, quote
from minitfm.fast.stack import (
    RowOptimizer,
    Stack,
    StackedAdamW,
    evaluate_rows,
    predict_rows,
    stack_batches,
)
from minitfm.learn.code import is_workbook
from minitfm.run.checkpoint import load_checkpoint
from minitfm.run.devices import pick_device
from minitfm.run.instruments import (
    Instrument,
    MetricsFile,
    Note,
    Preparing,
    TrainLine,
    closing,
    ending,
    tell,
)
from minitfm.run.limits import check_fits, training_parts
from minitfm.run.resume import restore, resume_config
from minitfm.run.rundir import open_run_dir, write_failure
from minitfm.run.schedule import check_due, check_pairs
from minitfm.run.session import TRAINING_LOCK, Training, warnings
from minitfm.run.signals import StopSignal, stopped_by
from minitfm.run.stack_key import stack_differences
from minitfm.run.state import init_state
from minitfm.run.threads import ThreadClaim, ThreadPacer
from minitfm.tasks.base import make_batch


@dataclass(frozen=True)
class StackMember:
    """One run of a stack: its config (as `minitfm train` would resolve it) and directory; a
    directory holding checkpoints/last.pt goes on from it, as `--resume` does."""

    cfg: Config
    run_dir: Path

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoints" / "last.pt"


class RunInStack(Training):
    """A run's `Training` whose steps and decoding the stack does: its checks and evaluations
    come decoded with the other runs' (`ready`), its model's parameters are a row of the stack."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.size = 1  # runs in the stack, for the summary
        self.ready: dict[str, Any] = {}  # "check": predictions, "eval": an EvalResult
        self.line: TrainLine | None = None  # the latest train line, for the stack's own line

    def tell(self, event: Any) -> None:
        if isinstance(event, TrainLine):
            self.line = event
        super().tell(event)

    def measure(self, pairs: list):
        return self.ready.pop("eval") if "eval" in self.ready else super().measure(pairs)

    def decode(self, sources: list) -> list:
        return self.ready.pop("check") if "check" in self.ready else super().decode(sources)

    def summarize(self, result, paused: bool) -> dict[str, Any]:
        return {**super().summarize(result, paused), "stack": self.size}

    def checkpoint_state(self) -> dict[str, Any]:
        """The run's state with copies of its weights: views of the stack's row would save
        the whole stack's storage."""
        state = super().checkpoint_state()
        state["model"] = {name: value.clone() for name, value in state["model"].items()}
        return state


def train_stack(members: Sequence[StackMember], instruments: Callable[[], list[Instrument]],
                say: Callable[[str], None],
                claim: ThreadClaim | None = None) -> list[dict[str, Any]]:
    """Train `members` as one stack (see the module docstring); each run's summary, in order.

    `instruments` makes each run's watchers (besides its metrics.jsonl), `say` reports the
    stack's own lines, `claim` is this process's thread registration (made here if None). A
    signal raises Interrupted once every run has saved its last.pt."""
    check_fits([part for m in members for part in training_parts(m.cfg)],
               f"a stack of {len(members)} runs")
    with TRAINING_LOCK, ExitStack() as held:
        claim = claim or held.enter_context(ThreadClaim(members[0].cfg.threads))
        claim.update(members[0].cfg.threads)
        claim.apply()
        device = pick_device(members[0].cfg.device)
        check_fits([part for m in members for part in training_parts(m.cfg)],
                   f"a stack of {len(members)} runs", device)  # on a GPU: its memory too
        stop = held.enter_context(StopSignal())
        runs = [prepare(member, device, claim, instruments, held) for member in members]
        check_shared([run.state.cfg for run in runs], [m.run_dir for m in members])
        say(f"stack of {len(runs)} runs on {device.type}, {claim.describe()}")
        try:
            summaries = Stacked(runs, device, StackStop(stop), say).run()
        except OSError as err:  # a full disk: every run keeps the checkpoints it had saved
            where = next((m.run_dir for m in members
                          if str(err.filename or "").startswith(str(m.run_dir))),
                         members[0].run_dir)
            raise RunFailed(write_failure(err, where)) from None
        if stop.signum:
            raise Interrupted(f"{stopped_by(stop.signum)}: each of the {len(runs)} runs saved "
                              f"its checkpoints/last.pt; run the same command again to go on",
                              128 + stop.signum)
        return summaries


def prepare(member: StackMember, device: torch.device, claim: ThreadClaim,
            instruments: Callable[[], list[Instrument]], held: ExitStack) -> RunInStack:
    """One run's state, fresh or resumed from its last.pt, and its `Training`, as
    `session.start_training` makes them."""
    cfg, resumed = member.cfg, None
    if is_workbook(cfg.model.code):
        raise MinitfmError(f"{quote(str(member.run_dir))} trains the workbook "
                           f"{quote(cfg.model.code)}: a stack runs the book's code; train a "
                           f"workbook's runs alone (--no-stack)")
    if member.checkpoint.is_file():
        resumed = resume_config(load_checkpoint(member.checkpoint, resume=True),
                                [("threads", cfg.threads)], member.checkpoint)
        cfg = resumed.cfg
    else:
        check_fits(training_parts(cfg), "training")
    state = init_state(cfg, device)  # seeded as the run alone: its initial weights, its data
    if resumed is not None:
        restore(state, resumed.checkpoint, member.checkpoint)
    watching = [MetricsFile(), *instruments()]
    held.enter_context(closing(watching))
    tell(watching, Preparing(cfg))
    run_dir = open_run_dir(cfg, member.run_dir, member.checkpoint if resumed else None,
                           resumed is None, held, state.step)
    for text in warnings(cfg, resumed, run_dir):
        tell(watching, Note(text, warning=True))
    return RunInStack(state, run_dir, watching, ThreadPacer(claim))


def check_shared(configs: list[Config], run_dirs: list[Path]) -> None:
    """Refuse runs that cannot share one stack (`config.stack_differences`)."""
    for cfg, run_dir in zip(configs[1:], run_dirs[1:]):
        keys = stack_differences(configs[0], cfg)
        if keys:
            raise MinitfmError(f"{quote(str(run_dir))} cannot share a stack with "
                               f"{quote(str(run_dirs[0]))}: {', '.join(keys)} differ; stack "
                               f"only runs of one model shape")


class StackStop:
    """The signal as every run of the stack sees it at one step (`read` once a step): all the
    runs pause after the same step, whichever of their events the signal came in."""

    def __init__(self, signal: StopSignal):
        self.signal, self.now = signal, 0

    def read(self) -> None:
        self.now = self.signal.signum or 0

    def agreed(self, dist) -> int:
        return self.now


class Stacked:
    """The stack's loop: every running run steps, then each does its own work (`Training`'s
    events), the checks and evaluations due decoded together first. It says a line of its own
    at each train line (the runs' steps, losses, exact match, and the time left) and one per
    run as the run ends (`say`): a stack's log reads as a run's does."""

    def __init__(self, runs: list[RunInStack], device: torch.device, stop: StackStop,
                 say: Callable[[str], None]):
        self.runs, self.device, self.stop, self.say = runs, device, stop, say
        for run in runs:
            run.size = len(runs)
            run.stop = stop  # one signal pauses every run
        cfg = runs[0].state.cfg
        base = Seq2SeqTransformer(cfg.model, len(runs[0].state.task.vocab),
                                  runs[0].state.task.vocab.pad_id).to(device)
        self.stack = Stack([run.state.model for run in runs], base)
        self.optimizer = StackedAdamW(self.stack, [r.state.cfg.train.weight_decay for r in runs])
        for row, run in enumerate(runs):
            self.optimizer.load_row(row, run.state.optimizer.state_dict())
            run.state.optimizer = RowOptimizer(self.optimizer, row, run.state.cfg.train.lr)
        clip = [r.state.cfg.train.grad_clip for r in runs]
        self.max_norm = torch.tensor([c if c is not None else float("inf") for c in clip],
                                     device=device)
        self.running = [run.state.step < run.state.cfg.train.steps for run in runs]
        torch.manual_seed(cfg.seed)  # the stack's dropout stream (see fast/stack.py)
        self.summaries: list[dict[str, Any] | None] = [None] * len(runs)
        self.started, self.steps = time.perf_counter(), 0  # the stack's clock and steps

    def run(self) -> list[dict[str, Any]]:
        """Step until every run has ended; each run's summary."""
        for row, run in enumerate(self.runs):
            run.begin(f"{run.state.code.describe()}, stacked with {len(self.runs) - 1} more "
                      f"(the book's modules under vmap)")
            if not self.running[row]:  # nothing left to train: its end, evaluated
                self.end(row, "finished")
        while any(self.running):
            stepped = self.step()
            self.prefetch("check", [row for row, _, _, _ in stepped
                                    if check_due(*self.check_args(row))])
            asked = {row: self.after_step(row, *rest) for row, *rest in stepped}
            evaluate = [row for row in asked if self.running[row] and (
                asked[row] or due(self.runs[row].state.step,
                                  self.runs[row].state.cfg.train.eval_every))]
            self.prefetch("eval", evaluate)
            self.steps += 1
            self.after_evaluations(list(asked), evaluate)
        return [s for s in self.summaries if s is not None]

    def progress(self, rows: list[int], ending: set[int]) -> None:
        """The stack's line when runs of `rows` (those stepped just now; `ending` at this step)
        wrote a train line:
        `step 50/280: 4 of 4 runs training, loss 1.0153-1.2231, exact match 2.5-4.5%, about
        3 min left` (time left: at the stack's pace so far, to the end of the longest run)."""
        lined = [self.runs[row] for row in rows
                 if self.runs[row].line is not None
                 and self.runs[row].line.step == self.runs[row].state.step]
        if not lined:
            return
        going = [run for row, run in enumerate(self.runs) if self.running[row]
                 and row not in ending]
        exact = [run.evaluated[1].exact_match * 100 for run in lined if run.evaluated]
        parts = [f"step {span([r.state.step for r in lined])}/"
                 f"{span([r.state.cfg.train.steps for r in lined])}: {len(going)} of "
                 f"{len(self.runs)} runs training",
                 f"loss {span([r.line.loss for r in lined], '.4f')}",
                 *([f"exact match {span(exact, '.1f')}%"] if exact else [])]
        left = max((r.state.cfg.train.steps - r.state.step for r in going), default=0)
        if left:
            seconds = (time.perf_counter() - self.started) / self.steps * left
            parts.append(f"about {time_left(seconds)} left")
        self.say(", ".join(parts))

    def check_args(self, row: int) -> tuple:
        state = self.runs[row].state
        return state.step, state.cfg.train, state.best_exact_match

    def step(self) -> list[tuple]:
        """One optimizer step of every running run; (row, batch, loss, gradient norm) each."""
        rows = [row for row, going in enumerate(self.running) if going]
        states = [self.runs[row].state for row in rows]
        batches = [make_batch(s.task.sample(s.cfg.train.batch_size, s.data_rng), s.task.vocab)
                   for s in states]
        batch = stack_batches(batches, states[0].task.vocab.pad_id).to(self.device)
        lr = torch.zeros(len(self.runs), device=self.device)
        for row, state in zip(rows, states):
            lr[row] = next_lr(state)  # the schedule: warmup, decay
        index = None if len(rows) == len(self.runs) else torch.tensor(rows, device=self.device)
        self.stack.flat.grad = None
        losses = self.stack.losses(batch, index, states[0].cfg.train.label_smoothing,
                                   autocast=self.device.type == "cuda")
        losses.sum().backward()
        active = torch.zeros(len(self.runs), dtype=torch.bool, device=self.device)
        active[rows] = True
        norms = self.optimizer.step(lr, self.max_norm, active)
        losses = losses.detach()
        for state in states:
            state.step += 1
        return [(row, batches[i], losses[i], norms[row]) for i, row in enumerate(rows)]

    def after_step(self, row: int, batch, loss, grad_norm) -> bool:
        """The run's own `after_step` (a train line, a check); a non-finite loss ends it."""
        run = self.runs[row]
        try:
            return run.after_step(run.state, batch, loss, grad_norm)
        except RunFailed as err:
            self.failed(row, err)
            return False

    def after_evaluations(self, rows: list[int], evaluated: list[int]) -> None:
        """Each stepped run's evaluation (if due), early stopping, pause (a signal) or end."""
        self.stop.read()
        ending = []
        for row in rows:
            if not self.running[row]:
                continue
            run = self.runs[row]
            try:
                if row in evaluated and reached_target(run.evaluate(run.state),
                                                       run.state.cfg.train):
                    ending.append((row, "stopped at target"))
                elif run.should_stop(run.state):
                    ending.append((row, "paused"))
                elif run.state.step >= run.state.cfg.train.steps:
                    ending.append((row, "finished"))
            except RunFailed as err:
                self.failed(row, err)
        self.prefetch("eval", [row for row, how in ending if how == "finished"
                               and (self.runs[row].evaluated or (None,))[0]
                               != self.runs[row].state.step])
        self.progress(rows, {row for row, _ in ending})  # the step's line, then the ends'
        for row, how in ending:
            self.end(row, how)

    def end(self, row: int, how: str) -> None:
        """The run's end: pause or finish (its final evaluation, snapshot, last.pt); its line."""
        self.running[row] = False
        run = self.runs[row]
        summary = self.summaries[row] = run.end(how)
        words = ending(summary, run.state.cfg.train.target_exact_match)
        if "exact match" not in words and "exact_match" in summary:  # its last evaluation's
            words += f", exact match {summary['exact_match']:.1%}"
        self.say(f"{run.run_dir.name}: {words}")

    def failed(self, row: int, err: RunFailed) -> None:
        """A non-finite loss: the run's status says so (and its line); the others go on."""
        self.running[row] = False
        run = self.runs[row]
        run.fail(err)
        self.summaries[row] = {"run_dir": str(run.run_dir), "status": "failed",
                               "error": str(err)}
        self.say(f"{run.run_dir.name}: failed at step {run.state.step}: {err}")

    def prefetch(self, kind: str, rows: list[int]) -> None:
        """Decode the checks ("check") or evaluations ("eval") of `rows` together; each run
        then finds its own in `ready`."""
        if not rows:
            return
        runs = [self.runs[row] for row in rows]
        tasks = [run.state.task for run in runs]
        if kind == "check":
            sources = [[src for src, _ in check_pairs(run.eval_pairs)] for run in runs]
            found = predict_rows(self.stack, rows, tasks, sources, self.device)
        else:
            found = evaluate_rows(self.stack, rows, tasks, [run.eval_pairs for run in runs],
                                  self.device)
        for run, result in zip(runs, found):
            run.ready[kind] = result


def span(values: list[float], spec: str = "") -> str:
    """`3` for values all alike, else `1-3`: the range of the runs' figures, each as `spec`."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}-{high}"


def time_left(seconds: float) -> str:
    """`40 s`, `3 min`, `2 h 5 min`: a log line's time left, as precise as an estimate is."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"
