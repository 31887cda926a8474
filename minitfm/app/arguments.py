"""Arguments that need reading: a config before its KEY=VALUE overrides, a RUN before a
command's inputs, the lines of stdin."""

from __future__ import annotations

import sys
from pathlib import Path

from minitfm.errors import MinitfmError, quote


def split_config_args(args: list[str], allow_config: bool) -> tuple[str | None, list[str]]:
    """`[CONFIG] [KEY=VALUE]...` -> (config path or None, overrides).

    The first argument is the config when it has no `=`, names a file or ends in .yaml/.yml
    (a folder such as `sweep/lr=0.001/config.yaml` may hold one)."""
    first = args[0] if args else ""
    if args and ("=" not in first or is_file(first) or first.endswith((".yaml", ".yml"))):
        if not allow_config:
            raise MinitfmError(f"{quote(first)}: with --resume the config comes from the run; "
                               f"give only KEY=VALUE overrides")
        return args[0], args[1:]
    return None, args


def is_file(text: str) -> bool:
    """Whether `text` names a file."""
    try:
        return Path(text).is_file()
    except OSError:  # a name too long to be a path is no file
        return False


def split_run_and_inputs(run: Path | None, inputs: list[str]) -> tuple[Path | None, list[str]]:
    """`predict 3 1 4` has no RUN: a first word that is no existing path is an input, unless
    it looks like a path (holds a '/' or ends in .pt): then it is a mistyped RUN."""
    if run is not None and not run.exists():
        if "/" in str(run) or run.suffix == ".pt":
            raise MinitfmError(f"run {quote(str(run))} not found: give a run directory or a "
                               f".pt file")
        return None, [str(run), *inputs]
    return run, inputs


def stdin_lines() -> list[tuple[int, str]]:
    """stdin's lines that are not blank, with their numbers: split at "\\n" only and read as a
    pairs file's lines are (UTF-8, a trailing "\\r" and a first byte-order mark dropped), so a
    symbol such as U+2028, "\\x1c" or a lone "\\r" stays inside its line."""
    from minitfm.tasks.pairfiles import decode_line

    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else \
        sys.stdin.read().encode("utf-8", "surrogateescape")
    lines = raw.split(b"\n")
    if lines[-1] == b"":  # the newline that ends the last line starts no other
        lines.pop()
    read = [(n, decode_line(line, f"stdin line {n}", first=n == 1))
            for n, line in enumerate(lines, 1)]
    return [(n, text) for n, text in read if text.strip()]
