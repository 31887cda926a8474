"""`minitfm learn check`: every exercise of a workbook graded, or one function on its own.

`CHECKS` lists each exercise's checks in the order they run (a test fails for an exercise
without any). `grade_workbook` grades a workbook's written exercises, each alone (see
`checks.subject_from`); `check_function` grades a function written anywhere, a notebook cell
say, against an exercise.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from minitfm.errors import MinitfmError, quote
from minitfm.learn.checks import (
    Grade,
    Subject,
    attention,
    grade,
    layers,
    model,
    positions,
    subject_from,
    training,
)
from minitfm.learn.exercises import BY_NAME, EXERCISES, Exercise
from minitfm.learn.workbook import Workbook

# Each chapter's checks, by exercise: a tuple of functions that raise `checks.Mismatch`.
CHECKS: dict[str, tuple[Callable[[Subject], None], ...]] = {
    **attention.CHECKS,
    **layers.CHECKS,
    **positions.CHECKS,
    **model.CHECKS,
    **training.CHECKS,
}


def pick(names: list[str] | None) -> list[Exercise]:
    """The exercises named (all when none are), in the book's order; a wrong name is an error."""
    if not names:
        return list(EXERCISES)
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        close = difflib.get_close_matches(unknown[0], BY_NAME, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise MinitfmError(f"{quote(unknown[0])} is not an exercise{hint}: the exercises are "
                           f"{', '.join(BY_NAME)}")
    return [e for e in EXERCISES if e.name in names]


def grade_workbook(workbook: Workbook, names: list[str] | None = None) -> list[Grade]:
    """Each exercise asked for: not started (still blank), passed or failed."""
    grades = []
    for exercise in pick(names):
        if exercise.name not in workbook.written:
            grades.append(Grade(exercise, "not started"))
            continue
        home = workbook.modules[exercise.chapter]
        subject = subject_from(exercise, workbook.function(exercise), home)
        result = grade(subject, CHECKS[exercise.name])
        if result.status == "not started":  # written, yet still raising the blank's error
            result = Grade(exercise, "failed", "the body runs to its end",
                           "your code still raises NotImplementedError",
                           "remove the blank's `raise NotImplementedError(...)` line: the "
                           "exercise runs once its body is yours")
        grades.append(result)
    return grades


def failing_exercises(workbook: Workbook) -> list[str]:
    """The exercises the learner wrote that fail their check (what `minitfm train --book`
    names before it trains)."""
    if not workbook.written:  # (no names: grade_workbook would grade them all)
        return []
    return [grade.exercise.name for grade in grade_workbook(workbook, list(workbook.written))
            if grade.status == "failed"]


def check_function(name: str, function: Callable) -> Grade:
    """Grade `function` as the exercise `name` (a method takes `self` first)."""
    exercise = pick([name])[0]
    return grade(Subject(exercise, function), CHECKS[exercise.name])
