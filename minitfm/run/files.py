"""Files a run writes: the one atomic write, the one way to open a run's file in place, the
one way to remove what minitfm made, `mkdir -p` that cleans up, metrics lines, JSON as minitfm
writes it; and the one reader of Linux's /proc files (`proc_value`).

Every file minitfm replaces (checkpoints, config.yaml, summary.json, pictures, a sweep's
results) goes through `write_atomic`: a reader, or a kill midway, sees the old file or the new
one, never half of it; a link in its place is replaced, never followed. Every file of a run
that is read, appended to or locked where it is (`.lock`, metrics.jsonl, attention.jsonl,
eval-*.json, a sweep's logs...) is opened by `open_run_file`: never through a symbolic link
(one planted in a shared run folder would make minitfm write into a file of yours), and only
when it is a regular file (a FIFO would hang the read); a resumed run rewrites its record files
without the lines past its checkpoint (`drop_records_after`). `remove_files` removes only regular
files, never through a linked folder. Every JSON document minitfm writes or prints goes through
`to_json`: strict JSON, a number that is not finite (NaN, infinity) written as null. No torch
here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from minitfm.errors import MinitfmError

# O_NONBLOCK: a FIFO put in place of a file must not block the open (it is refused after)
NO_LINK = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
OPEN_FLAGS = {"r": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
              "a+": os.O_RDWR | os.O_APPEND | os.O_CREAT}  # by open()'s mode, without "b"
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PIECE = 65_536  # bytes of a record file read at once
RECORD_STEP = re.compile(rb'\{"step": ?(\d{1,10})[,}]')  # a record's start as minitfm writes it


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


class NotRegularFile(OSError):
    """A run's file that is a symbolic link, a FIFO, a folder or a device: never opened. Its
    `strerror` says what it is: `is a symbolic link (...)`, `is not a regular file (a FIFO)`."""


def kind(mode: int) -> str:
    """What a file that is no regular file is, in words (`mode` from lstat)."""
    kinds = {stat.S_ISLNK: "a symbolic link", stat.S_ISFIFO: "a FIFO", stat.S_ISDIR: "a folder",
             stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "a device")


def not_regular(path: Path, mode: int) -> NotRegularFile:
    """The error for `path`, which is no regular file (`mode` from lstat)."""
    what = ("is a symbolic link (minitfm never opens a run's files through one)"
            if stat.S_ISLNK(mode) else f"is not a regular file ({kind(mode)})")
    return NotRegularFile(errno.EINVAL, what, str(path))


def open_run_file(path: Path, mode: str = "rb", errors: str | None = None) -> IO:
    """Open a run's file as open() would (`mode` r, a or a+, with b for bytes; text is UTF-8),
    but never through a symbolic link and only a regular file: else `NotRegularFile`."""
    try:
        fd = os.open(path, OPEN_FLAGS[mode.replace("b", "")] | NO_LINK, 0o666)
    except OSError:  # ELOOP for a link, ENXIO for a FIFO no one reads: say which it is
        found = lstat_mode(path)
        if found is None or stat.S_ISREG(found):
            raise
        raise not_regular(path, found) from None
    found = os.fstat(fd).st_mode
    if not stat.S_ISREG(found):
        os.close(fd)
        raise not_regular(path, found)
    return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8", errors=errors)


def lstat_mode(path: Path) -> int | None:
    """The mode of `path` itself (a link's own), None when there is nothing to look at."""
    try:
        return os.lstat(path).st_mode
    except OSError:
        return None


def check_writable(folder: Path, names: Iterable[str]) -> None:
    """Each of `names` in `folder`, which a command will write where it is (append to, lock),
    is a regular file or none yet: asked before anything is written, a MinitfmError naming
    the first that is not."""
    for name in names:
        found = lstat_mode(folder / name)
        if found is not None and not stat.S_ISREG(found):
            what = not_regular(folder / name, found).strerror
            raise MinitfmError(f"'{folder / name}' {what}; minitfm writes {name} where it is: "
                               f"remove it and try again")


def unreadable(name: str, err: OSError) -> str:
    """Why a run's file `name` could not be read, in words: `summary.json is not a regular file
    (a FIFO)`, `cannot read summary.json (Permission denied)`."""
    if isinstance(err, NotRegularFile):
        return f"{name} {err.strerror}"
    return f"cannot read {name} ({err.strerror})"


def remove_files(folder: Path, names: str) -> None:
    """Remove the regular files in `folder` whose names match the regex `names`; a link, a
    FIFO or a folder of that name stays, and a linked `folder` is never entered."""
    try:
        fd = os.open(folder, FOLDER_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as err:
        if err.errno == errno.ELOOP:  # a link in place of the folder: left alone
            return
        raise
    try:
        for entry in os.scandir(fd):
            if re.fullmatch(names, entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)


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


def drop_records_after(path: Path, step: int) -> None:
    """A run's file of records (metrics.jsonl, attention.jsonl) without the lines of steps past
    `step`: what a process killed after its last checkpoint wrote, which the run resumed from
    that checkpoint writes again. The file is rewritten (atomically) only when a line must go,
    and every line kept stays byte for byte: a line that is no record minitfm writes (a hand
    edit) stays, a torn last line (a write cut short) goes."""
    try:
        with open_run_file(path) as f:
            if not any_past(f, step):
                return
            f.seek(0)
            with atomic_file(path) as out:
                piece, keep, begun = b"\n", True, 0
                for piece, starts in line_pieces(f):
                    if starts:
                        keep, begun = not is_past(piece, step), out.tell()
                    if keep:
                        out.write(piece)
                if not piece.endswith(b"\n"):  # torn: the line ends with the file
                    out.truncate(begun)
    except FileNotFoundError:  # a run that never wrote one
        pass


def any_past(f: BinaryIO, step: int) -> bool:
    """Whether `f` holds a record past `step`, or a torn last line."""
    piece = b"\n"
    for piece, starts in line_pieces(f):
        if starts and is_past(piece, step):
            return True
    return not piece.endswith(b"\n")


def line_pieces(f: BinaryIO) -> Iterator[tuple[bytes, bool]]:
    """`f` in pieces of at most PIECE bytes (a huge line costs no memory), each with whether
    it starts a line."""
    starts = True
    while piece := f.readline(PIECE):
        yield piece, starts
        starts = piece.endswith(b"\n")


def is_past(head: bytes, step: int) -> bool:
    """Whether the line that begins with `head` is a record minitfm wrote (`to_json` puts the
    step first) of a step past `step`."""
    found = RECORD_STEP.match(head)
    return found is not None and int(found[1]) > step


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to `metrics.jsonl`."""
    with open_run_file(run_dir / "metrics.jsonl", "a") as f:
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
