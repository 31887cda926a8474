"""The data chapter: tasks by name, and the one check of lengths at run time.

`base` holds what every task shares (vocabulary, sampling, the held-out rule, batches),
`synthetic` the rules copy .. add, `pairs` a task read from files. This package names them
all (`TASKS`), builds one from its config (`make_task`) and checks that a model has positions
for what a task asks of it (`positions_short`).
"""

from __future__ import annotations

from typing import Any

from minitfm.config import ModelConfig, TaskConfig
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


def positions_short(model: ModelConfig, task: Task, src_len: int,
                    training: bool = False) -> tuple[str, int, int] | None:
    """None if the model has positions for a source of `src_len` tokens and its target; else
    (the key that stops them, its value, the positions needed).

    The one check of lengths at run time (training, eval, predict, visualize): learned
    positions stop at model.max_len, and training with randomized ones draws them from
    [0, model.random_positions). The config checks the keys against each other up front.
    """
    needed = max(src_len, task.max_target_len(src_len) + 1)  # the source, or BOS + target
    limits = [("model.max_len", model.max_len)] if model.positional == "learned" else []
    if training and model.random_positions is not None:
        limits.append(("model.random_positions", model.random_positions))
    for key, limit in limits:
        if needed > limit:
            return key, limit, needed
    return None
