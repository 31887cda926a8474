"""Every exercise has checks; the book's own code passes them all; a blank is "not started"."""

import importlib

import pytest

from minitfm.learn.exercises import EXERCISES
from minitfm.learn.grading import CHECKS, check_function
from minitfm.learn.workbook import get_function


def book_function(exercise):
    return get_function(importlib.import_module(f"minitfm.book.{exercise.chapter}"), exercise.name)


def test_every_exercise_has_checks():
    assert [e.name for e in EXERCISES if not CHECKS.get(e.name)] == []
    assert set(CHECKS) == {e.name for e in EXERCISES}


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_the_books_own_code_passes(exercise):
    grade = check_function(exercise.name, book_function(exercise))
    assert grade.status == "passed", (grade.check, grade.message)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_a_blank_is_not_started(exercise):
    def blank(*args, **kwargs):
        raise NotImplementedError(f"exercise {exercise.name}")

    assert check_function(exercise.name, blank).status == "not started"


def test_the_docs_list_the_exercises_as_the_workbook_does():
    """docs/learn.md's table is the exercise list's own rows (what each teaches, its minutes),
    the same as a new workbook's README: they cannot drift apart."""
    from pathlib import Path

    from minitfm.learn.exercises import workbook_readme

    docs = (Path(__file__).resolve().parents[2] / "docs" / "learn.md").read_text()
    rows = [line for line in workbook_readme("workbook").splitlines() if line.startswith("| ")]
    assert rows and all(row in docs for row in rows)


def test_the_default_workbook_and_zoo_folders_are_git_ignored():
    """`learn start` and `learn bugs` at the repository's root write workbook/ and bugs/: a
    learner's own work, never to be committed to minitfm by accident."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ignored = {line.strip() for line in (root / ".gitignore").read_text().splitlines()}
    assert {"/workbook/", "/bugs/"} <= ignored
    done = subprocess.run(["git", "check-ignore", "-q", "workbook/attention.py",
                           "bugs/attention.py"], cwd=root, capture_output=True)
    assert done.returncode in (0, 128), done.stderr  # 128: not a git checkout (a tarball)
