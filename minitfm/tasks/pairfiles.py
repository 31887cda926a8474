"""Reading the files of task pairs: one pair a line, every mistake one DataError.

Files. `task.train_path` and, optionally, `task.eval_path`: TSV (`source<TAB>target`, one pair a
line) or JSON lines (`{"source": ..., "target": ...}`), chosen by the extension. Empty lines
are skipped; any other mistake is one DataError naming the file and the line. A file is read a
line at a time and never held whole; what is kept of it is `pairs.Reading`'s to decide.

Symbols. `task.tokenize: char` makes every character a symbol (spaces too); `space` splits on
whitespace, so that a symbol can be a word, and refuses the reserved symbols (the special
tokens and <unk>) as words. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

from minitfm.catalog import SPECIAL_TOKENS, TASKS
from minitfm.errors import DataError, quote

(UNK,) = TASKS["pairs"].task_symbols  # "<unk>": a symbol never trained on
RESERVED = (*SPECIAL_TOKENS, UNK)  # ids 0..3; data symbols follow
MAX_FILE_BYTES = 1_000_000_000  # 1 GB
MAX_PAIRS = 1_000_000  # lines of pairs per file
MAX_LINE_BYTES = 1_000_000  # a longer line cannot fit model.max_len (at most 65,536 symbols)
MAX_SYMBOL_CHARS = 1_000  # with task.tokenize space, the longest word
JOINERS = {"char": "", "space": " "}


class TextPair(NamedTuple):
    """One pair as read: both sides as their symbols joined back to text, and its line."""

    source: str
    target: str
    line: int  # 1-based line number in its file (0: read from a checkpoint)


def symbols_of(text: str, tokenize: str) -> list[str]:
    """The symbols of `text`: its characters (char) or its whitespace-separated words (space)."""
    return list(text) if tokenize == "char" else text.split()


def read_pairs(path: Path, key: str, tokenize: str, take: Callable[[TextPair], None]) -> str:
    """Pass every pair of a .tsv or .jsonl file to `take`, a line at a time; the file's SHA-256.
    A mistake is a DataError."""
    shown = named(key, str(path))
    check_file(path, shown)
    split = parse_jsonl if path.suffix.lower() == ".jsonl" else parse_tsv
    count, digest = 0, hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for number, raw in enumerate(iter(partial(f.readline, MAX_LINE_BYTES + 2), b""), 1):
                digest.update(raw)
                where = f"{shown} line {number:,}"
                text = decode_line(raw, where, first=number == 1)
                if not text:
                    continue
                if count == MAX_PAIRS:
                    raise DataError(f"{where}: more than {MAX_PAIRS:,} pairs, the limit per "
                                    f"file: use a part of the file")
                source, target = split(text, where)
                take(TextPair(side(source, "source", where, tokenize),
                              side(target, "target", where, tokenize), number))
                count += 1
    except OSError as err:
        raise DataError(f"cannot read {shown} ({err.strerror or err})") from None
    if not count:
        raise DataError(f"{shown} has no pairs: write one pair a line, " + (
            'as {"source": ..., "target": ...}' if split is parse_jsonl else "source<TAB>target"))
    return digest.hexdigest()


def check_file(path: Path, shown: str) -> None:
    """The file exists, is a regular file and is at most MAX_FILE_BYTES."""
    if not path.exists():
        maker = path.parent / "make_data.py"  # an example's data is made, never committed
        hint = (f": make it with python {nearby(maker)}" if maker.is_file()
                else ": check the path (relative paths start at the config file's folder)")
        raise DataError(f"{shown} not found{hint}")
    if not path.is_file():
        raise DataError(f"{shown} is not a regular file: give a .tsv or .jsonl file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise DataError(f"{shown} is {size:,} bytes, more than the limit of "
                        f"{MAX_FILE_BYTES:,} (1 GB): use a part of the file")


def nearby(path: Path) -> str:
    """`path` relative to the current folder when it is inside it, else as it is."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def decode_line(raw: bytes, where: str, first: bool) -> str:
    """A line's text without its line ending; long lines and non-UTF-8 bytes are refused."""
    content = raw[:-1] if raw.endswith(b"\n") else raw
    if len(content) > MAX_LINE_BYTES:
        raise DataError(f"{where}: longer than {MAX_LINE_BYTES:,} bytes, the limit per line")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: not UTF-8 (byte 0x{content[err.start]:02x} at byte "
                        f"{err.start + 1} of the line): save the file as UTF-8") from None
    text = text[:-1] if text.endswith("\r") else text  # a Windows line ending
    return text.removeprefix("\ufeff") if first else text  # a byte-order mark


def parse_tsv(text: str, where: str) -> tuple[str, str]:
    fields = text.split("\t")
    if len(fields) != 2:
        problem = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
        raise DataError(f"{where}: {problem}; a .tsv line is source<TAB>target (use .jsonl "
                        f"for text with tabs)")
    return fields[0], fields[1]


def parse_jsonl(text: str, where: str) -> tuple[str, str]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
    except (ValueError, RecursionError):
        raise DataError(f"{where}: invalid JSON") from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: a .jsonl line is an object "
                        f'{{"source": ..., "target": ...}}, not {quote(record, 40)}')
    for key in ("source", "target"):
        if key not in record:
            raise DataError(f"{where}: no {key!r} key; a .jsonl line is "
                            f'{{"source": ..., "target": ...}}')
        if not isinstance(record[key], str):
            raise DataError(f"{where}: {key!r} must be a string, not {quote(record[key], 40)}")
        check_encodable(record[key], key, where)
    return record["source"], record["target"]


def check_encodable(text: str, key: str, where: str) -> None:
    """JSON may escape half of a character (`"\\ud800"`, as a tool that cut an emoji in two
    writes it); such text has no UTF-8, so no symbol, hash or checkpoint can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DataError(f"{where}: {key!r} holds an unpaired surrogate "
                        f"({ascii(text[err.start])[1:-1]}) at character {err.start + 1}: write "
                        f"the whole character (both halves of its pair) or remove it") from None


def side(text: str, name: str, where: str, tokenize: str) -> str:
    """One side of a pair checked, its symbols joined back to text (`a  b` -> `a b`)."""
    if tokenize == "char" and text:
        return text  # its characters joined back: itself (the common case, kept fast)
    symbols = symbols_of(text, tokenize)
    if not symbols:
        raise DataError(f"{where}: empty {name}")
    if tokenize == "space":
        for symbol in symbols:
            if symbol in RESERVED:
                raise DataError(f"{where}: {symbol!r} in the {name} is a reserved symbol "
                                f"({', '.join(RESERVED)})")
            if len(symbol) > MAX_SYMBOL_CHARS:
                raise DataError(f"{where}: a symbol of {len(symbol):,} characters in the "
                                f"{name}, more than the limit of {MAX_SYMBOL_CHARS:,}")
    return JOINERS[tokenize].join(symbols)


def named(key: str, path: str) -> str:
    """How messages name a data file: `task.train_path '/data/train.tsv'`."""
    return f"{key} {quote(path)}"
