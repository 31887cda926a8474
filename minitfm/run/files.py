"""Files a run writes: the one atomic write, `mkdir -p` that cleans up, metrics lines, JSON as
minitfm writes it; and the one reader of Linux's /proc files (`proc_value`).

Every file minitfm replaces (checkpoints, config.yaml, summary.json, pictures, a sweep's
results) goes through `write_atomic`: a reader, or a kill midway, sees the old file or the new
one, never half of it. Every JSON document minitfm writes or prints goes through `to_json`:
strict JSON, a number that is not finite (NaN, infinity) written as null. No torch here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes) -> None:
    """A temp file in the same folder, fsync, then os.replace: the old file or the new, whole.

    A full disk or a kill midway leaves the previous file as it was (never an empty one).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 would hide it from TensorBoard
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder: the first error is the one to tell
            Path(tmp).unlink(missing_ok=True)
        raise


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


def make_dirs(path: Path) -> None:
    """`mkdir -p` that removes the folders it made when a later one fails (a name too long)."""
    created: list[Path] = []
    try:
        for folder in reversed([path, *path.parents]):
            try:
                if not stat.S_ISDIR(os.stat(folder).st_mode):  # a file: say so, not EEXIST
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), folder)
            except FileNotFoundError:  # (a symlink loop raises its own ELOOP above)
                folder.mkdir()
                created.append(folder)
    except OSError:
        for folder in reversed(created):
            folder.rmdir()
        raise


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to `metrics.jsonl`."""
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(to_json(record) + "\n")


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
