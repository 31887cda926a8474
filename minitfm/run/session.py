"""A run's life around the book's loop: its directory, resume, signals, torchrun, saves, events.

`start_training` prepares a run (its directory, a fresh or resumed state, every rank under
torchrun) and hands the book's loop (`minitfm.book.loop.run_loop`) a `Training`: the loop's
events, which do the run's work between steps on the cadence of `schedule` (train lines,
quick checks, attention snapshots, `last.pt` and `best.pt`) and tell the instruments what
happened (see `instruments`).

Runs in one process train one at a time (`TRAINING_LOCK`): torch's random numbers (the initial
weights, dropout) and its thread count belong to the process, so two runs at once, in two
threads of a Python program, would draw each other's numbers and differ from each alone. The
second waits for the first to end; processes of their own (`minitfm sweep`) train together.
Whatever else in minitfm draws from that stream (a model built to load weights into, the learn
checks) does it `drawing_aside`: under the same lock, giving the stream back as it found it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minitfm.book.loop import TrainState, due, reached_target, warmup_warning
from minitfm.book.metrics import EvalResult, LengthStats
from minitfm.config import Config
from minitfm.errors import Interrupted, RunFailed, option, shown_path
from minitfm.learn.code import Code
from minitfm.learn.grading import failing_exercises
from minitfm.learn.workbook import learner_errors
from minitfm.run import distributed
from minitfm.run.checkpoint import load_checkpoint, save_checkpoint
from minitfm.run.devices import pick_device
from minitfm.run.distributed import Dist
from minitfm.run.instruments import (
    Ended,
    Evaluation,
    GaugesDue,
    Instrument,
    MetricsFile,
    Note,
    Preparing,
    Saved,
    SnapshotDue,
    Started,
    Stepped,
    TrainLine,
    closing,
    tell,
)
from minitfm.run.limits import check_fits, training_parts
from minitfm.run.memory import peak_rss_mb
from minitfm.run.resume import Resumed, edits_note, restore, resume_config
from minitfm.run.rundir import open_run_dir, resume_run_dir, write_failure
from minitfm.run.schedule import (
    LossMeter,
    attention_every,
    check_due,
    check_pairs,
    save_due,
    train_line_due,
)
from minitfm.run.signals import StopSignal
from minitfm.run.state import RunState, init_state
from minitfm.run.summary import read_summary, write_summary
from minitfm.run.threads import ThreadClaim, ThreadPacer
from minitfm.tasks.base import Batch, eval_set

# The process's one lock: its random numbers are one stream. Re-entrant: a run may load a model.
TRAINING_LOCK = threading.RLock()


@contextmanager
def drawing_aside() -> Iterator[None]:
    """Draw from torch's global RNG (the CPU's) without touching anyone's stream: wait for a
    run training in another thread to end, and give the stream back as it was found. Building
    a model draws its initial weights: done between two steps of a run, it would shift the
    run's dropout masks; done in a seeded notebook, the notebook's next numbers."""
    with TRAINING_LOCK, torch.random.fork_rng(devices=[]):
        yield


@dataclass(frozen=True)
class RunOptions:
    """Where and how a run trains, besides its config (`minitfm train`'s options)."""

    run_dir: Path | None = None  # --run-dir: instead of log.dir/<name>-<timestamp>
    resume: Path | None = None  # --resume: the checkpoint file to go on from
    overrides: Sequence = ()  # KEY=VALUE of a resume: text, or (key, value) pairs
    overwrite: bool = False  # --overwrite: replace the minitfm run in run_dir
    stop_at: int | None = None  # pause after this step, as a signal would
    threads: ThreadClaim | None = None  # this process's registration (made here if None)


def start_training(cfg: Config | None, options: RunOptions = RunOptions(),
                   instruments: Sequence[Instrument] = ()) -> dict[str, Any]:
    """Train `cfg` (None with `options.resume`: the checkpoint's run goes on); the summary.

    The run writes its directory (config.yaml, metrics.jsonl, checkpoints, summary.json);
    `instruments` watch it (`app.api.instruments` are `minitfm train`'s). Under torchrun every
    rank calls this (see `distributed`): rank 0 alone writes files and tells the instruments.
    """
    resumed = None
    if options.resume is not None:
        checkpoint = load_checkpoint(options.resume, resume=True)
        resumed = resume_config(checkpoint, options.overrides, options.resume)
        if resumed.nothing_left:  # said, and nothing written: no evaluation, file or event
            run_dir = resume_run_dir(options.resume, options.run_dir, options.overwrite)
            tell(instruments, Note(resumed.nothing_left))
            return {**(read_summary(run_dir) or {}), "run_dir": str(run_dir)}
        cfg = resumed.cfg
    else:
        check_fits(training_parts(cfg), "training")  # before anything is allocated or written
    with TRAINING_LOCK, distributed.session(cfg.device) as dist, ExitStack() as held:
        claim = options.threads or held.enter_context(ThreadClaim(cfg.threads))
        claim.update(cfg.threads)
        claim.apply()
        device = dist.device if dist.world_size > 1 else pick_device(cfg.device)
        check_fits(training_parts(cfg), "training", device)  # on a GPU: its memory too
        state = init_state(cfg, device, dist)
        held.enter_context(learner_errors(state.code.workbook))  # a workbook's: one line
        if resumed is not None:
            # The schedule reads cfg.train, so a raised train.steps stretches the decay.
            restore(state, resumed.checkpoint, options.resume)
        # rank 0 picks the run directory and tells the others (or its error, or an
        # instrument's refusal, made before the directory is)
        def opening() -> Path:
            tell(instruments, Preparing(cfg))
            return open_run_dir(cfg, options.run_dir, options.resume, options.overwrite, held,
                                state.step)

        run_dir = dist.from_main(opening)
        watching = [MetricsFile(), *instruments] if dist.is_main else []
        for text in warnings(cfg, resumed, run_dir):
            tell(watching, Note(text, warning=True))
        for text in code_notes(state.code, resumed) if dist.is_main else []:
            tell(watching, Note(text, aside=True))
        training = Training(state, run_dir, watching, ThreadPacer(claim), options.stop_at)
        try:
            return training.run()
        except OSError as err:
            raise RunFailed(write_failure(err, run_dir)) from None


def warnings(cfg: Config, resumed: Resumed | None, run_dir: Path) -> list[str]:
    """What to say before the run starts: the edits a resume took from config.yaml, and a run
    that ends inside its warmup."""
    notes = [edits_note(resumed.edits, run_dir)] if resumed is not None and resumed.edits else []
    if resumed is not None:
        notes += [note for note in (resumed.code_note, resumed.schedule_note) if note]
    warmup = warmup_warning(cfg.train)
    return notes + ([warmup] if warmup is not None else [])


def code_notes(code: Code, resumed: Resumed | None) -> list[str]:
    """What to say of a learner's workbook as its run starts: a resumed run's workbook changed
    since the checkpoint, and the learner's exercises that fail their check (`learn check`;
    only those written are graded: about a second at most)."""
    workbook = code.workbook
    if workbook is None:
        return []
    notes = []
    trained = resumed.checkpoint.get("workbook") if resumed is not None else None
    if isinstance(trained, dict) and trained.get("sha256") not in (None, workbook.digest):
        notes.append(f"the workbook {workbook.folder} has changed since this run trained (its "
                     f"chapters are not those its checkpoint records): the run goes on with "
                     f"their code of now")
    failing = [] if workbook.kind == "zoo" else failing_exercises(workbook)
    if failing:
        names = " ".join(failing)
        notes.append(f"your {', '.join(failing)} "
                     f"{'fails its check' if len(failing) == 1 else 'fail their checks'} "
                     f"(minitfm learn check {workbook.folder} {names} says why)")
    return notes


class Training:
    """One run's training: the loop's events (see `loop.Events`), the work they set off on the
    cadence of `schedule`, told to the instruments, and the collectives that keep torchrun's
    ranks in step."""

    def __init__(self, state: RunState, run_dir: Path, instruments: list[Instrument],
                 pacer: ThreadPacer, stop_at: int | None = None):
        cfg = state.cfg
        self.state, self.run_dir, self.instruments = state, run_dir, instruments
        self.pacer, self.stop_at = pacer, stop_at  # pause after stop_at, as a signal would
        self.eval_pairs = eval_set(state.task, cfg.train.eval_samples, cfg.task.eval_seed)
        workbook = state.code.workbook if state.code is not None else None
        self.meter = LossMeter(state.step, cfg.train, state.dist.average,  # mean over ranks
                               workbook and str(workbook.folder))
        self.stop = StopSignal()
        self.started = time.perf_counter()  # the run's clock (elapsed_s, wall_s), from `run`
        self.evaluated: tuple[int, EvalResult] | None = None  # the latest evaluation, its step
        self.looked: int | None = None  # the step of the latest attention snapshot
        self.signum = 0  # the signal every rank agreed to stop on (0: none)
        self.threads_told = False  # a change of thread count is said once, not at each change

    def run(self) -> dict[str, Any]:
        """Train until the loop ends, then evaluate (unless just done), save and summarize;
        the instruments are closed however it ends."""
        state = self.state
        with self.stop, closing(self.instruments):
            self.begin()
            try:
                ended = state.code.loop.run_loop(state, self)  # the book's, or a workbook's
                summary = self.end(ended)
            except RunFailed as err:  # a non-finite loss: every rank read the same losses
                self.fail(err)
                raise
            if self.signum:
                raise self.interrupted()
        return summary

    def begin(self, code: str | None = None) -> None:
        """Start the clock and tell the instruments the run starts (`code`: what runs it, when
        not the run's own code alone, as in a stack)."""
        state = self.state
        self.started = time.perf_counter()
        self.tell(Started(self.run_dir, state.cfg, state.task, state.model, self.eval_pairs,
                          state.step, state.device, self.pacer.claim.describe(),
                          state.dist.world_size, code or state.code.describe(),
                          state.code.whose()))
        self.meter.since = time.perf_counter()  # tokens/s counts the steps from here

    def end(self, ended: str) -> dict[str, Any]:
        """After the loop ended ("paused", "finished" or "stopped at target"): pause or finish,
        and tell the instruments; the summary."""
        summary = self.pause() if ended == "paused" else self.finish()
        self.tell(Ended(summary))
        return summary

    def fail(self, err: RunFailed) -> None:
        """A non-finite loss ended the run: its status says so."""
        self.record_status("failed", error=str(err))
        self.state.dist.on_all_ranks(err)  # marked: the CLI prints rank 0's line only

    # --- the loop's events ---

    def after_step(self, state: TrainState, batch: Batch, loss: torch.Tensor,
                   grad_norm: torch.Tensor) -> bool:
        """The loss into the meter; a train line and a quick check when due. True when the
        check saw the target: the loop then evaluates at once (the check decides nothing)."""
        self.meter.add(loss, batch.n_target_tokens)  # the batch still on the CPU: no wait
        step, cfg = state.step, state.cfg
        line_now = train_line_due(step, cfg)
        check_now = check_due(step, cfg.train, state.best_exact_match)
        if line_now or check_now:
            self.meter.read()  # a non-finite loss stops the run here, before anything is saved
        if due(step, cfg.log.gauge_every):  # before the train line, which shows the reading
            with self.meter.aside():
                self.tell(GaugesDue(step, state.model))
        if line_now:
            self.train_line(grad_norm)
        if not check_now:
            return False
        with self.meter.aside():  # the train line's tokens/s counts the steps only
            return reached_target(self.check(), cfg.train)

    def evaluate(self, state: TrainState) -> float:
        """Greedy evaluation (see `run_eval`); its exact match."""
        self.meter.read()
        with self.meter.aside():
            self.evaluated = state.step, self.run_eval()
        return self.evaluated[1].exact_match

    def should_stop(self, state: TrainState) -> bool:
        """The snapshot and the save due after this step; then whether to stop (a signal on
        any rank, or `stop_at`). Going on, the instruments hear of the step, and the thread
        count follows other minitfm processes."""
        step, cfg = state.step, state.cfg
        look_now = due(step, attention_every(cfg))
        save_now = save_due(step, cfg, self.evaluated is not None and self.evaluated[0] == step)
        if look_now or save_now:
            self.meter.read()
            with self.meter.aside():
                if look_now:
                    self.snapshot()
                if save_now:
                    self.save("last")
        self.signum = self.stop.agreed(state.dist)
        if self.signum or step == self.stop_at:
            return True
        self.tell(Stepped(step))
        self.follow_threads(step)
        return False

    # --- the run's work ---

    def tell(self, event: Any) -> None:
        """Hand `event` to the instruments (none but on rank 0)."""
        tell(self.instruments, event)

    def train_line(self, grad_norm: torch.Tensor) -> None:
        """The mean loss and speed since the last line (see `LossMeter`), lr and gradient norm."""
        state = self.state
        tokens = state.dist.all_sum([self.meter.tokens])[0]  # under torchrun: all ranks' tokens
        figures = self.meter.flush(tokens)
        lr = state.code.loop.next_lr(state)
        self.tell(TrainLine(state.step, figures["loss"], figures["tokens_per_s"], lr,
                            float(grad_norm), time.perf_counter() - self.started))

    def run_eval(self) -> EvalResult:
        """Greedy evaluation on the held-out set; keeps `best.pt` at the best exact match."""
        state, dist = self.state, self.state.dist
        pairs = self.eval_pairs[dist.rank::dist.world_size]  # under torchrun: a shard each
        result = sum_over_ranks(self.measure(pairs), pairs, dist)
        self.tell(Evaluation(state.step, result.loss, result.token_accuracy, result.exact_match,
                             result.total.count, time.perf_counter() - self.started, pairs,
                             result.predictions))
        if result.exact_match > state.best_exact_match:  # the same on every rank, so is the save
            state.best_exact_match = result.exact_match
            self.save("best")
        return result

    def check(self) -> float:
        """Greedy exact match on the first fifth of the held-out set (at least one sequence),
        decoded only: no loss, no record, no save. It only calls an evaluation."""
        dist = self.state.dist
        pairs = check_pairs(self.eval_pairs)[dist.rank::dist.world_size]
        predictions = self.decode([src for src, _ in pairs])
        exact = sum(pred == target for pred, (_, target) in zip(predictions, pairs, strict=True))
        exact, count = dist.all_sum([exact, len(pairs)])  # under torchrun: every rank's shard
        return exact / max(count, 1)

    def measure(self, pairs: list) -> EvalResult:
        """The metrics chapter's `evaluate` of the model on `pairs` (a stack's run: see
        `run.stack`, which decodes every run of the stack at once)."""
        state = self.state
        return state.code.metrics.evaluate(state.model, state.task, pairs, state.device)

    def decode(self, sources: list) -> list:
        """The metrics chapter's `predict` of the model on `sources`."""
        state = self.state
        return state.code.metrics.predict(state.model, state.task, sources, state.device)

    def snapshot(self) -> None:
        """A look at the attention, once per step (the end comes again when it fell on an
        interval)."""
        if self.looked != self.state.step:
            self.looked = self.state.step
            self.tell(SnapshotDue(self.state.step, self.state.model))

    def save(self, name: str) -> None:
        """Write `checkpoints/<name>.pt`: every rank adds its RNG states, rank 0 writes it."""
        snapshot = self.checkpoint_state()
        if self.state.dist.is_main:
            path = self.run_dir / "checkpoints" / f"{name}.pt"
            save_checkpoint(snapshot, path)
            self.tell(Saved(self.state.step, path))

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint of the run holds now (`RunState.state_dict`)."""
        return self.state.state_dict()

    def follow_threads(self, step: int) -> None:
        """The thread count follows other minitfm processes and other programs' load; the
        first change is said."""
        claim = self.pacer.claim
        before, busy_before = claim.threads, claim.busy
        if self.pacer.tick() and not self.threads_told:  # a process came or went
            self.threads_told = True
            busy = claim.busy if claim.busy != busy_before else None  # other programs moved
            self.tell(Note(threads_note(step, before, claim.threads, busy)))

    # --- the end ---

    def pause(self) -> dict[str, Any]:
        """Save `last.pt` and stop: by a signal (`run` then raises Interrupted) or at stop_at."""
        self.meter.read()
        self.save("last")
        return self.record_status("interrupted" if self.signum else "paused")

    def interrupted(self) -> Interrupted:
        """What a signal's pause raises: where the run was saved and how to go on."""
        state, name = self.state, signal.Signals(self.signum).name
        path = self.run_dir / "checkpoints" / "last.pt"
        again = " (under torchrun again, with any number of processes)" \
            if state.dist.world_size > 1 else ""
        return state.dist.on_all_ranks(Interrupted(
            f"{name} at step {state.step}: saved {shown_path(path)}; continue with "
            f"{option('again', shown_path(self.run_dir))}{again}", 128 + self.signum))

    def finish(self) -> dict[str, Any]:
        """Final evaluation (unless the last step had one), attention snapshot, `last.pt`."""
        self.meter.read()
        state = self.state
        step, last_eval = self.evaluated or (None, None)
        if step != state.step:
            last_eval = self.run_eval()
        if state.cfg.log.attention_every:  # `eval` too: the end has an evaluation
            self.snapshot()
        self.save("last")
        status = "finished" if state.step >= state.cfg.train.steps else "stopped at target"
        return self.record_status(status, last_eval)

    def record_status(self, status: str, result: EvalResult | None = None,
                      **extra: Any) -> dict[str, Any]:
        """The summary (see `summarize`), written to `summary.json` by rank 0."""
        summary = self.summarize(result, paused=status not in ("finished", "stopped at target"))
        summary.update(status=status, steps=self.state.cfg.train.steps, **extra)
        if self.state.dist.is_main:
            summary["wall_s"] = write_summary(self.run_dir, summary)
        return summary

    def summarize(self, result: EvalResult | None, paused: bool) -> dict[str, Any]:
        """Where the run is, how far it got, how well and how long it took."""
        state = self.state
        summary = {"run_dir": str(self.run_dir), "step": state.step, "paused": paused,
                   "best_exact_match": state.best_exact_match,
                   "wall_s": time.perf_counter() - self.started, "peak_rss_mb": peak_rss_mb()}
        if result is not None:
            summary.update(exact_match=result.exact_match,
                           token_accuracy=result.token_accuracy, loss=result.loss)
        return summary


def threads_note(step: int, before: int, now: int, busy: int | None = None) -> str:
    """Why the thread count changed, in the line that says so (it is said once per run):
    another minitfm process, or (`busy`: the cores they keep busy now) other programs."""
    unit = "thread" if now == 1 else "threads"
    if busy is None:
        why = "another minitfm process started" if now < before else "a minitfm process ended"
        rule = "shares the cores among minitfm's processes"
    else:
        why = f"other programs keep {busy} core{'s' * (busy != 1)} busy"
        rule = "leaves them the cores they keep busy"
    return (f"step {step}: now {now} {unit} instead of {before}: {why}, and threads=auto "
            f"{rule} (later changes are not shown; see "
            f"docs/operations.md#many-runs-on-one-machine)")


def sum_over_ranks(result: EvalResult, pairs: list, dist: Dist) -> EvalResult:
    """The whole held-out set's metrics from each rank's shard: counts summed over ranks."""
    if dist.world_size == 1:
        return result
    tokens = sum(len(target) + 1 for _, target in pairs)  # the loss is a mean per token (+EOS)
    own = result.total
    sums = dist.all_sum([own.count, own.exact, own.correct_tokens, own.total_tokens,
                         result.loss * tokens, tokens])
    total = LengthStats(*(round(n) for n in sums[:4]))
    # Per-length tables are for `minitfm eval`; the loop needs only the totals.
    return EvalResult(sums[4] / max(sums[5], 1), total, {}, result.predictions)
