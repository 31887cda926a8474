"""A run's life around the loop: run directory, resume, signals, torchrun, checkpoints, reports.

`train` prepares a run (its directory, a fresh or restored state, every rank under torchrun)
and hands the book's loop (`minitfm.book.loop.run_loop`) the callbacks of `RunCallbacks`:
evaluation with `best.pt`, `last.pt`, metrics.jsonl, collectives over ranks, thread pacing, the
reporter, and the TensorBoard logger and attention recorder its caller handed in.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from minitfm.book.loop import (
    LossMeter,
    TrainState,
    check_pairs,
    make_optimizer,
    next_lr,
    run_loop,
    warmup_warning,
)
from minitfm.book.metrics import EvalResult, LengthStats, evaluate, predict
from minitfm.catalog import position_shortfall
from minitfm.config import (
    Config,
    parse_override,
    read_yaml,
    resolve_data_paths,
    set_path,
    validate,
)
from minitfm.errors import CheckpointError, ConfigError, Interrupted, MinitfmError, RunFailed
from minitfm.fast.model import build_model
from minitfm.run import distributed
from minitfm.run.checkpoint import (
    check_vocab,
    checkpoint_mismatch,
    load_checkpoint,
    optimizer_state,
    save_checkpoint,
)
from minitfm.run.devices import pick_device
from minitfm.run.distributed import Dist
from minitfm.run.files import append_metrics
from minitfm.run.limits import check_fits, training_parts
from minitfm.run.memory import peak_rss_mb
from minitfm.run.rundir import (
    CLI_NAMES,
    OptionNames,
    find_run_dir,
    open_run_dir,
    write_failure,
    write_summary,
)
from minitfm.run.signals import StopSignal
from minitfm.run.threads import ThreadClaim, ThreadPacer
from minitfm.tasks import make_task
from minitfm.tasks.base import Task, eval_set


@dataclass
class RunState(TrainState):
    """The loop's state and what a checkpoint must hold besides it to continue a run exactly."""

    dist: Dist = field(default_factory=Dist)  # this rank under torchrun; else rank 0 of 1

    def state_dict(self) -> dict[str, Any]:
        """Plain containers and tensors only, so `weights_only=True` can load it."""
        state = {
            "step": self.step,
            "config": self.cfg.model_dump(),
            "vocab": list(self.task.vocab.tokens),
            **self.task.checkpoint_data(),  # pairs: its held-out pairs, lengths, file hash
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "best_exact_match": self.best_exact_match,
            "rng": {"torch": torch.get_rng_state(), "data": self.data_rng.get_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        }
        if self.dist.world_size > 1:  # under torchrun, "rng" is rank 0's; each rank's goes here
            state["rng"]["ranks"] = self.dist.all_gather(self.rank_streams())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore model, optimizer, step and every RNG; lr and weight decay come from the
        config (they may change on resume), the schedule from the step."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(optimizer_state(state["optimizer"], self.optimizer))
        self.step = state["step"]
        self.best_exact_match = state["best_exact_match"]
        torch.set_rng_state(state["rng"]["torch"])
        self.data_rng.set_state(state["rng"]["data"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        if self.dist.world_size > 1:
            self.load_rank_streams(state["rng"].get("ranks", []))

    def rank_streams(self) -> dict[str, torch.Tensor]:
        """This rank's own RNG states: dropout (torch, CUDA) and training data."""
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return {"torch": torch.get_rng_state(), "data": self.data_rng.get_state(),
                "cuda": cuda if cuda is not None else torch.empty(0, dtype=torch.uint8)}

    def load_rank_streams(self, ranks: list[dict[str, torch.Tensor]]) -> None:
        """Each rank continues its own streams if as many ranks saved them, else starts anew."""
        rank = self.dist.rank
        if len(ranks) == self.dist.world_size:  # the same world size: an exact resume
            torch.set_rng_state(ranks[rank]["torch"])
            self.data_rng.set_state(ranks[rank]["data"])
            if len(ranks[rank]["cuda"]):
                torch.cuda.set_rng_state(ranks[rank]["cuda"], self.device)
        elif rank > 0:  # rank 0 continues the saved streams; the others must not repeat them
            seed = hash((self.cfg.seed, rank, self.step)) % 2**63  # ints hash alike everywhere
            torch.manual_seed(seed)
            self.data_rng.manual_seed(seed)


def init_state(cfg: Config, device: torch.device, dist: Dist = Dist()) -> RunState:
    """Task, model (seeded init) and optimizer for a fresh run."""
    task = make_task(cfg.task)
    check_lengths(cfg, task)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task).to(device)
    if dist.rank > 0:  # under torchrun: the same initial weights, but its own dropout masks
        torch.manual_seed(cfg.seed + dist.rank)
    optimizer = make_optimizer(model, cfg.train)
    data_rng = torch.Generator().manual_seed(cfg.seed + dist.rank)  # and its own batches
    return RunState(cfg, task, model, optimizer, data_rng, device=device,
                    model_or_wrapper=dist.wrap(model), dist=dist)


def check_lengths(cfg: Config, task: Task) -> None:
    """The model must have positions for the longest source and target of training."""
    task.check_positions(cfg.model.max_len)  # a pairs task: every pair of its files
    needed = task.positions_for_source(task.max_source_len(cfg.task.max_len))
    short = position_shortfall(cfg.model, needed, training=True)
    if short is not None:
        key, limit, needed = short
        raise MinitfmError(f"{key} ({limit}) is too small for task.max_len ({cfg.task.max_len}): "
                           f"sequences need {needed} positions; raise {key}")


class Reporter(Protocol):
    """Whom training tells how it goes: `progress.ConsoleReporter` in the CLI, else nobody."""

    def warning(self, text: str) -> None:
        """A note before the run starts (it ends inside its warmup, say)."""

    def start(self, run_dir: Path, state: RunState, device: torch.device,
              threads: str = "") -> None:
        """The run starts (or resumes) in `run_dir`; `threads` describes the CPU threads."""

    def step(self, step: int) -> None:
        """After every step that goes on: a progress bar moves."""

    def train_line(self, record: dict) -> None:
        """A train record of metrics.jsonl, every log.log_every steps."""

    def eval_line(self, record: dict) -> None:
        """An eval record of metrics.jsonl, after each evaluation."""

    def message(self, text: str) -> None:
        """A note between records (the thread count changed)."""

    def finish(self, summary: dict) -> None:
        """The run ended or paused: its summary (see `record_status`)."""


class NullReporter:
    """Reports nothing: the default when training is called as a library."""

    def warning(self, text: str) -> None: ...
    def start(self, run_dir: Path, state: RunState, device: torch.device,
              threads: str = "") -> None: ...
    def step(self, step: int) -> None: ...
    def train_line(self, record: dict) -> None: ...
    def eval_line(self, record: dict) -> None: ...
    def message(self, text: str) -> None: ...
    def finish(self, summary: dict) -> None: ...


class Logger(Protocol):
    """What training logs to: `lab.tb.TensorBoardLogger` from the CLI and the API, else nothing."""

    def __enter__(self) -> Logger:
        """The logger itself; leaving the block closes it."""

    def __exit__(self, *exc) -> None:
        """Close, however the block ended."""

    def train(self, step: int, record: dict) -> None:
        """The scalars of a train record of metrics.jsonl."""

    def eval(self, step: int, record: dict, pairs: list, predictions: list) -> None:
        """The scalars of an eval record, and some held-out pairs with their predictions."""

    def attention(self, snapshot) -> None:
        """Attention images and per-head scores of a snapshot (see `Recorder.take`)."""

    def finish(self, summary: dict) -> None:
        """Hyperparameters with the final metrics."""

    def close(self) -> None:
        """Flush and close the files (a second call does nothing)."""


class NullLogger:
    """Logs nothing: the default when no logger is handed in."""

    def __enter__(self) -> NullLogger:
        return self

    def __exit__(self, *exc) -> None: ...
    def train(self, step: int, record: dict) -> None: ...
    def eval(self, step: int, record: dict, pairs: list, predictions: list) -> None: ...
    def attention(self, snapshot) -> None: ...
    def finish(self, summary: dict) -> None: ...
    def close(self) -> None: ...


class Recorder(Protocol):
    """Who looks at attention over training: `lab.timeline.AttentionRecorder`, else nobody."""

    def evaluated(self, step: int, pairs: list, predictions: list, exact_match: float) -> None:
        """An evaluation at `step`: its pairs, predictions and exact match."""

    def take(self, step: int, model: torch.nn.Module) -> Any:
        """A snapshot of `model`'s attention at `step`, or None (none wanted now)."""

    def write(self, snapshot: Any) -> None:
        """Keep the snapshot (attention.jsonl)."""


class NullRecorder:
    """Records nothing: the default when no recorder is handed in."""

    def evaluated(self, step: int, pairs: list, predictions: list, exact_match: float) -> None: ...
    def take(self, step: int, model: torch.nn.Module) -> None: ...
    def write(self, snapshot: Any) -> None: ...


# Made once the run directory is known: (run_dir, cfg, task) and (run_dir, cfg, task, eval
# pairs, whether this process is rank 0).
LoggerFactory = Callable[[Path, Config, Task], Logger]
RecorderFactory = Callable[[Path, Config, Task, list, bool], Recorder]


def resume_config(checkpoint: dict[str, Any], overrides: list, path: Path | None = None,
                  names: OptionNames = CLI_NAMES) -> Config:
    """The checkpoint's config with the edits of its run's config.yaml (see `config_edits`;
    `path` is the checkpoint file), then `overrides` (`key=value` text or (key, value) pairs)
    applied; task and model may not change."""
    saved = checkpoint["config"]
    data = {section: dict(v) if isinstance(v, dict) else v for section, v in saved.items()}
    for key, old, new in config_edits(saved, path):
        if key.split(".")[0] in ("task", "model"):
            raise MinitfmError(f"{key} was edited in '{edited_file(path)}' ({old!r} -> "
                               f"{new!r}), but it cannot change on {names.resume}: it would "
                               f"change the model or task; undo the edit, or start a new run "
                               f"with that config")
        set_path(data, key, new)
    for item in overrides:
        set_path(data, *(item if isinstance(item, tuple) else parse_override(item)))
    cfg = validate(data)
    check_fits(training_parts(cfg), "training")
    for section in ("task", "model"):
        before, after = saved.get(section) or {}, getattr(cfg, section).model_dump()
        for key in before:
            if before[key] != after[key]:
                raise MinitfmError(f"{section}.{key} cannot change on {names.resume} "
                                   f"({before[key]!r} -> {after[key]!r}): it would change the "
                                   f"model or task; start a new run instead")
    return cfg


def edited_file(checkpoint: Path | None) -> Path | None:
    """The config.yaml of the run holding `checkpoint` (None: a loose file, or no such file)."""
    run_dir = find_run_dir(checkpoint) if checkpoint is not None else None
    path = run_dir / "config.yaml" if run_dir is not None else None
    return path if path is not None and path.is_file() else None


def config_edits(saved: dict[str, Any], checkpoint: Path | None) -> list[tuple[str, Any, Any]]:
    """(key, checkpoint's value, file's value) for each key the run's config.yaml states
    otherwise than the checkpoint's config `saved` does: a hand edit, or the overrides of a
    resume killed before its first save. Resume rewrites the file: an edit is applied or
    refused, never silently lost."""
    path = edited_file(checkpoint)
    if path is None:
        return []
    instead = "or remove it to continue with the checkpoint's config"
    try:
        data = read_yaml(path)
    except ConfigError as err:
        raise ConfigError(f"{err} (read on resume: fix the file, {instead})") from None
    resolve_data_paths(data, path.parent)  # as load_config reads a config file
    try:
        stated = validate(data).model_dump()
    except ConfigError as err:
        raise ConfigError(f"run config '{path}' (read on resume): {err}; fix the file, "
                          f"{instead}") from None
    before = validate(saved).model_dump()  # every key, also one an older checkpoint lacks
    changed = [(key, lookup(before, key), lookup(stated, key)) for key in stated_keys(data)]
    return [(key, old, new) for key, old, new in changed if old != new]


def stated_keys(data: dict[str, Any]) -> list[str]:
    """The dotted keys a config file states (a key left out is no edit): `seed`, `train.steps`."""
    keys = []
    for name, value in data.items():
        keys += [f"{name}.{key}" for key in value] if isinstance(value, dict) else [name]
    return keys


def lookup(data: dict[str, Any], key: str) -> Any:
    """`data["a"]["b"]` for the dotted `key` "a.b"."""
    for part in key.split("."):
        data = data[part]
    return data


def restore(state: RunState, checkpoint: dict[str, Any], path: Path) -> None:
    """Load a checkpoint into a fresh state; a mismatch is the checkpoint's fault, not a bug."""
    # The data first: pairs files that gained a symbol changed the vocabulary too, and the
    # files, not this minitfm version, are the cause.
    for key, value in state.task.checkpoint_data().items():
        if checkpoint.get(key) != value:  # pairs: files changed since the checkpoint
            raise CheckpointError(f"checkpoint '{path}' was trained on other data than "
                                  f"task.train_path and task.eval_path hold now: resuming "
                                  f"would change the task; start a new run")
    check_vocab(checkpoint, state.task, path)
    try:
        state.load_state_dict(checkpoint)
    except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as err:
        raise checkpoint_mismatch(path, err) from None


@dataclass
class RunCallbacks:
    """The loop's callbacks for one run (see `loop.Callbacks`): where it writes, whom it tells,
    what stops it, and the collectives that keep torchrun's ranks in step."""

    state: RunState
    run_dir: Path
    eval_pairs: list
    reporter: Reporter
    logger: Logger
    recorder: Recorder
    stop: StopSignal
    pacer: ThreadPacer
    stop_at: int | None = None  # pause after this step, as a signal would
    names: OptionNames = CLI_NAMES  # how messages name train's options
    started: float = field(default_factory=time.perf_counter)
    evaluated: tuple[int, EvalResult] | None = None  # the latest evaluation and its step
    signum: int = 0  # the signal every rank agreed to stop on (0: none)
    threads_told: bool = False  # a change of thread count is said once, not at every change

    def shared_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """The mean over ranks, so that a NaN on one rank stops them all at the same step."""
        return self.state.dist.average(losses)

    def train_line(self, step: int, meter: LossMeter, grad_norm: torch.Tensor) -> None:
        """A train record: to metrics.jsonl, the logger and the reporter."""
        tokens = self.state.dist.all_sum([meter.tokens])[0]  # under torchrun: all ranks' tokens
        log_train(self.state, self, meter.flush(tokens), grad_norm)

    def evaluate(self, step: int) -> float:
        """Greedy evaluation (see `run_eval`); its exact match."""
        self.evaluated = step, run_eval(self.state, self)
        return self.evaluated[1].exact_match

    def check(self, step: int) -> float:
        """A quick check (see `run_check`); its exact match."""
        return run_check(self.state, self)

    def snapshot(self, step: int) -> None:
        """The attention recorder's snapshot, to attention.jsonl and the logger."""
        log_attention(self.state, self)

    def save(self, step: int) -> None:
        """`checkpoints/last.pt`."""
        save(self.state, self, "last")

    def should_stop(self, step: int) -> bool:
        """A signal on any rank, or `stop_at`."""
        self.signum = self.stop.agreed(self.state.dist)
        return bool(self.signum) or step == self.stop_at

    def after_step(self, step: int) -> None:
        """The progress bar moves; the thread count follows other minitfm processes."""
        self.reporter.step(step)
        before = self.pacer.claim.threads
        if self.pacer.tick() and not self.threads_told:  # another minitfm process came or went
            self.threads_told = True
            self.reporter.message(threads_note(step, before, self.pacer.claim.threads))


def threads_note(step: int, before: int, now: int) -> str:
    """Why the thread count changed, in the line that says so (it is said once per run)."""
    unit = "thread" if now == 1 else "threads"
    why = "another minitfm process started" if now < before else "a minitfm process ended"
    return (f"step {step}: now {now} {unit} instead of {before}: {why}, and threads=auto "
            f"shares the cores among minitfm's processes (later changes are not shown; see "
            f"docs/operations.md#many-runs-on-one-machine)")


def train(cfg: Config, *, run_dir: Path | None = None, resume: Path | None = None,
          overrides: list[str] = (), overwrite: bool = False, reporter: Reporter | None = None,
          stop_at: int | None = None, threads: ThreadClaim | None = None,
          open_logger: LoggerFactory | None = None,
          open_recorder: RecorderFactory | None = None,
          names: OptionNames = CLI_NAMES) -> dict[str, Any]:
    """Train `cfg` (or continue the checkpoint `resume`); returns the final summary.

    `stop_at` pauses after that step as an interrupt would (saving `last.pt`), so a run can be
    continued later with `resume`. `threads` is this process's registration (see `threads`),
    made here if not given. `open_logger` and `open_recorder` make the TensorBoard logger and
    the attention recorder (see `app.api.train_run`); without them nothing is logged or
    recorded. Messages name the options as `names` spells them (the CLI's, or the API's).
    Under torchrun every rank calls this (see `distributed`): rank 0 alone writes the run
    directory and reports.
    """
    checkpoint = load_checkpoint(resume, resume=True) if resume is not None else None
    edits = []
    if checkpoint is not None:
        cfg = resume_config(checkpoint, overrides, resume, names)
        given = {item[0] if isinstance(item, tuple) else item.partition("=")[0].strip()
                 for item in overrides}  # a KEY=VALUE wins over the file
        edits = [edit for edit in config_edits(checkpoint["config"], resume)
                 if edit[0] not in given]
    check_fits(training_parts(cfg), "training")  # before anything is allocated or written
    with distributed.session(cfg.device) as dist, ExitStack() as held:
        claim = threads or held.enter_context(ThreadClaim(cfg.threads))
        claim.update(cfg.threads)
        claim.apply()
        device = dist.device if dist.world_size > 1 else pick_device(cfg.device)
        state = init_state(cfg, device, dist)
        if checkpoint is not None:
            # The schedule reads cfg.train, so a raised train.steps stretches the decay.
            restore(state, checkpoint, resume)
        # Under torchrun rank 0 alone shows progress, for every rank.
        reporter = (reporter or NullReporter()) if dist.is_main else NullReporter()
        # rank 0 picks the run directory and tells the others (or its error)
        run_dir = dist.from_main(lambda: open_run_dir(cfg, run_dir, resume, overwrite, held,
                                                      names))
        if edits:
            reporter.warning(edits_note(edits, run_dir))
        if (warning := warmup_warning(cfg.train)) is not None:
            reporter.warning(warning)
        try:
            instruments = open_logger or no_logger, open_recorder or no_recorder
            return run(state, run_dir, reporter, stop_at, claim, names, *instruments)
        except OSError as err:
            raise RunFailed(write_failure(err, run_dir)) from None


def edits_note(edits: list[tuple[str, Any, Any]], run_dir: Path) -> str:
    """What a resume took from the run's config.yaml rather than from the checkpoint."""
    changes = ", ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in edits)
    return (f"'{run_dir / 'config.yaml'}' differs from the checkpoint's config: continuing "
            f"with its {changes}")


def no_logger(run_dir: Path, cfg: Config, task: Task) -> NullLogger:
    """The logger when none is handed in."""
    return NullLogger()


def no_recorder(run_dir: Path, cfg: Config, task: Task, eval_pairs: list,
                is_main: bool) -> NullRecorder:
    """The recorder when none is handed in."""
    return NullRecorder()


def run(state: RunState, run_dir: Path, reporter: Reporter, stop_at: int | None,
        claim: ThreadClaim, names: OptionNames, open_logger: LoggerFactory,
        open_recorder: RecorderFactory) -> dict[str, Any]:
    """Train in a locked, prepared run directory; the logger is closed however it ends."""
    cfg, is_main = state.cfg, state.dist.is_main
    eval_pairs = eval_set(state.task, cfg.train.eval_samples, cfg.task.eval_seed)
    logger = open_logger(run_dir, cfg, state.task) if is_main else NullLogger()
    recorder = open_recorder(run_dir, cfg, state.task, eval_pairs, is_main)
    with StopSignal() as stop, logger:
        ctx = RunCallbacks(state, run_dir, eval_pairs, reporter, logger, recorder, stop,
                           ThreadPacer(claim), stop_at, names)
        reporter.start(run_dir, state, state.device, claim.describe())
        try:
            ended = run_loop(state, ctx)
            summary = pause(state, ctx) if ended == "paused" else finish(state, ctx)
        except RunFailed as err:  # a non-finite loss: every rank read the same losses
            record_status(state, ctx, "failed", error=str(err))
            state.dist.on_all_ranks(err)  # marked: the CLI prints rank 0's line only
            raise
        logger.finish(summary)
    reporter.finish(summary)
    return summary


def log_attention(state: RunState, ctx: RunCallbacks) -> None:
    """A snapshot of the probe's maps and the heads' scores: to attention.jsonl and TensorBoard."""
    snapshot = ctx.recorder.take(state.step, state.model)
    if snapshot is not None:
        ctx.recorder.write(snapshot)
        ctx.logger.attention(snapshot)


def pause(state: RunState, ctx: RunCallbacks) -> dict[str, Any]:
    """Save `last.pt` and stop: by a signal (raises Interrupted) or at `stop_at`."""
    save(state, ctx, "last")
    if signum := ctx.signum:
        summary = record_status(state, ctx, "interrupted")
        name = signal.Signals(signum).name
        ctx.logger.close()
        ctx.reporter.finish(summary)
        path = ctx.run_dir / "checkpoints" / "last.pt"
        again = " (under torchrun again, with any number of processes)" \
            if state.dist.world_size > 1 else ""
        raise state.dist.on_all_ranks(Interrupted(f"{name} at step {state.step}: saved {path}; "
                                                  f"continue with "
                                                  f"{ctx.names.again.format(ctx.run_dir)}"
                                                  f"{again}", 128 + signum))
    return record_status(state, ctx, "paused")


def finish(state: RunState, ctx: RunCallbacks) -> dict[str, Any]:
    """Final evaluation (unless the last step had one), attention images, `last.pt`."""
    step, last_eval = ctx.evaluated or (None, None)
    if step != state.step:
        last_eval = run_eval(state, ctx)
    if state.cfg.log.attention_every:  # `eval` too: the end has an evaluation
        log_attention(state, ctx)
    save(state, ctx, "last")
    status = "finished" if state.step >= state.cfg.train.steps else "stopped at target"
    return record_status(state, ctx, status, last_eval)


def save(state: RunState, ctx: RunCallbacks, name: str) -> None:
    """Write `checkpoints/<name>.pt`: every rank adds its RNG states, rank 0 writes the file."""
    snapshot = state.state_dict()
    if state.dist.is_main:
        save_checkpoint(snapshot, ctx.run_dir / "checkpoints" / f"{name}.pt")


def run_eval(state: RunState, ctx: RunCallbacks) -> EvalResult:
    """Greedy evaluation on the held-out set; keeps `best.pt` at the best exact match."""
    dist = state.dist
    pairs = ctx.eval_pairs[dist.rank::dist.world_size]  # under torchrun each rank takes a shard
    result = sum_over_ranks(evaluate(state.model, state.task, pairs, state.device), pairs, dist)
    record = {"step": state.step, "split": "eval", "loss": result.loss,
              "token_accuracy": result.token_accuracy, "exact_match": result.exact_match,
              "samples": result.total.count, "elapsed_s": time.perf_counter() - ctx.started}
    if dist.is_main:
        append_metrics(ctx.run_dir, record)
    ctx.logger.eval(state.step, record, pairs, result.predictions)
    ctx.recorder.evaluated(state.step, pairs, result.predictions, result.exact_match)
    ctx.reporter.eval_line(record)
    if result.exact_match > state.best_exact_match:  # the same on every rank, so is the save
        state.best_exact_match = result.exact_match
        save(state, ctx, "best")
    return result


def run_check(state: RunState, ctx: RunCallbacks) -> float:
    """Greedy exact match on the first fifth of the held-out set (at least one sequence),
    decoded only: no loss, no record, no save. It only calls an evaluation (`loop.check_due`)."""
    dist = state.dist
    pairs = check_pairs(ctx.eval_pairs)[dist.rank::dist.world_size]
    predictions = predict(state.model, state.task, [src for src, _ in pairs], state.device)
    exact = sum(pred == target for pred, (_, target) in zip(predictions, pairs, strict=True))
    exact, count = dist.all_sum([exact, len(pairs)])  # under torchrun: every rank's shard
    return exact / max(count, 1)


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


def log_train(state: RunState, ctx: RunCallbacks, record: dict, grad_norm) -> None:
    """A train record (`LossMeter.flush` with lr and gradient norm): to metrics.jsonl, the
    logger and the reporter."""
    record = {"step": state.step, "split": "train", **record,
              "lr": next_lr(state), "grad_norm": float(grad_norm),
              "elapsed_s": time.perf_counter() - ctx.started}
    if state.dist.is_main:
        append_metrics(ctx.run_dir, record)
    ctx.logger.train(state.step, record)
    ctx.reporter.train_line(record)


def summarize(state: RunState, ctx: RunCallbacks, result: EvalResult | None,
              paused: bool) -> dict[str, Any]:
    """Where the run is, how far it got, how well and how long it took."""
    summary = {"run_dir": str(ctx.run_dir), "step": state.step, "paused": paused,
               "best_exact_match": state.best_exact_match,
               "wall_s": time.perf_counter() - ctx.started, "peak_rss_mb": peak_rss_mb()}
    if result is not None:
        summary.update(exact_match=result.exact_match, token_accuracy=result.token_accuracy,
                       loss=result.loss)
    return summary


def record_status(state: RunState, ctx: RunCallbacks, status: str,
                  result: EvalResult | None = None, **extra: Any) -> dict[str, Any]:
    """The summary, written to `summary.json` by rank 0 (see `rundir.write_summary`)."""
    summary = summarize(state, ctx, result, paused=status not in ("finished", "stopped at target"))
    summary.update(status=status, steps=state.cfg.train.steps, **extra)
    if state.dist.is_main:
        summary["wall_s"] = write_summary(ctx.run_dir, summary)
    return summary
