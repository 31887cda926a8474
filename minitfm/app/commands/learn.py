"""`minitfm learn`: write the transformer yourself, graded against PyTorch, then train it.

`start` writes a workbook (the book's chapters with exercises to write), `check` grades it,
`bugs` writes a bug zoo (the book with bugs planted) that `check` also grades. Training with a
workbook is `minitfm train --book DIR`. The library is `minitfm.learn`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import note, say, show
from minitfm.app.parameters import json_option
from minitfm.app.text import printable
from minitfm.app.usage import App, OneLineErrors
from minitfm.errors import MinitfmError, shown_path
from minitfm.run.files import to_json

learn_app = App(cls=OneLineErrors, name="learn", no_args_is_help=True,
                help="Write the transformer yourself: a workbook of exercises, graded against "
                     "PyTorch, that trains with your code.")


@learn_app.command("start")
@clean_errors(uses_torch=False)
def start(folder: Path = typer.Argument(Path("workbook"), metavar="[DIR]",
                                        help="The workbook's folder; it must not exist yet.")
          ) -> None:
    """Write a workbook: the book's chapters, with the exercises' bodies left for you."""
    from minitfm.learn.exercises import EXERCISES, workbook_readme
    from minitfm.learn.workbook import write_workbook

    write_workbook(folder, workbook_readme(str(folder)))
    say(f"wrote {printable(shown_path(folder))}/: the book's chapters with {len(EXERCISES)} "
        f"exercises (its README.md says how to work through them); first: "
        f"{printable(shown_path(folder / EXERCISES[0].file))}, {EXERCISES[0].name}")
    say(f"next: minitfm learn check {printable(str(folder))} {EXERCISES[0].name}")


@learn_app.command("check")
@clean_errors
def check(
    folder: Path = typer.Argument(Path("workbook"), metavar="[DIR]",
                                  help="A workbook (minitfm learn start) or a bug zoo (minitfm "
                                       "learn bugs)."),
    exercises: list[str] | None = typer.Argument(None, metavar="[EXERCISE]...",
                                                 help="Only these exercises (e.g. attention "
                                                      "LayerNorm.forward); default: all."),
    as_json: bool = json_option("One JSON object per exercise (exercise, file, function, "
                                "status, check, message, hint); for a bug zoo, per bug (number, "
                                "symptom, fixed; bug and mistake once fixed)."),
) -> None:
    """Grade a workbook against PyTorch and the book: exit 0 if all you wrote passes, else 1."""
    from minitfm.learn.exercises import BY_NAME
    from minitfm.learn.grading import grade_workbook, pick
    from minitfm.learn.workbook import MARK, load_workbook, prints_aside

    if str(folder) in BY_NAME and not folder.exists() and (Path("workbook").is_dir()
                                                           or Path(MARK).is_file()):
        exercises, folder = [str(folder), *(exercises or [])], Path("workbook")  # DIR left out
    pick(exercises)  # a misspelt name first, before anything is imported
    if folder == Path("workbook") and not folder.exists() and Path(MARK).is_file():
        folder = Path(".")  # run from inside the workbook: said, as it runs the code there
        note("checking the workbook in the current folder")
    with prints_aside(as_json):  # the learner's print(): stdout stays JSON lines
        workbook = load_workbook(folder)
    if workbook.kind == "zoo":
        if exercises:
            raise MinitfmError(f"a bug zoo is checked whole, not by exercise: minitfm learn "
                               f"check {folder}")
        return check_zoo(workbook, as_json)

    with prints_aside(as_json):
        grades = grade_workbook(workbook, exercises)
    changed = [name for name in workbook.changed_in_book() if not exercises or name in exercises]
    if as_json:
        for grade in grades:
            print(to_json(grade.as_dict()))
    else:
        show(grades_table(grades))
        for grade in grades:
            if grade.status == "failed":
                say(f"{grade.exercise.name} ({grade.exercise.file}) fails: {grade.check}")
                say(f"  {grade.message}")
                if grade.hint:
                    say(f"  hint: {grade.hint}")
    if not as_json:
        say(progress_line(grades, workbook))
    if changed:
        note(f"the book has changed since this workbook was made, in {', '.join(changed)}: "
             f"those are graded against the book of now (see minitfm/book/)")
    if any(grade.status == "failed" for grade in grades):
        raise typer.Exit(1)


def progress_line(grades: list, workbook) -> str:
    """How far the learner is, and where to go next: the first exercise not passed, by file and
    line, or the command that trains with all of them."""
    from minitfm.learn.workbook import find_function, parse_chapters

    passed = sum(grade.status == "passed" for grade in grades)
    todo = next((grade for grade in grades if grade.status != "passed"), None)
    if todo is None:
        folder = workbook.folder
        return (f"{passed} of {len(grades)} passed: train with your code, minitfm train --book "
                f"{printable(shown_path(folder))}")
    exercise = todo.exercise
    node = find_function(parse_chapters(workbook.folder)[exercise.chapter], exercise.name)
    path = workbook.folder / exercise.file
    where = f"{shown_path(path)}:{node.lineno}"
    return f"{passed} of {len(grades)} passed; next: {exercise.name} ({printable(where)})"


def check_zoo(zoo, as_json: bool) -> None:
    """A bug zoo graded: which planted bugs are fixed (exit 1 while any is not)."""
    from minitfm.learn.workbook import prints_aside
    from minitfm.learn.zoo import check_zoo as bugs_fixed

    with prints_aside(as_json):
        results = bugs_fixed(zoo)
    if as_json:
        for number, (bug, fixed) in enumerate(results, 1):  # a bug named once fixed, as below
            named = {"bug": bug.id, "mistake": bug.mistake} if fixed else {}
            print(to_json({"number": number, "symptom": bug.symptom, "fixed": fixed, **named}))
    else:
        show(zoo_table(results))
        say(f"{sum(fixed for _, fixed in results)} of {len(results)} bugs fixed")
    if not all(fixed for _, fixed in results):
        raise typer.Exit(1)


@learn_app.command("bugs")
@clean_errors(uses_torch=False)
def bugs(folder: Path = typer.Argument(Path("bugs"), metavar="[DIR]",
                                       help="The zoo's folder; it must not exist yet.")
         ) -> None:
    """Write a bug zoo: the whole book, working-looking, with one-line bugs planted to find."""
    from minitfm.learn.zoo import BUGS, write_zoo

    write_zoo(folder)
    say(f"wrote {printable(shown_path(folder))}/: the book with {len(BUGS)} bugs planted (its "
        f"README.md lists their symptoms); train it with minitfm train --book "
        f"{printable(str(folder))}")
    say(f"next: minitfm learn check {printable(str(folder))}")


def grades_table(grades: list) -> Table:
    """`minitfm learn check`: each exercise's status, in the book's order."""
    table = Table(title="minitfm learn check")
    for column in ("#", "exercise", "file", "status"):
        table.add_column(column)
    marks = {"passed": "passed", "failed": "FAILED", "not started": "not started"}
    for grade in grades:
        table.add_row(str(grade.number), grade.exercise.name, grade.exercise.file,
                      marks[grade.status])
    return table


def zoo_table(results: list) -> Table:
    """`minitfm learn check` on a bug zoo: each planted bug's symptom, fixed or not."""
    table = Table(title="minitfm learn check: the bug zoo")
    for column in ("#", "symptom", "fixed"):
        table.add_column(column)
    for number, (bug, fixed) in enumerate(results, 1):  # once fixed, what the mistake was
        table.add_row(str(number), bug.symptom, f"fixed: {bug.mistake}" if fixed else "not yet")
    return table
