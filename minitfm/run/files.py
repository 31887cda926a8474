"""Writing files: the one atomic write, JSON as minitfm writes it, a file's name as text; and
the one reader of Linux's /proc files (`proc_value`). Nothing here knows a run: a run's folder,
and how its files are opened where they are, are `rundir.py`'s.

Every file minitfm replaces (checkpoints, config.yaml, summary.json, pictures, a sweep's
results) goes through `write_atomic`: a reader, or a kill midway, sees the old file or the new
one, never half of it; a link in its place is replaced, never followed. Every JSON document
minitfm writes or prints goes through `to_json`: strict JSON, a number that is not finite (NaN,
infinity) written as null. No torch here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def write_atomic(path: Path, data: bytes) -> None:
    """A temp file in the same folder, fsync, then os.replace: the old file or the new, whole.

    A full disk or a kill midway leaves the previous file as it was (never an empty one).
    """
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """`write_atomic` for a file written piece by piece: the temp file to write, which
    replaces `path` once the block ends (left as it was if the block raises)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 would hide it from TensorBoard
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder: the first error is the one to tell
            Path(tmp).unlink(missing_ok=True)
        raise


def name_text(text: str) -> str:
    """A file name as text any UTF-8 output can carry (a strict terminal, a picture, a page):
    the bytes of the name that are not UTF-8 (Latin-1's é is the byte 0xe9), which Python holds
    as lone surrogates U+DC80..U+DCFF, written `\\xe9`; another lone surrogate as `\\udXXX`."""
    return "".join(escaped_surrogate(ch) if "\ud800" <= ch <= "\udfff" else ch for ch in text)


def escaped_surrogate(ch: str) -> str:
    """`\\xe9` for the stand-in of the byte 0xe9 (U+DCE9), `\\ud800` for another surrogate."""
    return f"\\x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else f"\\u{ord(ch):04x}"


def proc_value(path: str, key: str) -> str | None:
    """The first word after `key:` in a /proc file such as /proc/self/status or /proc/meminfo
    (None: no such file, as off Linux or for a process gone, or no such line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return line.split()[1]
    except OSError:
        pass
    return None


def current_umask() -> int:
    """The process umask, read from /proc where possible (setting it is process-wide)."""
    found = proc_value("/proc/self/status", "Umask")  # such as "0022"
    if found is not None:
        with contextlib.suppress(ValueError):
            return int(found, 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def to_json(value: Any, **options: Any) -> str:
    """`value` as strict JSON (`json.dumps` with `options`): NaN and infinities, which strict
    parsers refuse, written as null, the value JSON has for a missing number."""
    return json.dumps(finite(value), allow_nan=False, **options)


def finite(value: Any) -> Any:
    """`value` with every float that is NaN or infinite, in any list, tuple or dict, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value
