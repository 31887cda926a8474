"""The data chapter: the task implementations, registered by their names in the catalog.

`base` holds what every task shares (vocabulary, sampling, the held-out rule, batches),
`synthetic` the rules copy .. add, `pairs` a task read from files (`pairfiles` reads them).
What a task's name fixes before any data is read (task symbols, longest source and target) is
its spec in `minitfm.catalog`; this package registers a class under each spec's name (`TASKS`,
in the catalog's order) and builds one from its config (`make_task`).
"""

from __future__ import annotations

from typing import Any

from minitfm.config import TaskConfig
from minitfm.errors import ConfigError
from minitfm.tasks.base import Task
from minitfm.tasks.pairs import PairsTask
from minitfm.tasks.synthetic import SYNTHETIC

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (*SYNTHETIC, PairsTask)}


def make_task(cfg: TaskConfig, state: dict[str, Any] | None = None) -> Task:
    """The task named by `cfg.name`, set up for `cfg`; with a checkpoint's `state`, as it
    was trained (pairs: from the checkpoint, without its files)."""
    if cfg.name not in TASKS:
        raise ConfigError(f"task.name ({cfg.name!r}) is not a task; choose one of "
                          f"{', '.join(TASKS)}")
    cls = TASKS[cfg.name]
    return cls(cfg) if state is None else cls.from_checkpoint(cfg, state)
