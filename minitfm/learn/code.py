"""Which code a run runs: the config key `model.code`.

`fast` (the default): the book's model with the speed appendix installed (`minitfm.fast`).
`book`: the book's own readable code. A folder: a learner's workbook (`minitfm learn start`):
its functions wherever written, the book's wherever not. The choice is per model and travels in
the run's config and checkpoints; a `Code` is what the run floor asks for the model's class,
the training loop's chapter and the metrics' chapter, so a workbook's loop and metrics run too.

minitfm imports a workbook only from a folder named on the command line (`--book DIR`, a
`model.code=DIR` override, `learn check DIR`; from Python, `book=`), never because a file names
it: a config file whose model.code names one is refused (`config.refuse_named_workbook`), and a
run folder that names one (a run can come from someone else) runs with the book's code unless
the same workbook is asked for again. And only a workbook of the user's own, which nobody else
may write (`trust`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

import minitfm.book.loop
import minitfm.book.metrics
from minitfm.errors import quote
from minitfm.fast.model import CODES
from minitfm.learn.exercises import EXERCISES
from minitfm.learn.workbook import Workbook, WorkbookError, load_workbook


@dataclass(frozen=True)
class Code:
    """The model class and the chapters a run trains and measures with."""

    name: str  # "fast", "book", or a workbook's folder
    model: type  # Seq2SeqTransformer or a subclass, or the workbook's own class
    loop: types.ModuleType  # lr_factor, make_optimizer, train_step, run_loop, ...
    metrics: types.ModuleType  # evaluate, predict, ...
    workbook: Workbook | None = None

    def build(self, cfg, task):
        """The model `cfg.model` describes, sized for the task's vocabulary."""
        return self.model(cfg.model, len(task.vocab), task.vocab.pad_id)

    def describe(self) -> str:
        """For a run's header: `fast`, `book`, `workbook DIR` or `bug zoo DIR`."""
        if self.workbook is None:
            return self.name
        return f"{'bug zoo' if self.workbook.kind == 'zoo' else 'workbook'} {self.name}"

    def whose(self) -> str:
        """For a workbook, which exercises run the learner's code and which the book's."""
        if self.workbook is None:
            return ""
        if self.workbook.kind == "zoo":
            return "the bug zoo's code, every chapter of it, its bugs and your fixes"
        yours = self.workbook.written
        book = [e.name for e in EXERCISES if e.name not in yours]
        return (f"your code: {', '.join(yours) or 'none yet'}; the book's: "
                f"{', '.join(book) or 'none'}")

    def record(self) -> dict:
        """What a checkpoint keeps of a workbook's code: its folder, files' hash, functions."""
        if self.workbook is None:
            return {}
        return {"workbook": {"path": self.name, "sha256": self.workbook.digest,
                             "learner": list(self.workbook.written)}}


def is_workbook(name: str) -> bool:
    """Whether a `model.code` value names a folder rather than fast or book."""
    return name not in CODES


def code_for(name: str) -> Code:
    """The code `model.code` names; a workbook folder is imported (see the module docstring)."""
    if not is_workbook(name):
        return Code(name, CODES[name], minitfm.book.loop, minitfm.book.metrics)
    if not Path(name).is_dir():
        raise WorkbookError(f"model.code ({quote(name)}) is neither fast nor book nor a "
                            f"workbook folder: use fast, book, or a folder made by minitfm learn "
                            f"start")
    workbook = load_workbook(name)
    modules = workbook.modules
    return Code(str(workbook.folder), modules["model"].Seq2SeqTransformer, modules["loop"],
                modules["metrics"], workbook)
