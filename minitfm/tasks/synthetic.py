"""The synthetic tasks: a rule from a source of symbols to its target, each with an example.

Copy, reverse, sort, duplicate, shift and add, over the data symbols 0..n_symbols-1. What
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
from minitfm.errors import TaskInputError
from minitfm.tasks.base import Task


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
        tokens: list[str] = []
        for k, operand in enumerate(text.split("+")):
            tokens += ["+"] * (k > 0) + self._read_words(operand.split())
        return tokens

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


SYNTHETIC = (CopyTask, ReverseTask, SortTask, DuplicateTask, ShiftTask, AddTask)
