"""Instruments: whatever watches a run train, all plugged in one way.

A run turns its steps into the events below (`Preparing`, `Started`, `TrainLine`, ...) and
tells each one to every instrument of its list, in the list's order, on rank 0 only under
torchrun. An instrument is a class with a method per event it wants (`Instrument` does nothing
for the others). The run writes its own `metrics.jsonl` through one (`MetricsFile`, its lines
added by `append_metrics`, as the gauges' are); `app` composes the others: the console's
progress, TensorBoard, the attention recorder. A new training-time instrument is its class and
one line there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from minitfm.errors import percent
from minitfm.run.files import to_json
from minitfm.run.rundir import open_run_file

if TYPE_CHECKING:  # for annotations only: this module loads no torch
    import torch

    from minitfm.config import Config
    from minitfm.tasks.base import Pair, Task


@dataclass(frozen=True)
class Preparing:
    """The run is about to open its directory, nothing written yet: an instrument that cannot
    work (a tracker that does not answer) refuses here, with a MinitfmError."""

    hook: ClassVar[str] = "on_prepare"
    cfg: Config


@dataclass(frozen=True)
class Started:
    """The run starts, or goes on from a checkpoint at `step`."""

    hook: ClassVar[str] = "on_start"
    run_dir: Path
    cfg: Config
    task: Task
    model: torch.nn.Module = field(repr=False)  # for an instrument that looks inside (hooks)
    eval_pairs: list[Pair] = field(repr=False)  # the held-out set every evaluation decodes
    step: int
    device: torch.device
    threads: str  # this process's CPU threads, described (see threads.ThreadClaim)
    ranks: int = 1  # processes under torchrun, each with train.batch_size sequences a step
    code: str = "fast"  # which code trains (model.code): fast, book or workbook DIR
    whose: str = ""  # a workbook's: which functions are the learner's and which the book's


@dataclass(frozen=True)
class Note:
    """A line for whoever reads the run: a warning or a note before it starts, or a change on
    the way (the thread count followed other minitfm processes)."""

    hook: ClassVar[str] = "on_note"
    text: str
    warning: bool = False
    aside: bool = False  # a note before the run starts (`note: ...`), not a line of its own


@dataclass(frozen=True)
class TrainLine:
    """Every log.log_every steps: the mean loss and target tokens/s of the steps since the
    last line (evaluations and saves set aside), the next step's lr, the gradient norm."""

    hook: ClassVar[str] = "on_train_line"
    step: int
    loss: float
    tokens_per_s: float
    lr: float
    grad_norm: float
    elapsed_s: float  # since the run (or this resume) started

    def record(self) -> dict[str, Any]:
        """The line of metrics.jsonl."""
        return {"step": self.step, "split": "train", "loss": self.loss,
                "tokens_per_s": self.tokens_per_s, "lr": self.lr, "grad_norm": self.grad_norm,
                "elapsed_s": self.elapsed_s}


@dataclass(frozen=True)
class Evaluation:
    """A greedy evaluation on the held-out set: its figures, and the pairs this process decoded
    with their predictions."""

    hook: ClassVar[str] = "on_evaluation"
    step: int
    loss: float
    token_accuracy: float
    exact_match: float
    samples: int
    elapsed_s: float
    pairs: list[Pair] = field(repr=False)
    predictions: list[list[int]] = field(repr=False)

    def record(self) -> dict[str, Any]:
        """The line of metrics.jsonl."""
        return {"step": self.step, "split": "eval", "loss": self.loss,
                "token_accuracy": self.token_accuracy, "exact_match": self.exact_match,
                "samples": self.samples, "elapsed_s": self.elapsed_s}


@dataclass(frozen=True)
class SnapshotDue:
    """Time for a look at the attention: every log.attention_every steps, and at the end."""

    hook: ClassVar[str] = "on_snapshot"
    step: int
    model: torch.nn.Module = field(repr=False)


@dataclass(frozen=True)
class GaugesDue:
    """Time to read the gauges: every log.gauge_every steps. The gauge reader, first of the
    instruments to hear it, puts its reading in `reading`; those after it show that."""

    hook: ClassVar[str] = "on_gauges"
    step: int
    model: torch.nn.Module = field(repr=False)
    reading: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Saved:
    """A checkpoint was written: `last.pt` or `best.pt`."""

    hook: ClassVar[str] = "on_saved"
    step: int
    path: Path


@dataclass(frozen=True)
class Stepped:
    """A step is done and the run goes on."""

    hook: ClassVar[str] = "on_step"
    step: int


@dataclass(frozen=True)
class Ended:
    """The run finished, stopped at its target, paused or was interrupted: its summary (the
    dict of summary.json; `status` says which)."""

    hook: ClassVar[str] = "on_end"
    summary: dict[str, Any]


def ending(summary: dict[str, Any], target: float | None) -> str:
    """Why the run ended, in plain words, from its summary (`Ended`) and
    train.target_exact_match."""
    step, steps, status = summary["step"], summary["steps"], summary["status"]
    if status == "stopped at target":
        return f"reached the {percent(target)} target at step {step} of {steps}"
    if status != "finished":
        return f"{status} at step {step} of {steps}"
    best = max(summary["best_exact_match"], 0)
    if target is None:
        return f"finished all {steps} steps"
    if best >= target:  # at the last evaluation: the loop stops there either way
        return f"finished all {steps} steps, reaching the {percent(target)} target"
    return (f"finished all {steps} steps (best exact match {best:.1%}, short of the "
            f"{percent(target)} target)")


class Instrument:
    """Something that watches a run: one method per event, each doing nothing until a
    subclass overrides it."""

    def on_prepare(self, preparing: Preparing) -> None:
        """Before the run directory is made (see `Preparing`)."""

    def on_start(self, run: Started) -> None:
        """Before the first step: where the run goes, what it trains."""

    def on_note(self, note: Note) -> None:
        """A warning or a note."""

    def on_train_line(self, line: TrainLine) -> None:
        """A train line."""

    def on_evaluation(self, evaluation: Evaluation) -> None:
        """An evaluation."""

    def on_snapshot(self, due: SnapshotDue) -> None:
        """A look at the attention is due."""

    def on_gauges(self, due: GaugesDue) -> None:
        """The gauges are due (see `GaugesDue`)."""

    def on_saved(self, saved: Saved) -> None:
        """A checkpoint was written."""

    def on_step(self, stepped: Stepped) -> None:
        """A step is done."""

    def on_end(self, ended: Ended) -> None:
        """The run ended (an error ends it without this event)."""

    def close(self) -> None:
        """However the run ended: let go of files (a second call does nothing)."""


def tell(instruments: Iterable[Instrument], event: Any) -> None:
    """Hand `event` to each instrument, by the method the event names."""
    for instrument in instruments:
        getattr(instrument, event.hook)(event)


@contextmanager
def closing(instruments: Iterable[Instrument]) -> Iterator[None]:
    """Close every instrument on the way out, however the block ends."""
    with ExitStack() as stack:
        for instrument in instruments:
            stack.callback(instrument.close)
        yield


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to `metrics.jsonl`."""
    with open_run_file(run_dir / "metrics.jsonl", "a") as f:
        f.write(to_json(record) + "\n")


class MetricsFile(Instrument):
    """The run's metrics.jsonl: one JSON line per train line and per evaluation."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def on_start(self, run: Started) -> None:
        self.run_dir = run.run_dir

    def on_train_line(self, line: TrainLine) -> None:
        append_metrics(self.run_dir, line.record())

    def on_evaluation(self, evaluation: Evaluation) -> None:
        append_metrics(self.run_dir, evaluation.record())
