"""The catalog: the names and facts of the tasks and the positional schemes, stated once.

What a task's or a scheme's name fixes before any data is read or any model is built: the
vocabulary's reserved symbols, how long a source and a target can get, how typed text is read,
whether positions run out. The config validates its names against it; the memory check
(`minitfm.run.limits`), the sweep's plan and the explorer read its facts without torch; the
implementations register under its names (`minitfm.tasks.TASKS`, `minitfm.book.positions.SCHEMES`),
and a test checks that they cover it exactly.

A new synthetic task is its class (`tasks/synthetic.py`) plus one TaskSpec below; a new
positional scheme is its class (`book/positions.py`), one PositionalSpec below and its
JavaScript twin (`lab/explore/page/model.js`), so that the explorer's page answers as PyTorch does.

The one length rule lives here too: a model needs a position for every source token and for
BOS + every target token (`positions_needed`), and learned or randomized positions can run out
(`position_shortfall`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2 of every vocabulary


def as_long(n: int) -> int:
    """n: a sequence as long as the input (the default of both lengths below)."""
    return n


@dataclass(frozen=True)
class TaskSpec:
    """What a task's name fixes before any data is read (its rule is its class's)."""

    name: str
    task_symbols: tuple[str, ...] = ()  # ids after the special tokens, before the data symbols
    longest_source: Callable[[int], int] = as_long  # tokens, for inputs of up to n symbols
    longest_target: Callable[[int], int] = as_long  # tokens, for inputs of up to n symbols
    reading: str | None = "words"  # how the explorer's task.js reads typed text (None: tokenize)
    from_files: bool = False  # its pairs are read from files: targets known only once read

    def vocab_size(self, n_symbols: int) -> int:
        """Tokens of the vocabulary over `n_symbols` data symbols."""
        return len(SPECIAL_TOKENS) + len(self.task_symbols) + n_symbols

    def positions_for_inputs(self, n: int) -> int:
        """Positions inputs of up to `n` symbols need, as stated before any data is read
        (from files: the sources; their targets are the files')."""
        source = self.longest_source(n)
        return source if self.from_files else positions_needed(source, self.longest_target(n))


TASKS = MappingProxyType({spec.name: spec for spec in (
    TaskSpec("copy"),
    TaskSpec("reverse"),
    TaskSpec("sort"),
    TaskSpec("duplicate", longest_target=lambda n: 2 * n),  # each symbol twice
    TaskSpec("shift"),
    TaskSpec("add", task_symbols=("+",), reading="add",
             longest_source=lambda n: 2 * n + 1,  # two n-digit numbers and a '+'
             longest_target=lambda n: n + 1),  # a sum: at most a digit more than its operands
    # a + b mod p: each number one symbol, the answer one symbol, whatever task.max_len says
    TaskSpec("modadd", task_symbols=("+",), reading="modadd",
             longest_source=lambda n: 3, longest_target=lambda n: 1),
    # Pairs read from files: as many target tokens here; once its files are read, their longest.
    TaskSpec("pairs", task_symbols=("<unk>",), reading=None, from_files=True),
)})


@dataclass(frozen=True)
class PositionalSpec:
    """What a positional scheme's name fixes before a model is built (its code is its class's)."""

    name: str
    origin: str = ""  # the paper (or short name) the config's description gives it
    aliases: tuple[str, ...] = ()  # other names it goes by, for "did you mean"
    learned: bool = False  # a parameter per position up to model.max_len, and none past it
    even_head: bool = False  # turns pairs of features: d_head must be even
    has_positions: bool = True  # False: nothing for model.random_positions to randomize


POSITIONALS = MappingProxyType({spec.name: spec for spec in (
    PositionalSpec("sinusoidal", origin="Vaswani et al. 2017"),
    PositionalSpec("learned", learned=True),
    PositionalSpec("rope", origin="Su et al. 2021", aliases=("rotary",), even_head=True),
    PositionalSpec("alibi", origin="Press et al. 2022"),
    PositionalSpec("none", origin="NoPE", aliases=("nope",), has_positions=False),
)})


# --- the one length rule ---

class Shortfall(NamedTuple):
    """A model short of positions: the key that stops them, its value, the positions needed."""

    key: str
    limit: int
    needed: int


def positions_needed(source: int, target: int) -> int:
    """Positions for a source of `source` tokens and a target of `target`: the encoder's, or
    the decoder's (BOS + the target)."""
    return max(source, target + 1)


def position_shortfall(model: Any, needed: int, training: bool = False) -> Shortfall | None:
    """None if `model` (a ModelConfig) has `needed` positions; else what stops them.

    The one check of lengths (training, eval, predict, visualize, a sweep's plan): learned
    positions stop at model.max_len, and training with randomized ones draws them from
    [0, model.random_positions). The config checks the keys against each other up front.
    """
    limits = [("model.max_len", model.max_len)] if POSITIONALS[model.positional].learned else []
    if training and model.random_positions is not None:
        limits.append(("model.random_positions", model.random_positions))
    for key, limit in limits:
        if needed > limit:
            return Shortfall(key, limit, needed)
    return None
