"""Grading an exercise: the book with one function replaced by the learner's, checked.

Each exercise has a list of checks (`CHECKS`), run in order until one fails: each calls the
learner's version on small float64 inputs and compares it with PyTorch's own implementation
where there is one, else with the book's and with properties the function must have (decoding
with a KV cache equals decoding without; RoPE keeps norms). A failed check names what differs
and, where it recognises it, the likely mistake: the learner's output is compared with the
outputs of known wrong versions (`diagnose`), so "the scaling is missing" is said only when
the output is that of attention without the scaling.

The learner's function is graded alone: its global names are the book's wherever the book
defines them (`subject_from`), so a wrong `attention` does not fail `MultiHeadAttention.forward`.
The checks, a module per chapter in the book's order: `attention.py`, `layers.py`,
`positions.py`, `model.py` (its greedy decoding in `decoding.py`), `training.py`.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from minitfm.errors import from_signal, shown_path
from minitfm.learn.exercises import EXERCISES, Exercise
from minitfm.learn.workbook import error_text, rebind

DTYPE = torch.float64
PACKAGE = Path(__file__).resolve().parents[2]  # minitfm/: frames there are minitfm's
TIME_LIMIT_S = 30.0  # an exercise's checks take a second or two: past this, an endless loop


class Mismatch(Exception):
    """A check that failed: what differs (`message`), and the likely mistake (`hint`)."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass(frozen=True)
class Subject:
    """What the checks call: an exercise's function, the learner's, with the book around it."""

    exercise: Exercise
    function: Callable  # the learner's function (for a method: taking self first)

    def owner(self) -> type:
        """For a method: the book's class with the learner's method in place of the book's."""
        book = book_chapter(self.exercise)
        owner, _, method = self.exercise.name.rpartition(".")
        base = getattr(book, owner)
        return type(owner, (base,), {method: self.function, "__module__": base.__module__})

    def __call__(self, *args, **kwargs):
        """A function exercise, called."""
        return self.function(*args, **kwargs)


def book_chapter(exercise: Exercise) -> ModuleType:
    return importlib.import_module(f"minitfm.book.{exercise.chapter}")


def subject_from(exercise: Exercise, function: Callable, home: ModuleType | None) -> Subject:
    """The learner's `function` to grade. From a workbook (`home`, its module), its global
    names are looked up in the book first, then in the workbook (the learner's own helpers),
    but its own name is the learner's: a function that calls itself recurses here as it would
    in a run, instead of calling the book's. A function written in a notebook keeps its own
    globals."""
    if home is None:
        return Subject(exercise, function)
    book = {k: v for k, v in vars(book_chapter(exercise)).items() if not k.startswith("__")}
    namespace = {**vars(home), **book}
    subject = Subject(exercise, rebind(function, namespace))
    owner = exercise.name.rpartition(".")[0]
    namespace[owner or exercise.name] = subject.owner() if owner else subject.function
    return subject


# --- comparing, and naming the likely mistake ---

def check_tensor(actual, expected: Tensor, what: str, hint: str = "") -> None:
    """A tensor of the expected shape and dtype, else a Mismatch saying which differs (with
    `hint` for a wrong shape when given: the exercise's own, more telling than the general)."""
    if not isinstance(actual, Tensor):
        raise Mismatch(f"{what}: a {type(actual).__name__}, not a tensor",
                       "return what the book's docstring says (a tensor, or a tuple of them)")
    if actual.shape != expected.shape:
        raise Mismatch(f"{what}: shape {tuple(actual.shape)}, expected "
                       f"{tuple(expected.shape)}",
                       hint or "write each tensor's shape beside it, as the book does "
                       "(# (B, H, T, K)), and follow them through every view, transpose and "
                       "matmul")
    if actual.dtype != expected.dtype:
        raise Mismatch(f"{what}: {actual.dtype}, where the inputs are {expected.dtype}",
                       "make new tensors with the input's dtype and device: torch.zeros_like, "
                       "x.new_zeros, or dtype=x.dtype, device=x.device")


def same(actual: Tensor, expected: Tensor, atol: float = 1e-8) -> bool:
    return actual.shape == expected.shape and bool(
        torch.allclose(actual.double(), expected.double(), rtol=1e-6, atol=atol, equal_nan=True))


def diagnose(actual: Tensor, wrong: dict[str, Tensor], atol: float = 1e-8) -> str:
    """The hint of the first known wrong version whose output `actual` equals, else ""."""
    return next((hint for hint, output in wrong.items() if same(actual, output, atol)), "")


def expect(actual, expected: Tensor, what: str, wrong: dict[str, Tensor] | None = None,
           hint: str = "", atol: float = 1e-8) -> None:
    """`actual` equals `expected` (float64, to within atol), else a Mismatch with the hint of
    the known mistake it matches (`wrong`: hint -> that mistake's output), or `hint`."""
    check_tensor(actual, expected, what, hint)
    if same(actual, expected, atol):
        return
    wrong = wrong or {}
    not_finite = ~torch.isfinite(actual.detach()) & torch.isfinite(expected.detach())
    if not_finite.any():
        found = "NaN" if actual.detach()[not_finite].isnan().any() else "inf"
        raise Mismatch(f"{what}: {found} where the expected values are finite (at "
                       f"{int(not_finite.sum())} of {not_finite.numel()} values)",
                       diagnose(actual, wrong, atol) or hint)
    gap = (actual.double() - expected.double()).abs().nan_to_num(float("inf")).max().item()
    raise Mismatch(f"{what}: off from the expected values by up to {gap:.3g}",
                   diagnose(actual, wrong, atol) or hint)


def leaf(*shape: int, seed: int = 0) -> Tensor:
    """A float64 tensor that records gradients, drawn from its own generator."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=DTYPE, generator=generator).requires_grad_()


def gradients(output: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    """The gradients of a fixed projection of `output`, None where an input gets none."""
    weights = torch.randn(output.shape, dtype=output.dtype,
                          generator=torch.Generator().manual_seed(99))
    return list(torch.autograd.grad(output, inputs, weights, allow_unused=True))


# --- running the checks ---

@dataclass(frozen=True)
class Grade:
    """An exercise's result: passed, failed (at which check, why, the hint) or not started."""

    exercise: Exercise
    status: str  # "passed", "failed" or "not started"
    check: str = ""  # the first check that failed: its docstring's first line
    message: str = ""
    hint: str = ""

    @property
    def number(self) -> int:
        """The exercise's place in the book's order, from 1."""
        return EXERCISES.index(self.exercise) + 1

    def as_dict(self) -> dict:
        return {"exercise": self.exercise.name, "file": self.exercise.file,
                "function": self.exercise.name, "status": self.status, "check": self.check,
                "message": self.message, "hint": self.hint}


def learner_frame(err: BaseException) -> str:
    """Where in the learner's code an error was raised (the innermost frame outside minitfm and
    torch), as `file:line: ` with the path as minitfm prints paths; "" when none is. An error
    a check turned into a `Mismatch` (a shape error read as a lost keepdim) is placed where the
    error it came from was raised."""
    cause = (err.__cause__ or err.__context__) if isinstance(err, Mismatch) else err
    if cause is None:
        return ""
    frames = [f for f in traceback.extract_tb(cause.__traceback__)
              if not Path(f.filename).resolve().is_relative_to(PACKAGE)
              and "site-packages" not in f.filename and not f.filename.startswith("<frozen")]
    if not frames:
        return ""
    where = frames[-1].filename
    return f"{shown_path(where) if os.path.isabs(where) else where}:{frames[-1].lineno}: "


class TookTooLong(BaseException):
    """Raised in the learner's code when an exercise's checks run past `TIME_LIMIT_S` (a
    BaseException, so that an `except Exception` in the learner's loop does not swallow it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `TookTooLong` wherever the code is after `seconds`: an alarm signal, set and
    cleared around the checks, so a check that returns in time waits for nothing. Only where
    Python takes signals (the main thread, on Unix) and no other alarm is set; else no limit."""
    usable = (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
              and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TookTooLong

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def error_hint(err: BaseException) -> str:
    """What an exception from the learner's code most likely means."""
    text = error_text(err)
    if isinstance(err, SystemExit):
        return "return the result instead: sys.exit ends the whole program"
    if isinstance(err, RecursionError):
        return "your function calls itself: write its body instead of calling it by its name"
    if isinstance(err, RuntimeError) and "view" in text and "contiguous" in text:
        return ("a view of a tensor that is not contiguous (a transpose, say): use .reshape, or "
                ".contiguous() before .view")
    if isinstance(err, RuntimeError) and any(w in text for w in ("size", "shape", "dimension")):
        return ("a shape error: write each tensor's shape beside it, as the book does, and check "
                "every view, transpose and matmul")
    if isinstance(err, NameError):
        return "a name that is neither in your file nor in the book's chapter"
    if isinstance(err, TypeError):
        return "keep the book's signature: the rest of the book calls it with those arguments"
    return ""


def grade(subject: Subject, checks: tuple[Callable[[Subject], None], ...]) -> Grade:
    """Run `checks` in order; the first that fails decides (or running past `TIME_LIMIT_S`)."""
    exercise = subject.exercise
    what = ""
    try:
        with time_limit(TIME_LIMIT_S):
            for check in checks:
                what = (check.__doc__ or check.__name__).strip().splitlines()[0]
                failed = run_check(subject, check, what)
                if failed is not None:
                    return failed
    except TookTooLong as err:
        return Grade(exercise, "failed", what, f"{learner_frame(err)}{exercise.name} did not "
                     f"return within {TIME_LIMIT_S:g} s: an endless loop?",
                     "look for a loop whose condition never turns false (a while loop, or a "
                     "for loop over something that grows as it goes)")
    return Grade(exercise, "passed")


def run_check(subject: Subject, check: Callable[[Subject], None], what: str) -> Grade | None:
    """One check of `subject` (`what`: its first line): the failed grade, or None if it passed."""
    exercise = subject.exercise
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            check(subject)
    except NotImplementedError:
        return Grade(exercise, "not started")
    except Mismatch as err:
        return Grade(exercise, "failed", what, f"{learner_frame(err)}{err.message}", err.hint)
    except TookTooLong:
        raise  # the time limit: `grade` says so
    except BaseException as err:  # the learner's code: anything can happen
        if from_signal(err):  # Ctrl-C stops the check; a KeyboardInterrupt raised fails it
            raise
        message = f"{learner_frame(err)}{error_text(err)}"
        return Grade(exercise, "failed", what, message, error_hint(err))
    return None
