"""The synthetic tasks: a rule from a source of symbols to its target, each with an example.

Copy, reverse, sort, duplicate, shift, add and modadd, over the data symbols 0..n_symbols-1. What
they share (vocabulary, sampling, the held-out rule, text) is `base.Task`; each class here
states its rule (`target`) and the source position each target token should attend to
(`alignment`, what the attention pictures compare with). What each name fixes besides (task
symbols; how long a source and a target can get: add, two numbers and a '+'; duplicate, twice
the input) is its TaskSpec in `minitfm.catalog`, where the memory check reads it without torch:
a new task is a class here (in SYNTHETIC) plus its spec there.
"""

from __future__ import annotations

import torch

from minitfm.config import TaskConfig
from minitfm.errors import ConfigError, TaskInputError
from minitfm.tasks.base import SPLITS, Pair, Task


class CopyTask(Task):
    """Copy: the target is the source. Example: 3 1 4 1 5 -> 3 1 4 1 5."""

    name = "copy"
    summary = "repeat the input"

    def target(self, src: list[int]) -> list[int]:
        return list(src)

    def alignment(self, src: list[int]) -> list[int]:
        return list(range(len(src)))


class ReverseTask(Task):
    """Reverse: the source backwards. Example: 3 1 4 1 5 -> 5 1 4 1 3."""

    name = "reverse"
    summary = "the input backwards"

    def target(self, src: list[int]) -> list[int]:
        return src[::-1]

    def alignment(self, src: list[int]) -> list[int]:
        return [len(src) - 1 - i for i in range(len(src))]


class SortTask(Task):
    """Sort: the source in ascending order of value. Example: 3 1 4 1 5 -> 1 1 3 4 5."""

    name = "sort"
    summary = "the input in ascending order"

    def target(self, src: list[int]) -> list[int]:
        return sorted(src)  # ids are in order of value (module docstring)

    def alignment(self, src: list[int]) -> list[int]:
        # Python's sort is stable: equal symbols keep their source order.
        return sorted(range(len(src)), key=src.__getitem__)


class DuplicateTask(Task):
    """Duplicate: each symbol twice. Example: 3 1 4 -> 3 3 1 1 4 4."""

    name = "duplicate"
    summary = "each symbol twice"

    def target(self, src: list[int]) -> list[int]:
        return [i for i in src for _ in range(2)]

    def alignment(self, src: list[int]) -> list[int]:
        return [i // 2 for i in range(2 * len(src))]


class ShiftTask(Task):
    """Shift: rotate left by one, the first symbol moves to the end. Example: 3 1 4 5 -> 1 4 5 3."""

    name = "shift"
    summary = "rotate left by one"

    def target(self, src: list[int]) -> list[int]:
        return src[1:] + src[:1]

    def alignment(self, src: list[int]) -> list[int]:
        return [(i + 1) % len(src) for i in range(len(src))]


class AddTask(Task):
    """Addition of two numbers in base n_symbols (at most 10), most significant digit first.

    Example (base 10): 4 7 + 8 5 -> 1 3 2, since 47 + 85 = 132; compact text "47+85".
    Each operand has between min_len and max_len digits (drawn independently) and no
    leading zero (a one-digit operand may be 0); the target is the sum without leading
    zeros. `parse` accepts leading zeros ("007+1" -> 8), though training never shows them.
    For the held-out rule a+b and b+a count as one input, so training never shows the
    mirror image of an evaluation problem.
    """

    name = "add"
    summary = "add two numbers, most significant digit first"

    def __init__(self, cfg: TaskConfig) -> None:
        super().__init__(cfg)  # the config refuses n_symbols > 10 for add
        self.base = cfg.n_symbols
        self.plus_id = self.vocab.id("+")  # its task symbol (catalog.TASKS["add"])

    def target(self, src: list[int]) -> list[int]:
        a, b = self._operands(src)
        return self._digits(self._value(a) + self._value(b))

    def max_target_len(self, src_len: int) -> int:
        # The longer operand has at most src_len - 2 digits (besides it: '+' and one digit).
        return max(1, self.spec.longest_target(src_len - 2))

    def input_length(self, src: list[int]) -> int:
        return max(len(operand) for operand in self._operands(src))

    def _operands(self, src: list[int]) -> tuple[list[int], list[int]]:
        i = src.index(self.plus_id)
        return src[:i], src[i + 1:]

    def _value(self, digits: list[int]) -> int:
        value = 0
        for i in digits:
            value = value * self.base + (i - self.first_data_id)
        return value

    def _digits(self, value: int) -> list[int]:
        digits = []
        while True:
            value, digit = divmod(value, self.base)
            digits.append(self.first_data_id + digit)
            if value == 0:
                return digits[::-1]

    def _draw_shapes(self, n: int, generator: torch.Generator, lo: int, hi: int) -> list:
        """The digit counts (of a, of b) of each of `n` problems."""
        return [tuple(pair) for pair in
                torch.randint(lo, hi + 1, (n, 2), generator=generator).tolist()]

    def _draw_inputs(self, shapes: list, generator: torch.Generator) -> list[list[int]]:
        lengths = torch.tensor(shapes).view(-1, 2)  # (P, 2)
        width = int(lengths.max())
        digits = torch.randint(self.base, (len(shapes), 2, width), generator=generator)
        leads = torch.randint(1, self.base, (len(shapes), 2), generator=generator)
        # Numbers of more than one digit start with a non-zero digit.
        digits[:, :, 0] = torch.where(lengths > 1, leads, digits[:, :, 0])
        rows = (digits + self.first_data_id).tolist()
        return [a[:la] + [self.plus_id] + b[:lb]
                for (a, b), (la, lb) in zip(rows, shapes, strict=True)]

    def _shape(self, src: list[int]) -> tuple[int, int]:
        a, b = self._operands(src)
        return len(a), len(b)

    def _space(self, shape: tuple[int, int]) -> int:
        return self._count(shape[0]) * self._count(shape[1])

    def _count(self, k: int) -> int:
        """How many k-digit numbers have no leading zero (0 counts as a 1-digit number)."""
        return self.base if k == 1 else (self.base - 1) * self.base ** (k - 1)

    def _holdout_key(self, src: list[int]) -> list[int]:
        a, b = sorted(self._operands(src))  # a+b and b+a share a partition
        return a + [self.plus_id] + b

    def _tokenize(self, text: str) -> list[str]:
        """Each operand is a number ("12") or its digits between spaces ("1 2")."""
        return sum_tokens(self, text)

    def written_compact(self, text: str) -> bool:
        """Operands written as numbers ("12+34", "12 + 34"): the sum is printed as one too."""
        return all(len(operand.split()) <= 1 for operand in text.split("+"))

    def _allowed(self) -> str:
        return f"two numbers of digits 0..{self.base - 1} joined by one '+'"

    def _check_structure(self, ids: list[int], text: str) -> None:
        count = ids.count(self.plus_id)
        problem = "has no '+'" if count == 0 else f"has {count} '+' signs"
        if count == 1:
            a, b = self._operands(ids)
            problem = "needs a number on each side of '+'" if not a or not b else ""
        if problem:
            raise TaskInputError(f"{text.strip()!r} {problem}: task 'add' takes "
                                 f"{self._allowed()}, e.g. {self._example_text()!r}")

    def _example_source(self) -> list[int]:
        return self._digits(47) + [self.plus_id] + self._digits(85)


class ModAddTask(Task):
    """Modular addition a + b mod p, p = n_symbols, each number one token (grokking's task).

    Example (p = 10): 7 + 5 -> 2, since 12 = 10 + 2; with p = 43, 40 + 25 -> 22. The source
    keeps add's '+' between the operands (`a + b`, not `a b`): typed text reads as the sum it is
    (`predict RUN "40 + 25"`), for one more encoder position, which carries nothing the model
    needs.

    Its held-out rule is not the 1-in-16 hash: of the p² pairs (a, b), a fixed share
    (task.train_fraction, rounded) is the training set and the rest is held out, as in Power et
    al. 2022 and Nanda et al. 2023. Which pairs is a permutation of all p² drawn from a generator
    seeded with task.eval_seed, the seed of the held-out set: runs of different seeds share one
    split (they differ by their model and data order only), and a share rounds exactly, which
    a hash would only approach. a + b and b + a are two pairs, each on its own side (the paper
    splits them so; the model must learn that addition commutes). Training draws training pairs
    only and evaluation held-out pairs only (`sample`), each in rounds that go through the
    split's pairs once in a random order: a batch of every training pair is full-batch training.
    """

    name = "modadd"
    summary = "a + b mod p, one token per number"

    def __init__(self, cfg: TaskConfig) -> None:
        super().__init__(cfg)
        self.plus_id = self.vocab.id("+")  # its task symbol (catalog.TASKS["modadd"])
        p = self.n_symbols
        order = torch.randperm(p * p, generator=torch.Generator().manual_seed(cfg.eval_seed))
        n_train = train_pair_count(p, cfg.train_fraction)
        # Pair index a * p + b; each split sorted, so it reads the same whatever the draw order.
        self.split_indices = {"train": order[:n_train].sort().values,
                              "eval": order[n_train:].sort().values}
        self.held_out = torch.zeros(p * p, dtype=torch.bool)
        self.held_out[self.split_indices["eval"]] = True

    def target(self, src: list[int]) -> list[int]:
        a, b = self._operand_values(src)
        return [self.first_data_id + (a + b) % self.n_symbols]

    def max_target_len(self, src_len: int) -> int:
        return 1

    def input_length(self, src: list[int]) -> int:
        return 1  # each operand is one symbol, as task.min_len = task.max_len = 1 says

    def describe(self) -> str:
        p, n = self.n_symbols, len(self.split_indices["train"])
        return f"p = {p}, {n:,} of the {p * p:,} pairs trained on, {p * p - n:,} held out"

    def _operand_values(self, src: list[int]) -> tuple[int, int]:
        return src[0] - self.first_data_id, src[2] - self.first_data_id

    # --- the split and sampling ---

    def pairs(self, split: str) -> list[Pair]:
        """Every (source, target) pair of `split` ("train" or "eval"), in order of (a, b)."""
        return self._pairs_at(self.split_indices[split].tolist())

    def _pairs_at(self, indices: list[int]) -> list[Pair]:
        p, first = self.n_symbols, self.first_data_id
        return [([first + i // p, self.plus_id, first + i % p], [first + (i // p + i % p) % p])
                for i in indices]

    def is_held_out(self, src: list[int]) -> bool:
        a, b = self._operand_values(src)
        return bool(self.held_out[a * self.n_symbols + b])

    def sample(self, n: int, generator: torch.Generator, *, min_len: int | None = None,
               max_len: int | None = None, split: str = "train") -> list[Pair]:
        """`n` pairs of `split`, in rounds: each round is every pair of the split once, in a
        random order (every input has length 1: two one-symbol numbers)."""
        if split not in SPLITS:
            raise ValueError(f"split ({split!r}) must be one of {SPLITS}")
        lo, hi = min_len or 1, max_len or 1
        if (lo, hi) != (1, 1):
            raise ConfigError(f"lengths {lo}..{hi} do not apply to task 'modadd': its inputs "
                              f"are two one-symbol numbers, all of length 1")
        indices = self.split_indices[split]
        rounds = [indices[torch.randperm(len(indices), generator=generator)]
                  for _ in range(-(-n // len(indices)))]
        return self._pairs_at(torch.cat(rounds)[:n].tolist())

    # --- text ---

    def _tokenize(self, text: str) -> list[str]:
        """Two numbers joined by '+', spaces optional ("40 + 25", "40+25")."""
        return sum_tokens(self, text)

    def written_compact(self, text: str) -> bool:
        return False  # the answer is one symbol: written the same either way

    def _allowed(self) -> str:
        return f"two numbers of 0..{self.n_symbols - 1} joined by one '+'"

    def _check_structure(self, ids: list[int], text: str) -> None:
        count = ids.count(self.plus_id)
        problem = "has no '+'" if count == 0 else f"has {count} '+' signs"
        if count == 1:
            i = ids.index(self.plus_id)
            problem = "needs one number on each side of '+'" if i != 1 or len(ids) != 3 else ""
        if problem:
            raise TaskInputError(f"{text.strip()!r} {problem}: task 'modadd' takes "
                                 f"{self._allowed()}, e.g. {self._example_text()!r}")

    def _example_text(self) -> str:
        return self.example()[0]

    def _example_source(self) -> list[int]:
        p, first = self.n_symbols, self.first_data_id
        return [first + 7 % p, self.plus_id, first + 5 % p]


def train_pair_count(p: int, fraction: float) -> int:
    """How many of the p² pairs of modadd are trained on: the share rounded, at least one,
    and at least one held out (the config refuses a share that rounds to neither)."""
    return min(max(round(fraction * p * p), 1), p * p - 1)


def sum_tokens(task: Task, text: str) -> list[str]:
    """The tokens of operands joined by '+' (add's and modadd's text): each operand's words as
    the task reads them (`_read_words`), a '+' between two."""
    tokens: list[str] = []
    for k, operand in enumerate(text.split("+")):
        tokens += ["+"] * (k > 0) + task._read_words(operand.split())
    return tokens


SYNTHETIC = (CopyTask, ReverseTask, SortTask, DuplicateTask, ShiftTask, AddTask, ModAddTask)
