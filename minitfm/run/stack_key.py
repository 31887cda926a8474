"""Which runs may share a stack (`run/stack.py`; the sweep groups its runs by `stack_key`).

Runs share one stacked model when the one vmapped call can take all of them: the same model
(all of model.* but its code: the stack runs the book's modules, whatever a run's code) and
`STACK_SHARED`, what that call takes as constants. A workbook's runs never stack: its code is
the learner's, which vmap may not take. No torch here: the sweep plans with it.
"""

from __future__ import annotations

import json

from minitfm.config import BUILT_IN_CODES, Config, flatten

# Besides the model (all of model.* but its code), what the runs of one stack share: the one
# vmapped call of `run/stack.py` takes these as constants (the batch's shape, the loss's
# smoothing, the vocabulary, where it runs).
STACK_SHARED = ("train.batch_size", "train.label_smoothing", "task.name", "task.n_symbols",
                "task.train_path", "task.eval_path", "device", "threads")


def stack_differences(a: Config, b: Config) -> list[str]:
    """The keys that keep runs of `a` and `b` out of one stack (none: they may share one)."""
    first, second = flatten(a.model_dump(mode="json")), flatten(b.model_dump(mode="json"))
    keys = [k for k in first if k.startswith("model.") and k != "model.code"] + \
        list(STACK_SHARED)
    return [k for k in keys if first.get(k) != second.get(k)]


def stack_key(cfg: Config) -> str | None:
    """Equal for runs that may share a stack (`stack_differences` empty); None for a run that
    trains a workbook's code, which only runs alone."""
    if cfg.model.code not in BUILT_IN_CODES:
        return None
    flat = flatten(cfg.model_dump(mode="json"))
    return json.dumps({k: v for k, v in flat.items()
                       if (k.startswith("model.") and k != "model.code") or k in STACK_SHARED},
                      sort_keys=True, default=str)
