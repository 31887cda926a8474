"""A trained run, loaded once: what `minitfm eval`, `predict`, `visualize-attention`, `ablate`
and `explore` look at, and what the Python API's `Run` is.

`load` reads a RUN argument (a run directory or a .pt file; None: the most recent run under
./runs) and `--checkpoint` once, rebuilds the model from the checkpoint and gives a `Loaded`
value; the lab's functions take it whole instead of a config, task, model, device, path and
step one by one.

The model runs the code its run trained with (`model.code`: fast or book), except a learner's
workbook: minitfm imports a workbook only when the command asks for it (`--book DIR`), so a run
trained with one runs the book's code on its weights, and says so (see `learn.code`). The model
runs a workbook's code inside `Loaded.running`, where whatever that code raises is one line.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import Config, validate
from minitfm.errors import MinitfmError, option
from minitfm.lab.options import AblateOptions
from minitfm.learn.code import Code, code_for, is_workbook
from minitfm.learn.workbook import learner_errors
from minitfm.run.checkpoint import check_vocab, checkpoint_mismatch, load_checkpoint
from minitfm.run.devices import default_device
from minitfm.run.limits import check_fits, model_parts
from minitfm.run.rundir import find_run_dir
from minitfm.run.session import drawing_aside
from minitfm.run.which_run import pick_checkpoint
from minitfm.tasks import make_task
from minitfm.tasks.base import Pair, Task, eval_set


@dataclass
class Loaded:
    """A trained model loaded from a checkpoint, in eval mode, with its config and task."""

    checkpoint: Path  # the .pt file
    step: int  # the training step it was saved at
    config: Config = field(repr=False)
    task: Task = field(repr=False)
    model: Seq2SeqTransformer = field(repr=False)
    device: torch.device = field(repr=False)
    note: str | None = field(default=None, repr=False)  # "best" fell back to last.pt: why
    code: Code | None = field(default=None, repr=False)  # which code the model runs
    code_note: str | None = field(default=None, repr=False)  # a workbook's run on the book's

    def running(self, json_out: bool = False) -> AbstractContextManager:
        """Where the model runs: a workbook's errors there are one line naming its file and
        line, and with `json_out` (--json) its print() goes to stderr (`learner_errors`)."""
        return learner_errors(self.code.workbook if self.code is not None else None, json_out)

    @property
    def run_dir(self) -> Path | None:
        """The run directory holding the checkpoint (None for a loose .pt file)."""
        return find_run_dir(self.checkpoint)

    def held_out(self) -> list[Pair]:
        """The held-out set training evaluated on (`train.eval_samples` pairs of
        `task.eval_seed`); its probe is the example TensorBoard shows."""
        cfg = self.config
        return eval_set(self.task, cfg.train.eval_samples, cfg.task.eval_seed)

    def ablation_pairs(self, samples: int = AblateOptions.samples) -> list[Pair]:
        """The held-out pairs `minitfm ablate` decodes and takes its head means over."""
        cfg = self.config
        return eval_set(self.task, samples, cfg.task.eval_seed, cfg.task.min_len,
                        cfg.task.max_len)

    def picture_path(self, folder: str, name: str) -> Path:
        """`<run>/<folder>/<checkpoint>-<name>`; for a checkpoint outside any run,
        `<checkpoint>-<folder>-<name>` beside the file (never in a directory that is not ours)."""
        run_dir, stem = self.run_dir, self.checkpoint.stem
        if run_dir is None:
            return self.checkpoint.with_name(f"{stem}-{folder}-{name}")
        return run_dir / folder / f"{stem}-{name}"


def load(run: str | Path | None = None, checkpoint: str = "best", *,
         device: torch.device | str | None = None, book: str | Path | None = None) -> Loaded:
    """The checkpoint a RUN argument and `checkpoint` ("best" or "last") mean, loaded on
    `device` (default: this machine's, as the commands use), its model running a workbook's
    code if `book` names one. When "best" falls back to last.pt (the run has not been evaluated
    yet), `note` says so; if the loading then fails, the error carries that note (`add_note`)."""
    path, note = pick_checkpoint(run, checkpoint)
    try:
        return read_checkpoint(path, note, device, book)
    except MinitfmError as err:
        if note is not None:
            err.add_note(note)
        raise


def read_checkpoint(path: Path, note: str | None = None,
                    device: torch.device | str | None = None,
                    book: str | Path | None = None) -> Loaded:
    """The checkpoint file `path` loaded (see `load`): its config validated, its task and model
    rebuilt, each checked against this minitfm version."""
    state = load_checkpoint(path)
    try:
        cfg = validate(state["config"])
        task = make_task(cfg.task, state)
        check_vocab(state, task, path)
        check_fits(model_parts(cfg), "the model")
    except (KeyError, RuntimeError, TypeError, ValueError) as err:
        raise checkpoint_mismatch(path, err) from None
    code, code_note = run_code(cfg.model.code, book)
    try:
        # a workbook's own __init__ runs here; its initial weights, overwritten at once, are
        # drawn aside: nobody's numbers
        with learner_errors(code.workbook), drawing_aside():
            model = code.build(cfg, task)
            model.load_state_dict(state["model"])
    except (KeyError, RuntimeError, TypeError, ValueError) as err:
        raise checkpoint_mismatch(path, err) from None
    device = torch.device(device) if device is not None else default_device()
    return Loaded(path, state["step"], cfg, task, model.to(device).eval(), device, note, code,
                  code_note)


def run_code(trained: str, book: str | Path | None) -> tuple[Code, str | None]:
    """The code a loaded model runs: the workbook `book` if asked for, else the run's own; a
    run that trained a workbook's code runs the book's, with a note saying so."""
    if book is not None:
        code = code_for(str(Path(book).resolve()))
        other = None if code.name == trained else (
            f"this run trained with {describe(trained)}: its weights run here with the code of "
            f"{code.describe()}")
        return code, other
    if not is_workbook(trained):
        return code_for(trained), None
    return code_for("book"), (f"this run trained the code of the workbook {trained}: its "
                              f"weights run here with the book's code (give "
                              f"{option('book', trained)} to run yours; minitfm runs a "
                              f"workbook only when asked)")


def describe(code: str) -> str:
    """A model.code value in words."""
    return f"the code of {code}" if is_workbook(code) else f"model.code {code}"
