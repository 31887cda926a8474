"""What every task shares: vocabulary, sampling, the held-out rule, text I/O and batching.

Each task is a rule from a source sequence of symbols to a target sequence (copy, reverse, sort,
...): the encoder reads the source, the decoder writes the target after BOS and ends it with
EOS. The rules are `synthetic`'s (copy .. add) and `pairs`' (read from files), in `minitfm.tasks`.

Vocabulary. The ids of a task are fixed by the task and `task.n_symbols`:

    0      "<pad>"  right-padding; never attended to, never scored
    1      "<bos>"  first decoder input
    2      "<eos>"  end of every target
    3 ...  task symbols: "+" for add, none for the other tasks
    then   data symbols "0", "1", ..., str(n_symbols - 1), in order of value

so data symbol v has id `3 + len(task symbols) + v`, and sorting ids sorts values. Special
tokens are never data: sampling never draws them and `parse` rejects them. `minitfm.catalog`
states the special and task symbols (SPECIAL_TOKENS, a TaskSpec's task_symbols), torch-free.

Sampling. Lengths uniform in [min_len, max_len], symbols uniform over the data symbols, each
draw from the `torch.Generator` passed in (never the global RNG): one seed, the same samples.

Held-out rule. An input is held out iff the CRC-32 of its token ids (each as 4 bytes,
little-endian) is 0 modulo 16, where its length has at least 10_000 possible inputs (n_symbols **
length; for add, over both operand lengths). Shorter lengths are shared by both splits (holding
out 1/16 of 100 inputs leaves gaps, not a fair test): evaluation may meet training inputs there.
Where a length holds out, `split="train"` redraws held-out inputs and `split="eval"` the others,
each keeping the length drawn: the splits stay disjoint for any eval seed and length range, and
lengths stay uniform.

Shapes: B batch, S source length, T target length (in a Batch: + 1, for BOS or EOS).
"""

from __future__ import annotations

import struct
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from minitfm.catalog import SPECIAL_TOKENS, TASKS, TaskSpec, positions_needed
from minitfm.config import TaskConfig
from minitfm.errors import ConfigError, TaskInputError

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPLITS = ("train", "eval")
HOLDOUT_MODULUS = 16  # 1 in 16 inputs of a big length is held out
MIN_HOLDOUT_SPACE = 10_000  # a length needs this many possible inputs to hold any out
MAX_DRAW_ROUNDS = 10_000  # a guard against a hang: each round settles >= ~1/16 of the draws

Pair = tuple[list[int], list[int]]


@dataclass(frozen=True)
class Vocab:
    """Token strings by id: PAD, BOS, EOS, then the task's symbols (see the module docstring)."""

    tokens: tuple[str, ...]
    _ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tokens[:3] != SPECIAL_TOKENS:
            raise ValueError(f"a vocabulary starts with {SPECIAL_TOKENS}, not {self.tokens[:3]}")
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError(f"vocabulary tokens must be distinct: {self.tokens}")
        object.__setattr__(self, "_ids", {t: i for i, t in enumerate(self.tokens)})

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def id(self, token: str) -> int:
        """The id of `token`; a TaskInputError names an unknown one."""
        if token not in self._ids:
            raise TaskInputError(f"unknown token {token!r}: not one of the {len(self)} tokens "
                                 f"of this vocabulary")
        return self._ids[token]

    def token(self, i: int) -> str:
        """The token with id `i`."""
        if not 0 <= i < len(self.tokens):
            raise IndexError(f"token id {i} is outside the vocabulary (ids 0..{len(self) - 1})")
        return self.tokens[i]

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID


class Task(ABC):
    """A task: its vocabulary, its rule (`target`), sampling and text I/O."""

    name: ClassVar[str]  # its TaskSpec's name in minitfm.catalog, which states its facts
    summary: ClassVar[str]
    separator: str = " "  # between symbols in text (pairs with task.tokenize char: none)

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.n_symbols = cfg.n_symbols
        symbols = tuple(str(v) for v in range(cfg.n_symbols))
        task_symbols = self.spec.task_symbols  # "+" for add
        self.vocab = Vocab(SPECIAL_TOKENS + task_symbols + symbols)
        self.first_data_id = len(SPECIAL_TOKENS) + len(task_symbols)
        # The compact form ("314", "12+34") is unambiguous only with one-character symbols.
        self.compact = all(len(t) == 1 for t in task_symbols + symbols)

    @property
    def spec(self) -> TaskSpec:
        """What the task's name fixes (minitfm.catalog): task symbols, longest source and target."""
        return TASKS[self.name]

    @classmethod
    def from_checkpoint(cls, cfg: TaskConfig, state: dict[str, Any]) -> Task:
        """The task a checkpoint was trained on (synthetic tasks: their config alone)."""
        return cls(cfg)

    @classmethod
    def saved_problem(cls, state: dict[str, Any]) -> str | None:
        """What is wrong with the task's data in a checkpoint, read as untrusted (None:
        nothing; synthetic tasks keep none: their config is all)."""
        return None

    def checkpoint_data(self) -> dict[str, Any]:
        """What a checkpoint keeps besides config and vocabulary to rebuild the task."""
        return {}

    def describe(self) -> str:
        """The task's size in a few words, for the training header."""
        return f"lengths {self.cfg.min_len}..{self.cfg.max_len}, {self.n_symbols} symbols"

    @classmethod
    def catalog_example(cls) -> tuple[str, str]:
        """(input, target) shown by `minitfm tasks`."""
        return cls(TaskConfig(name=cls.name)).example()

    # --- the rule, one override per task ---

    @abstractmethod
    def target(self, src: list[int]) -> list[int]:
        """The target ids for source ids `src`."""

    def alignment(self, src: list[int]) -> list[int] | None:
        """For each target position, the source position it should attend to (None: no such)."""
        return None

    def max_target_len(self, src_len: int) -> int:
        """The longest target for a source of `src_len` tokens (a cap for decoding); here a
        source is one input of `src_len` symbols."""
        return self.spec.longest_target(src_len)

    def max_source_len(self, max_len: int) -> int:
        """The longest source for a length setting of `max_len` (task.max_len)."""
        return self.spec.longest_source(max_len)

    def positions_for_source(self, src_len: int) -> int:
        """Positions a model needs for a source of `src_len` tokens and its longest target
        (`catalog.positions_needed`; checked with `catalog.position_shortfall`)."""
        return positions_needed(src_len, self.max_target_len(src_len))

    def input_length(self, src: list[int]) -> int:
        """The length of `src` in the sense of task.min_len/max_len (for per-length tables)."""
        return len(src)

    def check_positions(self, max_len: int) -> None:
        """Refuse data that needs more than `max_len` (model.max_len) positions; a synthetic
        task's lengths are its config's, checked with the model by `position_shortfall`."""
        return None

    # --- sampling ---

    def sample(self, n: int, generator: torch.Generator, *, min_len: int | None = None,
               max_len: int | None = None, split: str = "train") -> list[Pair]:
        """`n` (source, target) pairs of `split`, lengths uniform in [min_len, max_len]."""
        if split not in SPLITS:
            raise ValueError(f"split ({split!r}) must be one of {SPLITS}")
        lo = self.cfg.min_len if min_len is None else min_len
        hi = self.cfg.max_len if max_len is None else max_len
        if not 1 <= lo <= hi:
            raise ConfigError(f"min_len ({lo}) must be at least 1 and at most max_len ({hi})")
        shapes = self._draw_shapes(n, generator, lo, hi)
        sources = self._draw_split(shapes, generator, split)
        return [(src, self.target(src)) for src in sources]

    def is_held_out(self, src: list[int]) -> bool:
        """True iff `src` is in the held-out partition: eval only, never trained on."""
        return self._space(self._shape(src)) >= MIN_HOLDOUT_SPACE and self._hashed_out(src)

    def _hashed_out(self, src: list[int]) -> bool:
        key = self._holdout_key(src)
        return zlib.crc32(struct.pack(f"<{len(key)}I", *key)) % HOLDOUT_MODULUS == 0

    def _draw_split(self, shapes: list, generator: torch.Generator, split: str) -> list[list[int]]:
        """One input per shape, redrawing at the same shape those outside `split`."""
        # Shapes with too few inputs hold none out: both splits share them.
        shared = [self._space(shape) < MIN_HOLDOUT_SPACE for shape in shapes]
        want_held_out = split == "eval"
        sources: list[list[int]] = [[] for _ in shapes]
        pending = list(range(len(shapes)))
        for _ in range(MAX_DRAW_ROUNDS):
            if not pending:
                return sources
            drawn = self._draw_inputs([shapes[i] for i in pending], generator)
            rejected = []
            for i, src in zip(pending, drawn, strict=True):
                if shared[i] or self._hashed_out(src) == want_held_out:
                    sources[i] = src
                else:
                    rejected.append(i)
            pending = rejected
        raise RuntimeError(f"could not draw {len(pending)} {split} inputs; is the held-out "
                           f"partition empty at some length?")

    def _draw_shapes(self, n: int, generator: torch.Generator, lo: int, hi: int) -> list:
        """The shape (here: the length) of each of `n` inputs."""
        return torch.randint(lo, hi + 1, (n,), generator=generator).tolist()

    def _draw_inputs(self, lengths: list[int], generator: torch.Generator) -> list[list[int]]:
        """One uniformly random input per length, drawn in bulk."""
        width = max(lengths)
        values = torch.randint(self.n_symbols, (len(lengths), width), generator=generator)
        rows = (values + self.first_data_id).tolist()
        return [row[:k] for row, k in zip(rows, lengths, strict=True)]

    def _shape(self, src: list[int]):
        """What `_draw_inputs` fixes before drawing symbols: here, the length."""
        return len(src)

    def _space(self, shape) -> int:
        """How many possible inputs have this shape."""
        return self.n_symbols ** shape

    def _holdout_key(self, src: list[int]) -> list[int]:
        """The ids the held-out hash reads."""
        return src

    # --- text ---

    def parse(self, text: str, max_tokens: int | None = None) -> list[int]:
        """User text -> source ids. Words between spaces are whole symbols ("3 1 4", "10 11");
        with one-character symbols a single word is read symbol by symbol ("314")."""
        tokens = self._tokenize(text)
        if not tokens:
            raise TaskInputError(f"empty input: task '{self.name}' takes {self._allowed()}, "
                                 f"e.g. {self._example_text()!r}")
        ids = [self._symbol_id(token) for token in tokens]
        if max_tokens is not None and len(ids) > max_tokens:
            raise TaskInputError(f"input has {len(ids)} tokens, more than the {max_tokens} "
                                 f"allowed: shorten it")
        self._check_structure(ids, text)
        return ids

    def _tokenize(self, text: str) -> list[str]:
        return self._read_words(text.split())

    def _read_words(self, words: list[str]) -> list[str]:
        """Each word one symbol, except a lone compact word ("314"), read character by character.

        A whole token such as "<eos>" stays whole, so the error can name it."""
        if self.compact and len(words) == 1 and words[0] not in self.vocab:
            return list(words[0])
        return words

    def written_compact(self, text: str) -> bool:
        """Whether `text` is written without spaces between symbols ("314", not "3 1 4")."""
        words = text.split()
        return self.compact and len(words) == 1 and len(words[0]) > 1

    def format_like(self, ids: list[int], text: str) -> str:
        """Ids -> text written as `text` is: "413" for an input "314", "4 1 3" for "3 1 4"."""
        return self.format(ids, compact=self.written_compact(text))

    def _symbol_id(self, token: str) -> int:
        if token in SPECIAL_TOKENS:
            raise TaskInputError(f"{token!r} is a special token, not input: task '{self.name}' "
                                 f"takes {self._allowed()}")
        if token not in self.vocab:
            hint = " (a word between spaces is one symbol)" if self.compact and len(token) > 1 \
                else ""
            raise TaskInputError(f"{token!r} is not a symbol of task '{self.name}': it takes "
                                 f"{self._allowed()}{hint}")
        return self.vocab.id(token)

    def _allowed(self) -> str:
        spacing = "" if self.compact else ", separated by spaces"
        return f"the symbols 0..{self.n_symbols - 1}{spacing}"

    def _example_text(self) -> str:
        text = self.example()[0]
        return text.replace(" ", "") if self.compact else text

    def unknown_symbols(self, text: str) -> list[str]:
        """Symbols of `text` read as <unk> (synthetic tasks have none: `parse` refuses them)."""
        return []

    def count_unknown(self, pairs: list[Pair]) -> int | None:
        """How many symbols of `pairs` are <unk> (None: the task has no such symbol)."""
        return None

    def _check_structure(self, ids: list[int], text: str) -> None:
        """Raise TaskInputError if valid symbols form an invalid input (e.g. two '+')."""
        return None  # an optional hook: most tasks take any sequence of their symbols

    def format(self, ids: list[int], compact: bool = False) -> str:
        """Ids -> text, tokens separated by `separator` (none if `compact`); PAD and BOS are
        dropped, EOS ends it."""
        words = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                words.append(self.vocab.token(i))
        return ("" if compact else self.separator).join(words)

    def example(self) -> tuple[str, str]:
        """A worked example as text: (input, target)."""
        src = self._example_source()
        return self.format(src), self.format(self.target(src))

    def _example_source(self) -> list[int]:
        return [self.first_data_id + v % self.n_symbols for v in (3, 1, 4, 1, 5)]


@dataclass
class Batch:
    """Right-padded tensors: src (B, S); tgt_in = BOS + target, tgt_out = target + EOS (B, T),
    T = the longest target + 1."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_target_tokens: int  # non-PAD tokens of tgt_out (EOS included), counted without a sync

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on `device`; to CUDA from pinned memory, so the CPU does not wait."""
        device = torch.device(device)
        if device.type != "cuda":
            return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device),
                         self.n_target_tokens)
        # A copy from ordinary (pageable) memory waits for the GPU to finish its queued work.
        tensors = (t.pin_memory().to(device, non_blocking=True)
                   for t in (self.src, self.tgt_in, self.tgt_out))
        return Batch(*tensors, self.n_target_tokens)


def make_batch(pairs: list[Pair], vocab: Vocab) -> Batch:
    """Pad (source, target) pairs into a Batch for teacher forcing."""
    if not pairs:
        raise ValueError("make_batch needs at least one (source, target) pair")
    pad = vocab.pad_id
    S = max(len(src) for src, _ in pairs)
    T = max(len(tgt) for _, tgt in pairs) + 1  # + BOS in tgt_in, + EOS in tgt_out
    src = [s + [pad] * (S - len(s)) for s, _ in pairs]
    tgt_in = [[vocab.bos_id] + t + [pad] * (T - 1 - len(t)) for _, t in pairs]
    tgt_out = [t + [vocab.eos_id] + [pad] * (T - 1 - len(t)) for _, t in pairs]
    return Batch(torch.tensor(src, dtype=torch.long),  # (B, S)
                 torch.tensor(tgt_in, dtype=torch.long),  # (B, T)
                 torch.tensor(tgt_out, dtype=torch.long),  # (B, T)
                 sum(len(t) + 1 for _, t in pairs))


def eval_set(task: Task, n: int, seed: int, min_len: int | None = None,
             max_len: int | None = None) -> list[Pair]:
    """The held-out evaluation set: `n` pairs of split "eval", the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    return task.sample(n, generator, min_len=min_len, max_len=max_len, split="eval")
