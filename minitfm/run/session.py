"""The training loop: AdamW, warmup + decay, periodic greedy evaluation, checkpoints, resume.

One step: sample a batch from the task's training stream, teacher-forced cross-entropy on
`target + EOS` (PAD ignored), backward, the scheduled lr, clip and AdamW step. Every random draw
comes from a state that the checkpoint saves (torch's RNG for init and dropout, the data
generator), so N straight steps and N/2 + resume give bit-identical losses.
"""

from __future__ import annotations

import math
import shutil
import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from minitfm.book.metrics import EvalResult, LengthStats, evaluate
from minitfm.book.model import Seq2SeqTransformer, build_model, default_device, sequence_loss
from minitfm.book.optim import AdamW
from minitfm.config import Config, TrainConfig, parse_override, set_path, to_yaml, validate
from minitfm.errors import CheckpointError, Interrupted, MinitfmError, RunFailed
from minitfm.lab.runs import SUMMARY, write_summary
from minitfm.run import distributed
from minitfm.run.checkpoint import (
    RunLock,
    append_metrics,
    check_vocab,
    does_not_fit,
    find_run_dir,
    is_run_dir,
    load_checkpoint,
    new_run_dir,
    save_checkpoint,
    write_atomic,
)
from minitfm.run.distributed import Dist
from minitfm.run.limits import check_fits, training_parts
from minitfm.run.memory import peak_rss_mb
from minitfm.run.threads import ThreadClaim, ThreadPacer
from minitfm.tasks import make_task, positions_short
from minitfm.tasks.base import Task, eval_set, make_batch

if TYPE_CHECKING:  # tb and timeline are imported when a run starts
    from minitfm.lab.tb import Logger
    from minitfm.lab.timeline import AttentionRecorder


def pick_device(name: str) -> torch.device:
    """`auto` is CUDA when present, else CPU; an absent CUDA device is a clear error."""
    if name == "auto":
        return default_device()
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise MinitfmError(f"device ({name!r}) asked for CUDA but none is available: "
                               f"use device=cpu or device=auto")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise MinitfmError(f"device ({name!r}) does not exist: this machine has "
                               f"{torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


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
    """Everything a checkpoint must hold to continue a run exactly."""

    cfg: Config
    task: Task
    model: Seq2SeqTransformer
    optimizer: AdamW
    data_rng: torch.Generator
    step: int = 0
    best_exact_match: float = -1.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dist: Dist = field(default_factory=Dist)  # this rank under torchrun; else rank 0 of 1
    # What a step calls: under torchrun the model in its DDP wrapper, else the model itself.
    model_or_ddp: torch.nn.Module | None = None

    def __post_init__(self) -> None:
        if self.model_or_ddp is None:
            self.model_or_ddp = self.model

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
        self.optimizer.load_state_dict(state["optimizer"])
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


def init_state(cfg: Config, device: torch.device, dist: Dist = Dist()) -> TrainState:
    """Task, model (seeded init) and optimizer for a fresh run."""
    task = make_task(cfg.task)
    check_lengths(cfg, task)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task).to(device)
    if dist.rank > 0:  # under torchrun: the same initial weights, but its own dropout masks
        torch.manual_seed(cfg.seed + dist.rank)
    optimizer = make_optimizer(model, cfg.train)
    data_rng = torch.Generator().manual_seed(cfg.seed + dist.rank)  # and its own batches
    return TrainState(cfg, task, model, optimizer, data_rng, device=device, dist=dist,
                      model_or_ddp=dist.wrap(model))


def check_lengths(cfg: Config, task: Task) -> None:
    """The model must have positions for the longest source and target of training."""
    task.check_positions(cfg.model.max_len)  # a pairs task: every pair of its files
    short = positions_short(cfg.model, task, task.max_source_len(cfg.task.max_len), training=True)
    if short is not None:
        key, limit, needed = short
        raise MinitfmError(f"{key} ({limit}) is too small for task.max_len ({cfg.task.max_len}): "
                           f"sequences need {needed} positions; raise {key}")


def train_step(state: TrainState, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step on `batch`; returns the (detached) mean loss per target token and
    the gradient norm before clipping, both unread tensors on the device."""
    cfg = state.cfg.train
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=state.device.type == "cuda"):
        logits = state.model_or_ddp(batch.src, batch.tgt_in)  # (B, T, V)
    loss = sequence_loss(logits, batch.tgt_out, state.task.vocab.pad_id, cfg.label_smoothing)
    # Over ranks, so a NaN on one stops them all. Not read here: on CUDA, reading a value
    # waits for the GPU; `LossMeter` reads the losses every few steps and checks them then.
    mean_loss = state.dist.average(loss.detach())
    state.optimizer.zero_grad()
    loss.backward()  # under torchrun DDP averages the gradients over ranks here
    state.optimizer.lr = next_lr(state)  # the schedule: warmup, decay
    grad_norm = state.optimizer.step(cfg.grad_clip)
    state.step += 1
    return mean_loss, grad_norm


class StopSignal:
    """Turns the first SIGINT/SIGTERM into a flag the loop checks after each step."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second Ctrl-C aborts at once, even mid-save
            raise Interrupted(f"{signal.Signals(signum).name} again: stopped at once, without "
                              f"saving; the run's checkpoints are those saved before (a save "
                              f"cut short leaves the previous file intact)", 128 + signum)
        self.signum = signum

    def agreed(self, dist: Dist) -> int:
        """The signal any rank got (0: none), so that all ranks stop after the same step."""
        return dist.all_max(self.signum or 0)


class Reporter(Protocol):
    """Whom training tells how it goes: `progress.ConsoleReporter` in the CLI, else nobody."""

    def start(self, run_dir: Path, state: TrainState, device: torch.device,
              threads: str = "") -> None:
        """The run starts (or resumes) in `run_dir`; `threads` describes the CPU threads."""

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
    def start(self, run_dir: Path, state: TrainState, device: torch.device,
              threads: str = "") -> None: ...
    def step(self, step: int) -> None: ...
    def train_line(self, record: dict) -> None: ...
    def eval_line(self, record: dict) -> None: ...
    def message(self, text: str) -> None: ...
    def finish(self, summary: dict) -> None: ...


def check_fresh(run_dir: Path, overwrite: bool) -> None:
    """A run may go into a new or empty directory, or replace a minitfm run with `overwrite`."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"cannot create the run directory '{run_dir}' (a file of that "
                              f"name exists): check log.dir or --run-dir")
    if not run_dir.exists() or all(p.name == ".lock" for p in run_dir.iterdir()):
        return
    if not is_run_dir(run_dir):
        raise MinitfmError(f"directory '{run_dir}' is not empty and holds no minitfm run (no "
                           f"config.yaml or metrics.jsonl written by minitfm): pick another "
                           f"--run-dir; --overwrite replaces only minitfm runs")
    if not overwrite:
        raise MinitfmError(f"run directory '{run_dir}' already exists: continue it with "
                           f"--resume {run_dir}, pick another --run-dir, or pass --overwrite")


def resume_run_dir(checkpoint: Path, run_dir: Path | None) -> Path:
    """Where a resumed run goes on: the checkpoint's own run, or `run_dir` for a loose file."""
    own = find_run_dir(checkpoint)
    if own is not None:
        if run_dir is not None and run_dir.resolve() != own:
            raise MinitfmError(f"--run-dir ('{run_dir}') cannot be combined with --resume of "
                               f"run '{own}': a run goes on in its own directory; --run-dir is "
                               f"for a checkpoint kept outside any run")
        return own
    if run_dir is None:
        raise MinitfmError(f"checkpoint '{checkpoint}' is not inside a minitfm run "
                           f"(<run>/checkpoints/): to continue it, give --run-dir (a new or "
                           f"empty directory, or a minitfm run directory)")
    check_fresh(run_dir, overwrite=True)  # a minitfm run, new or empty: nothing else
    return run_dir


def write_run_files(run_dir: Path, cfg: Config, fresh: bool) -> None:
    """The resolved config.yaml; a fresh run also clears what an overwritten run left."""
    for stale in run_dir.glob("checkpoints/.*.tmp"):  # left by a save killed midway
        stale.unlink()
    if fresh:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        (run_dir / "attention.jsonl").unlink(missing_ok=True)
        (run_dir / SUMMARY).unlink(missing_ok=True)
        for old in [*run_dir.glob("checkpoints/*.pt"), *run_dir.glob("events.out.tfevents.*")]:
            old.unlink()
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    write_atomic(run_dir / "config.yaml", to_yaml(cfg).encode("utf-8"))


def resume_config(checkpoint: dict[str, Any], overrides: list[str]) -> Config:
    """The checkpoint's config with `overrides` applied; task and model may not change."""
    saved = checkpoint["config"]
    data = {section: dict(v) if isinstance(v, dict) else v for section, v in saved.items()}
    for item in overrides:
        set_path(data, *parse_override(item))
    cfg = validate(data)
    check_fits(training_parts(cfg), "training")
    for section in ("task", "model"):
        before, after = saved.get(section) or {}, getattr(cfg, section).model_dump()
        for key in before:
            if before[key] != after[key]:
                raise MinitfmError(f"{section}.{key} cannot change on --resume ({before[key]!r} "
                                   f"-> {after[key]!r}): it would change the model or task; "
                                   f"start a new run instead")
    return cfg


def open_run_dir(cfg: Config, run_dir: Path | None, resume: Path | None, overwrite: bool,
                 held: ExitStack) -> Path:
    """Pick, check, lock (until `held` closes) and prepare the run directory."""
    try:
        if resume is not None:
            if overwrite:
                raise MinitfmError("--overwrite cannot be combined with --resume: a resumed run "
                                   "keeps its files")
            run_dir = resume_run_dir(resume, run_dir)
        else:
            run_dir = run_dir or new_run_dir(cfg.log.dir, cfg.name)
            check_fresh(run_dir, overwrite)
        created = not run_dir.exists()
        held.enter_context(RunLock(run_dir))
    except OSError as err:  # a name too long, a path through a file, no permission
        where = err.filename or run_dir or Path(cfg.log.dir) / cfg.name
        raise CheckpointError(f"cannot create the run directory '{where}' ({err.strerror}): "
                              f"check log.dir, name or --run-dir") from None
    try:
        write_run_files(run_dir, cfg, fresh=resume is None)
    except OSError as err:
        if created:  # a disk full from the start: leave nothing behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise RunFailed(write_failure(err, run_dir)) from None
    return run_dir


def restore(state: TrainState, checkpoint: dict[str, Any], path: Path) -> None:
    """Load a checkpoint into a fresh state; a mismatch is the checkpoint's fault, not a bug."""
    check_vocab(checkpoint, state.task, path)
    for key, value in state.task.checkpoint_data().items():
        if checkpoint.get(key) != value:  # pairs: files changed since the checkpoint
            raise CheckpointError(f"checkpoint '{path}' was trained on other data than "
                                  f"task.train_path and task.eval_path hold now: resuming "
                                  f"would change the task; start a new run")
    try:
        state.load_state_dict(checkpoint)
    except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as err:
        raise does_not_fit(path, err) from None


@dataclass
class RunContext:
    """What the loop needs besides the state: where to write and whom to tell."""

    run_dir: Path
    eval_pairs: list
    reporter: Reporter
    logger: Logger
    recorder: AttentionRecorder
    stop: StopSignal
    pacer: ThreadPacer
    started: float = field(default_factory=time.perf_counter)


def train(cfg: Config, *, run_dir: Path | None = None, resume: Path | None = None,
          overrides: list[str] = (), overwrite: bool = False, reporter: Reporter | None = None,
          stop_at: int | None = None, threads: ThreadClaim | None = None) -> dict[str, Any]:
    """Train `cfg` (or continue the checkpoint `resume`); returns the final summary.

    `stop_at` pauses after that step as an interrupt would (saving `last.pt`), so a run can be
    continued later with `resume`. `threads` is this process's registration (see `threads`),
    made here if not given. Under torchrun every rank calls this (see `distributed`): rank 0
    alone writes the run directory and reports.
    """
    checkpoint = load_checkpoint(resume, resume=True) if resume is not None else None
    if checkpoint is not None:
        cfg = resume_config(checkpoint, overrides)
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
        run_dir = dist.from_main(lambda: open_run_dir(cfg, run_dir, resume, overwrite, held))
        if (warning := warmup_warning(cfg.train)) is not None:
            reporter.warning(warning)
        try:
            return run(state, run_dir, reporter, stop_at, claim)
        except OSError as err:
            raise RunFailed(write_failure(err, run_dir)) from None


def write_failure(err: OSError, run_dir: Path) -> str:
    """One line for a failed write (a full disk, say): what failed, and what is still safe."""
    where = err.filename or run_dir
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))
    kept = (f"; {', '.join(saved)} in {run_dir / 'checkpoints'} stay valid" if saved
            else "; no checkpoint was written yet")
    return f"cannot write to '{where}' ({err.strerror or err}){kept}"


def run(state: TrainState, run_dir: Path, reporter: Reporter, stop_at: int | None,
        claim: ThreadClaim) -> dict[str, Any]:
    """Train in a locked, prepared run directory; the logger is closed however it ends."""
    from minitfm.lab.tb import NullLogger, open_logger
    from minitfm.lab.timeline import open_recorder

    cfg, is_main = state.cfg, state.dist.is_main
    eval_pairs = eval_set(state.task, cfg.train.eval_samples, cfg.task.eval_seed)
    logger = open_logger(run_dir, cfg, state.task) if is_main else NullLogger()
    recorder = open_recorder(run_dir, cfg, state.task, eval_pairs, is_main)
    with StopSignal() as stop, logger:
        ctx = RunContext(run_dir, eval_pairs, reporter, logger, recorder, stop,
                         ThreadPacer(claim))
        reporter.start(run_dir, state, state.device, claim.describe())
        try:
            summary = run_loop(state, ctx, stop_at)
        except RunFailed as err:
            record_status(state, ctx, "failed", error=str(err))
            raise
        logger.finish(summary)
    reporter.finish(summary)
    return summary


def run_loop(state: TrainState, ctx: RunContext, stop_at: int | None) -> dict[str, Any]:
    """Step until train.steps, the target exact match, `stop_at` or a signal."""
    cfg, vocab = state.cfg, state.task.vocab
    meter = LossMeter(state.step)
    last_eval: EvalResult | None = None
    while state.step < cfg.train.steps:
        batch = make_batch(state.task.sample(cfg.train.batch_size, state.data_rng), vocab)
        loss, grad_norm = train_step(state, batch.to(state.device))
        meter.add(loss, batch.n_target_tokens)
        ctx.reporter.step(state.step)
        step = state.step
        evaluate_now = due(step, cfg.train.eval_every)
        attention_now = due(step, attention_every(cfg))
        save_now = evaluate_now or due(step, cfg.train.checkpoint_every)
        if step % cfg.log.log_every == 0 or evaluate_now or attention_now or save_now:
            meter.read(state)  # a non-finite loss stops the run here, before anything is saved
        if step % cfg.log.log_every == 0:
            log_train(state, ctx, meter.flush(state.dist), grad_norm)
        last_eval = None
        if evaluate_now:
            last_eval = run_eval(state, ctx)
            if reached_target(state, last_eval):
                break
        if attention_now:
            log_attention(state, ctx)
        if save_now:
            save(state, ctx, "last")  # after each evaluation too: a kill -9 loses little
        signum = ctx.stop.agreed(state.dist)
        if signum or step == stop_at:
            meter.read(state)
            return pause(state, ctx, signum)
        if ctx.pacer.tick():  # another minitfm process started or ended
            ctx.reporter.message(f"step {step}: now {ctx.pacer.claim.describe()}")
    meter.read(state)
    return finish(state, ctx, last_eval)


def due(step: int, every: int) -> bool:
    """Whether something done every `every` steps (0: never) is done after `step`."""
    return every > 0 and step % every == 0


def attention_every(cfg: Config) -> int:
    """Steps between attention snapshots: log.attention_every, or train.eval_every for `eval`."""
    every = cfg.log.attention_every
    return cfg.train.eval_every if every == "eval" else every


def log_attention(state: TrainState, ctx: RunContext) -> None:
    """A snapshot of the probe's maps and the heads' scores: to attention.jsonl and TensorBoard."""
    snapshot = ctx.recorder.take(state.step, state.model)
    if snapshot is not None:
        ctx.recorder.write(snapshot)
        ctx.logger.attention(snapshot)


def reached_target(state: TrainState, result: EvalResult) -> bool:
    target = state.cfg.train.target_exact_match
    return target is not None and result.exact_match >= target


def pause(state: TrainState, ctx: RunContext, signum: int) -> dict[str, Any]:
    """Save `last.pt` and stop: by a signal (raises Interrupted) or at `stop_at`."""
    save(state, ctx, "last")
    if signum:
        summary = record_status(state, ctx, "interrupted")
        name = signal.Signals(signum).name
        ctx.logger.close()
        ctx.reporter.finish(summary)
        path = ctx.run_dir / "checkpoints" / "last.pt"
        again = " (under torchrun again, with any number of processes)" \
            if state.dist.world_size > 1 else ""
        raise state.dist.on_all_ranks(Interrupted(f"{name} at step {state.step}: saved {path}; "
                                                  f"continue with minitfm train --resume "
                                                  f"{ctx.run_dir}{again}", 128 + signum))
    return record_status(state, ctx, "paused")


def finish(state: TrainState, ctx: RunContext, last_eval: EvalResult | None) -> dict[str, Any]:
    """Final evaluation (unless the last step had one), attention images, `last.pt`."""
    if last_eval is None:
        last_eval = run_eval(state, ctx)
    if state.cfg.log.attention_every:  # `eval` too: the end has an evaluation
        log_attention(state, ctx)
    save(state, ctx, "last")
    status = "finished" if state.step >= state.cfg.train.steps else "stopped at target"
    return record_status(state, ctx, status, last_eval)


def save(state: TrainState, ctx: RunContext, name: str) -> None:
    """Write `checkpoints/<name>.pt`: every rank adds its RNG states, rank 0 writes the file."""
    snapshot = state.state_dict()
    if state.dist.is_main:
        save_checkpoint(snapshot, ctx.run_dir / "checkpoints" / f"{name}.pt")


def run_eval(state: TrainState, ctx: RunContext) -> EvalResult:
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


def next_lr(state: TrainState) -> float:
    """The learning rate of the step after `state.step` (what the train line reports)."""
    return state.cfg.train.lr * lr_factor(state.step, state.cfg.train)


def log_train(state: TrainState, ctx: RunContext, record: dict, grad_norm) -> None:
    record = {"step": state.step, "split": "train", **record,
              "lr": next_lr(state), "grad_norm": float(grad_norm),
              "elapsed_s": time.perf_counter() - ctx.started}
    if state.dist.is_main:
        append_metrics(ctx.run_dir, record)
    ctx.logger.train(state.step, record)
    ctx.reporter.train_line(record)


class LossMeter:
    """Mean loss and target tokens/s since the last train line; stops a run whose loss is not
    finite.

    The step's loss stays an unread tensor on its device: reading a CUDA tensor makes the CPU
    wait for the GPU, so `read` fetches the losses of many steps at once (every log.log_every
    steps, and before anything is evaluated or saved) and names the first non-finite one.
    """

    def __init__(self, step: int):
        self.unread: list[torch.Tensor] = []  # 0-dim losses of the steps after `self.step`
        self.step = step  # the last step whose loss was read
        self.losses: list[float] = []  # read since the last train line
        self.tokens = 0
        self.since = time.perf_counter()

    def add(self, loss: torch.Tensor, tokens: int) -> None:
        self.unread.append(loss)
        self.tokens += tokens

    def read(self, state: TrainState) -> None:
        """Fetch the unread losses (one wait for the device); RunFailed at a non-finite one."""
        if not self.unread:
            return
        values = torch.stack(self.unread).tolist()
        first = self.step + 1  # the step of values[0]
        self.unread, self.step = [], self.step + len(values)
        for i, value in enumerate(values):
            if not math.isfinite(value):
                cfg = state.cfg.train
                clip = "" if cfg.grad_clip is not None else " or set train.grad_clip (e.g. 1.0)"
                raise state.dist.on_all_ranks(RunFailed(
                    f"loss became {value} at step {first + i}: lower train.lr ({cfg.lr})"
                    f"{clip}; no checkpoint was written for it"))
        self.losses += values

    def flush(self, dist: Dist = Dist()) -> dict[str, float]:
        """The train line's loss and tokens/s (after `read`), and a fresh start for the next."""
        now = time.perf_counter()
        tokens = dist.all_sum([self.tokens])[0]  # under torchrun: all ranks' tokens
        record = {"loss": sum(self.losses) / max(len(self.losses), 1),
                  "tokens_per_s": tokens / max(now - self.since, 1e-9)}
        self.losses, self.tokens, self.since = [], 0, now
        return record


def summarize(state: TrainState, ctx: RunContext, result: EvalResult | None,
              paused: bool) -> dict[str, Any]:
    summary = {"run_dir": str(ctx.run_dir), "step": state.step, "paused": paused,
               "best_exact_match": state.best_exact_match,
               "wall_s": time.perf_counter() - ctx.started, "peak_rss_mb": peak_rss_mb()}
    if result is not None:
        summary.update(exact_match=result.exact_match, token_accuracy=result.token_accuracy,
                       loss=result.loss)
    return summary


def record_status(state: TrainState, ctx: RunContext, status: str,
                  result: EvalResult | None = None, **extra: Any) -> dict[str, Any]:
    """The summary, written to `summary.json` by rank 0 (see `runs.write_summary`)."""
    summary = summarize(state, ctx, result, paused=status not in ("finished", "stopped at target"))
    summary.update(status=status, steps=state.cfg.train.steps, **extra)
    if state.dist.is_main:
        summary["wall_s"] = write_summary(ctx.run_dir, summary)
    return summary
