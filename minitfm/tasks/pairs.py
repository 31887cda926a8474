"""Your own data: a task read from files of source/target pairs (`task.name: pairs`).

Example (examples/dates): 2026-11-22 -> 22 November 2026, one pair a line.

Files. `task.train_path` and, optionally, `task.eval_path`, .tsv or .jsonl, read by `pairfiles`
(formats, limits, and every mistake as one DataError naming the file and the line).

Symbols. `task.tokenize: char` makes every character a symbol (spaces too); `space` splits on
whitespace, so that a symbol can be a word. The vocabulary is PAD, BOS, EOS, <unk>, then the
symbols of the pairs trained on, sorted. A symbol never trained on (in a held-out pair, in a
`predict` input) reads as <unk>.

Held-out rule. With `task.eval_path`, its pairs. Without, the training file's pairs whose source
(its symbols, joined back to text) has a CRC-32 in the lowest `task.eval_fraction` of the hash
range: stable from run to run, and a source given twice lands on one side only.

Sampling. Training draws pairs with replacement, uniformly over the training pairs whose source
length is in task.min_len..task.max_len (all by default: task.max_len defaults to
model.max_len), from the data generator that checkpoints save, so a resume stays bit-exact.
Evaluation takes the held-out pairs in file order: the first n, then those in the length range
asked for (`eval --min-len/--max-len`); its seed plays no part.

Memory. The files are read a line at a time and never held whole: the training pairs are kept
as token ids in one flat array (`PairArray`: 2 bytes a symbol, 4 with more than 65,536 tokens),
the held-out ones as text, every pair's lengths for `check_positions`. That is at most about
three times the files' size (`run.limits` counts it before they are read; docs/own-data.md).

Checkpoints keep what eval, predict and visualize-attention need without the files: the
vocabulary, the first MAX_HELD_OUT held-out pairs (as text), the longest source and target, and
the SHA-256 of the training file (a resume on changed data is refused).
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from minitfm.config import TaskConfig
from minitfm.errors import DataError, MinitfmError
from minitfm.tasks.base import SPLITS, Pair, Task, Vocab
from minitfm.tasks.pairfiles import (
    JOINERS,
    MAX_LINE_BYTES,
    RESERVED,
    UNK,
    TextPair,
    named,
    read_pairs,
    symbols_of,
)

UNK_ID = RESERVED.index(UNK)
MAX_SYMBOLS = 100_000  # distinct symbols of the pairs trained on
MAX_HELD_OUT = 100_000  # held-out pairs kept (and stored in checkpoints): train.eval_samples' max
ID_TYPES = {"H": torch.uint16, "i": torch.int32}  # array typecode -> the same bytes in torch
RENUMBER_CHUNK = 1 << 20  # ids renumbered at once: a few MB of temporaries, never a copy of all


def hashed_out(source: str, fraction: float) -> bool:
    """The held-out rule without an eval file: the CRC-32 of the source's UTF-8 text."""
    return zlib.crc32(source.encode("utf-8")) < fraction * 2**32


class PairArray(Sequence):
    """Pairs of token ids held compactly: every id in one flat array (2 bytes each, 4 with more
    than 65,536 tokens) and where each side starts, instead of a Python list per side (8 bytes
    an id, and some 60 a list). Reading pair i gives the usual `(source, target)` lists."""

    def __init__(self, n_tokens: int = 2**16) -> None:
        self.ids = array(id_typecode(n_tokens))
        self.bounds = array("q", [0])  # pair i: source ids[bounds[2i]:bounds[2i + 1]], then target
        self._first: dict[bytes, int] | None = None  # a source's first pair, made by `find`

    @classmethod
    def of(cls, pairs: Iterable[Pair], n_tokens: int) -> PairArray:
        """`pairs` (lists of ids below `n_tokens`) in a PairArray."""
        packed = cls(n_tokens)
        for src, tgt in pairs:
            packed.append(src, tgt)
        return packed

    def append(self, src: Iterable[int], tgt: Iterable[int]) -> None:
        self.ids.extend(src)
        self.bounds.append(len(self.ids))
        self.ids.extend(tgt)
        self.bounds.append(len(self.ids))

    def widen(self) -> None:
        """4 bytes an id from now on: ids of 65,536 and beyond."""
        self.ids = array("i", self.ids)

    def __len__(self) -> int:
        return len(self.bounds) // 2

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} of {len(self)}")
        bounds, k = self.bounds, 2 * (i % len(self))
        return self.ids[bounds[k]:bounds[k + 1]].tolist(), \
            self.ids[bounds[k + 1]:bounds[k + 2]].tolist()

    def __iter__(self) -> Iterator[Pair]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PairArray) and (self.bounds, self.ids) == (other.bounds,
                                                                            other.ids)

    __hash__ = None  # mutable, as a list

    def find(self, src: list[int]) -> int | None:
        """The first pair whose source is `src` (None: none is). The index is made on first use:
        training never asks."""
        if self._first is None:
            self._first = {}
            for i in range(len(self)):
                self._first.setdefault(self.ids[self.bounds[2 * i]:self.bounds[2 * i + 1]]
                                       .tobytes(), i)
        try:
            return self._first.get(array(self.ids.typecode, src).tobytes())
        except OverflowError:  # an id no pair can hold
            return None

    def lengths(self, side: int) -> array:
        """The length of every pair's source (side 0) or target (side 1)."""
        ends, starts = self.bounds[side + 1::2], self.bounds[side:-1:2]
        return array("q", map(int.__sub__, ends, starts))

    def renumber(self, table: list[int]) -> None:
        """Replace every id i with table[i], in place, a chunk at a time (torch does the lookup)."""
        if not self.ids:
            return
        lookup = torch.tensor(table, dtype=torch.int64)
        flat = torch.frombuffer(self.ids, dtype=ID_TYPES[self.ids.typecode])  # shares memory
        for start in range(0, len(flat), RENUMBER_CHUNK):
            part = flat[start:start + RENUMBER_CHUNK]
            part.copy_(lookup[part.long()])


def id_typecode(n_tokens: int) -> str:
    """The array type that holds ids below `n_tokens`: unsigned 16 bits, else 32."""
    return "H" if n_tokens <= 2**16 else "i"


class PairLengths:
    """Every pair of one file as its line and its two lengths in symbols (`check_positions`)."""

    def __init__(self) -> None:
        self.lines, self.sources, self.targets = array("q"), array("q"), array("q")

    def add(self, line: int, source: int, target: int) -> None:
        self.lines.append(line)
        self.sources.append(source)
        self.targets.append(target)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return zip(self.lines, self.sources, self.targets)


@dataclass
class PairsData:
    """What a pairs task is made of."""

    symbols: list[str]
    train: PairArray  # the pairs trained on, as ids (empty when read from a checkpoint)
    held_out: list[TextPair]
    train_sha256: str
    files: list[tuple[str, PairLengths]] = field(default_factory=list)  # (name, every pair)
    longest: list[int] | None = None  # [source, target] of every pair (None: of those here)


def load_data(cfg: TaskConfig) -> PairsData:
    """Read, check and split the files of `cfg`; every mistake is one DataError."""
    where = named("task.train_path", cfg.train_path)
    reading = Reading(cfg)
    digest = reading.read(Path(cfg.train_path), "task.train_path", reading.take_training)
    if cfg.eval_path is not None:
        reading.read(Path(cfg.eval_path), "task.eval_path", reading.take_held_out)
    else:
        reading.check_split(where)
    if not reading.in_range:
        raise DataError(f"{where}: no training pair has a source of task.min_len..task.max_len "
                        f"({cfg.min_len}..{cfg.max_len}) symbols (task.max_len defaults to "
                        f"model.max_len)")
    if reading.over_limit is not None:
        raise DataError(f"{where} line {reading.over_limit:,}: more than {MAX_SYMBOLS:,} "
                        f"distinct symbols, the limit (task.tokenize {cfg.tokenize})")
    return PairsData(reading.sorted_symbols(), reading.train, reading.held_out, digest,
                     reading.files)


class Reading:
    """What `load_data` keeps of the pairs as they are read (see Memory, above): the training
    pairs in range as ids, numbered in the order their symbols are met (sorted at the end), the
    first MAX_HELD_OUT held-out pairs as text, and every pair's lengths."""

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.symbols: dict[str, int] = {}  # each training symbol's number, as first met
        self.train = PairArray()
        self.held_out: list[TextPair] = []
        self.files: list[tuple[str, PairLengths]] = []
        self.sides = {"train": 0, "held out": 0}  # pairs of the training file on each side
        self.in_range = 0  # training pairs with a source in task.min_len..task.max_len
        self.over_limit: int | None = None  # the line where symbols passed MAX_SYMBOLS

    def read(self, path: Path, key: str, take: Callable[[TextPair, list[str], list[str]], None]
             ) -> str:
        """Read one file into this; its SHA-256."""
        lengths = PairLengths()
        self.files.append((named(key, str(path)), lengths))

        def measured(pair: TextPair) -> None:
            source, target = (symbols_of(text, self.cfg.tokenize)
                              for text in (pair.source, pair.target))
            lengths.add(pair.line, len(source), len(target))
            take(pair, source, target)

        return read_pairs(path, key, self.cfg.tokenize, measured)

    def take_training(self, pair: TextPair, source: list[str], target: list[str]) -> None:
        """A pair of the training file: held out by its hash (without task.eval_path), else
        trained on when its source is in range."""
        if self.cfg.eval_path is None and hashed_out(pair.source, self.cfg.eval_fraction):
            self.sides["held out"] += 1
            self.take_held_out(pair, source, target)
            return
        self.sides["train"] += 1
        if self.cfg.min_len <= len(source) <= self.cfg.max_len:
            self.in_range += 1
            if self.over_limit is None:  # past the limit, only reading on for the files' errors
                self.add(source, target, pair.line)

    def take_held_out(self, pair: TextPair, source: list[str], target: list[str]) -> None:
        if len(self.held_out) < MAX_HELD_OUT:
            self.held_out.append(pair)

    def add(self, source: list[str], target: list[str], line: int) -> None:
        """A training pair as ids; a new symbol gets the next number."""
        new = set(source).union(target).difference(self.symbols)
        if len(self.symbols) + len(new) > MAX_SYMBOLS:
            self.over_limit = line
            return
        for symbol in new:  # numbered in any order: `sorted_symbols` renumbers
            self.symbols[symbol] = len(self.symbols)
        if id_typecode(len(RESERVED) + len(self.symbols)) != self.train.ids.typecode:
            self.train.widen()
        number = self.symbols.__getitem__
        self.train.append(map(number, source), map(number, target))

    def check_split(self, where: str) -> None:
        """Without task.eval_path, both sides of the hash split must have pairs."""
        if not self.sides["held out"] or not self.sides["train"]:
            share = "no pair" if not self.sides["held out"] else "every pair"
            raise DataError(f"{where}: task.eval_fraction ({self.cfg.eval_fraction}) holds out "
                            f"{share} of its {sum(self.sides.values()):,}: change it or give "
                            f"task.eval_path")

    def sorted_symbols(self) -> list[str]:
        """The symbols in vocabulary order (sorted), the training ids renumbered to match."""
        symbols = sorted(self.symbols)
        rank = {symbol: len(RESERVED) + i for i, symbol in enumerate(symbols)}
        self.train.renumber([rank[symbol] for symbol in self.symbols])  # dicts keep their order
        return symbols


# --- the task ---

class PairsTask(Task):
    """Pairs read from a file: the target is what the file says. Example (examples/dates):
    2026-11-22 -> 22 November 2026 (task.tokenize char: every character is a symbol)."""

    name = "pairs"
    summary = "your own source/target pairs, read from task.train_path"

    def __init__(self, cfg: TaskConfig, data: PairsData | None = None) -> None:
        self.cfg = cfg
        self.data = data if data is not None else load_data(cfg)
        self.vocab = Vocab((*RESERVED, *self.data.symbols))
        self.n_symbols = len(self.data.symbols)
        self.first_data_id = len(RESERVED)
        self.compact = cfg.tokenize == "char"
        self.separator = JOINERS[cfg.tokenize]  # text joined as the files are: format, example
        self.train = self.data.train
        self.held_out = PairArray.of(map(self._ids, self.data.held_out), len(self.vocab))
        self.longest = self.data.longest or [
            max(max(pairs.lengths(side), default=0) for pairs in (self.held_out, self.train))
            for side in (0, 1)]

    @classmethod
    def from_checkpoint(cls, cfg: TaskConfig, state: dict[str, Any]) -> PairsTask:
        """The task as trained, from a checkpoint alone (checked by `saved_problem`)."""
        saved = state["pairs"]
        held_out = [TextPair(source, target, 0) for source, target in saved["held_out"]]
        return cls(cfg, PairsData(list(state["vocab"][len(RESERVED):]), PairArray(), held_out,
                                  saved["train_sha256"], longest=list(saved["longest"])))

    @classmethod
    def saved_problem(cls, state: dict[str, Any]) -> str | None:
        """What is wrong with a checkpoint's pairs data (None: nothing), read as untrusted."""
        if tuple(state["vocab"][:len(RESERVED)]) != RESERVED:
            return f"a pairs vocabulary starts with {', '.join(RESERVED)}"
        saved = state.get("pairs")
        if not isinstance(saved, dict) or set(saved) != {"held_out", "longest", "train_sha256"}:
            return "'pairs' must be a mapping of held_out, longest, train_sha256"
        held_out, longest = saved["held_out"], saved["longest"]
        if not isinstance(held_out, list) or not 1 <= len(held_out) <= MAX_HELD_OUT or not all(
                isinstance(pair, list) and len(pair) == 2 and all(
                    isinstance(text, str) and 0 < len(text) <= MAX_LINE_BYTES for text in pair)
                for pair in held_out):
            return f"'pairs.held_out' must be 1 to {MAX_HELD_OUT:,} [source, target] strings"
        if not isinstance(longest, list) or len(longest) != 2 or not all(
                type(n) is int and 1 <= n <= 65_536 for n in longest):
            return "'pairs.longest' must be two lengths"
        if not isinstance(saved["train_sha256"], str) or len(saved["train_sha256"]) != 64:
            return "'pairs.train_sha256' must be a SHA-256 in hex"
        return None

    def checkpoint_data(self) -> dict[str, Any]:
        return {"pairs": {"held_out": [[p.source, p.target] for p in self.data.held_out],
                          "longest": list(self.longest),
                          "train_sha256": self.data.train_sha256}}

    def _ids(self, pair: TextPair) -> Pair:
        return self._symbol_ids(pair.source), self._symbol_ids(pair.target)

    def _symbol_ids(self, text: str) -> list[int]:
        return [self._symbol_id(symbol) for symbol in self._tokenize(text)]

    # --- the rule: whatever the data says ---

    def target(self, src: list[int]) -> list[int] | None:
        """The target the data gives `src` (None: a source not in the data); a held-out
        source's first, then a training source's first."""
        for pairs in (self.held_out, self.train):
            found = pairs.find(src)
            if found is not None:
                return pairs[found][1]
        return None

    def max_target_len(self, src_len: int) -> int:
        return self.longest[1]  # decoding never needs more than the longest target

    def check_positions(self, max_len: int) -> None:
        """Every pair of the files must fit model.max_len: the source, and BOS + the target."""
        for where, lengths in self.data.files:
            for line, src, tgt in lengths:
                if max(src, tgt + 1) > max_len:
                    raise DataError(
                        f"{where} line {line:,}: the pair needs {max(src, tgt + 1)} "
                        f"positions (source {src} symbols, <bos> + target {tgt + 1}), more "
                        f"than model.max_len ({max_len}): raise model.max_len or shorten it")

    def is_held_out(self, src: list[int]) -> bool:
        """In the eval file, or (without one) held out by the hash of its text."""
        if self.cfg.eval_path is not None:
            return self.held_out.find(src) is not None
        return hashed_out(self.format(src), self.cfg.eval_fraction)

    # --- sampling ---

    def sample(self, n: int, generator: torch.Generator, *, min_len: int | None = None,
               max_len: int | None = None, split: str = "train") -> list[Pair]:
        """Training: `n` pairs drawn with replacement; eval: the first `n` held-out pairs, then
        those with a source length in [min_len, max_len] (default task.min_len..max_len)."""
        if split not in SPLITS:
            raise ValueError(f"split ({split!r}) must be one of {SPLITS}")
        lo = self.cfg.min_len if min_len is None else min_len
        hi = self.cfg.max_len if max_len is None else max_len
        pool = self._pool(split, n, lo, hi)
        if split == "eval":
            return pool
        picks = torch.randint(len(pool), (n,), generator=generator).tolist()
        return [pool[i] for i in picks]

    def _pool(self, split: str, n: int, lo: int, hi: int) -> list[Pair]:
        """The pairs `sample` chooses from: training ones, or the first `n` held-out ones."""
        pairs = self.held_out[:n] if split == "eval" else self.train
        if split == "train" and (lo, hi) == (self.cfg.min_len, self.cfg.max_len):
            return pairs  # already the ones in range (load_data): no filtering every step
        pool = [pair for pair in pairs if lo <= len(pair[0]) <= hi]
        if not pool:
            lengths = sorted(len(src) for src, _ in pairs)
            kind = "held-out" if split == "eval" else "training"
            raise MinitfmError(f"no {kind} pairs have a source of {lo}..{hi} symbols (their "
                               f"sources have {lengths[0]}..{lengths[-1]}): pick another range")
        return pool

    # --- text ---

    # `Task.parse` reads text with these: symbols never trained on read as <unk>.

    def _tokenize(self, text: str) -> list[str]:
        return symbols_of(text, self.cfg.tokenize)

    def _symbol_id(self, token: str) -> int:
        return self.vocab.id(token) if token in self.vocab and token not in RESERVED else UNK_ID

    def _allowed(self) -> str:
        return (f"a source as in its files (task.tokenize {self.cfg.tokenize}: "
                f"{'each character' if self.cfg.tokenize == 'char' else 'each word'} a symbol)")

    def _example_text(self) -> str:
        return self.example()[0]

    def unknown_symbols(self, text: str) -> list[str]:
        """The symbols of `text` never trained on (read as <unk>), each once."""
        symbols = symbols_of(text, self.cfg.tokenize)
        return list(dict.fromkeys(s for s in symbols if s in RESERVED or s not in self.vocab))

    def count_unknown(self, pairs: list[Pair]) -> int:
        """How many symbols of `pairs` (sources and targets) read as <unk>."""
        return sum(ids.count(UNK_ID) for pair in pairs for ids in pair)

    def example(self) -> tuple[str, str]:
        """The first held-out pair, as text."""
        src, tgt = self.held_out[0]
        return self.format(src), self.format(tgt)

    @classmethod
    def catalog_example(cls) -> tuple[str, str]:
        return "2026-11-22", "22 November 2026"

    def describe(self) -> str:
        lengths = self.train.lengths(0)
        return (f"{len(self.train):,} training pairs, {len(self.held_out):,} held out, "
                f"{self.n_symbols:,} symbols ({self.cfg.tokenize}), sources of "
                f"{min(lengths)}..{max(lengths)} symbols")
