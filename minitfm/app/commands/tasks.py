"""`minitfm tasks`: the tasks, each with what it learns and an example (`tasks_table`)."""

from __future__ import annotations

from rich.table import Table

from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import show


@clean_errors
def tasks() -> None:
    """List the tasks (synthetic ones, and pairs read from your files) with an example each."""
    show(tasks_table())


def tasks_table() -> Table:
    """Every registered task with what it learns and an example."""
    from minitfm.tasks import TASKS

    table = Table(title="tasks (task.name)")
    for column in ("name", "what it learns", "example input", "target"):
        table.add_column(column)
    for name, cls in TASKS.items():
        example_in, example_out = cls.catalog_example()
        table.add_row(name, cls.summary, example_in, example_out)
    return table
