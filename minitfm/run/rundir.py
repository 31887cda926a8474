"""Run folders: where a run goes, how one is told apart and found, how a run opens one (picks,
checks, locks, prepares it), and how a run's files are opened in place (which run a RUN argument
means is `which_run.py`'s; how a run ended, with its summary.json, `summary.py`'s).

A run directory `runs/<name>-<YYYYmmdd-HHMMSS>/` holds `config.yaml` (resolved),
`metrics.jsonl`, `checkpoints/last.pt`, `checkpoints/best.pt` and TensorBoard event files. One
training process at a time holds its `.lock`; a fresh run clears what an overwritten one left
(`MADE_FILES`), a resumed one the records past its checkpoint (`drop_records_after`). Every file
of a run read, appended to or locked in place (`.lock`, metrics.jsonl, attention.jsonl,
eval-*.json, a sweep's logs...) is opened by `open_run_file`: never through a symbolic link (one
planted in a shared run folder would make minitfm write into a file of yours), and only a
regular file (a FIFO would hang the read). `remove_files` removes only regular files, never
through a linked folder. A sweep's folder is opened with the same pieces. No torch here.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, BinaryIO

from minitfm.config import Config, to_yaml
from minitfm.errors import CheckpointError, MinitfmError, RunFailed, option
from minitfm.run.files import atomic_file, write_atomic

CHECKPOINTS = ("best", "last")
# What training writes where it is (locked, appended to); every other file is replaced whole.
IN_PLACE = (".lock", "metrics.jsonl", "attention.jsonl")
RECORDS = ("metrics.jsonl", "attention.jsonl")  # of those, a record per line, step first
# O_NONBLOCK: a FIFO put in place of a file must not block the open (it is refused after)
NO_LINK = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
OPEN_FLAGS = {"r": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
              "a+": os.O_RDWR | os.O_APPEND | os.O_CREAT}  # by open()'s mode, without "b"
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PIECE = 65_536  # bytes of a record file read at once
RECORD_STEP = re.compile(rb'\{"step": ?(\d{1,10})[,}]')  # a record's start as minitfm writes it


# --- a run's files, opened where they are ---

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


# --- finding a run ---

def new_run_dir(log_dir: str | Path, name: str) -> Path:
    """A fresh `log_dir/<name>-<YYYYmmdd-HHMMSS>` (suffixed `-2`, `-3`... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(log_dir) / f"{name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds a minitfm run: a config.yaml or metrics.jsonl that minitfm wrote."""
    return is_run_config(path / "config.yaml") or is_run_metrics(path / "metrics.jsonl")


def is_run_config(path: Path) -> bool:
    """A resolved config.yaml: exactly the top-level keys of `Config`, as `to_yaml` writes."""
    try:
        with open_run_file(path, "r") as f:
            text = f.read(65536)
    except (OSError, UnicodeDecodeError):
        return False
    keys = set(re.findall(r"^([A-Za-z_]\w*):", text, re.MULTILINE))
    return keys == set(Config.model_fields)


def is_run_metrics(path: Path) -> bool:
    """A metrics.jsonl whose first line is a record minitfm writes (`step` and `split`)."""
    try:
        with open_run_file(path, "r") as f:
            record = json.loads(f.readline(4096))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # "[[[[..." nests deep
        return False
    return isinstance(record, dict) and {"step", "split"} <= record.keys()


def has_config_yaml(path: Path) -> bool:
    """A quick test for listing runs: `path` has a config.yaml file, not read (`is_run_dir`
    reads it, to tell a minitfm run from a folder that only looks like one). A folder that
    cannot be looked into may hold one: True, so that it is listed as unreadable."""
    try:
        return (path / "config.yaml").is_file()
    except PermissionError:
        return path.is_dir()


def find_run_dir(checkpoint: Path) -> Path | None:
    """The run directory holding `checkpoint` in its checkpoints/; None for a loose file."""
    parent = checkpoint.resolve().parent
    if parent.name == "checkpoints" and is_run_dir(parent.parent):
        return parent.parent
    return None


# --- one training process at a time, and a prepared directory ---

def lock_exclusively(file, in_use: Callable[[str], Exception]) -> None:
    """Take an exclusive `flock` on an open lock file and write this process's pid into it;
    if another process holds it, close the file and raise `in_use(its pid)`."""
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        pid = file.read().strip() or "?"
        file.close()
        raise in_use(pid) from None
    file.truncate(0)
    file.write(str(os.getpid()))
    file.flush()


class RunLock:
    """An exclusive lock on a run directory while one process trains in it.

    `flock` is released by the kernel when the process dies, even by `kill -9`, so a stale
    lock can never block a later `--resume`.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.file = None

    def __enter__(self) -> RunLock:
        try:
            make_dirs(self.run_dir)
        except OSError as err:
            raise CheckpointError(f"cannot create the run directory '{self.run_dir}' "
                                  f"({err.strerror}): check log.dir or "
                                  f"{option('run_dir')}") from None
        self.file = open_run_file(self.run_dir / ".lock", "a+")  # see check_writable
        lock_exclusively(self.file, lambda pid: CheckpointError(
            f"run directory '{self.run_dir}' is in use by another training process (pid {pid}): "
            f"wait for it to finish or use another {option('run_dir')}"))
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def open_run_dir(cfg: Config, run_dir: Path | None, resume: Path | None, overwrite: bool,
                 held: ExitStack, step: int = 0) -> Path:
    """Pick, check, lock (until `held` closes) and prepare the run directory (`step`: the
    checkpoint's, which a resumed run goes on from)."""
    try:
        if resume is not None:
            run_dir = resume_run_dir(resume, run_dir, overwrite)
        else:
            run_dir = run_dir or new_run_dir(cfg.log.dir, cfg.name)
            check_fresh(run_dir, overwrite)
            check_clearable(run_dir)
        check_tensorboard_path(cfg, run_dir)
        created = not run_dir.exists()
        check_writable(run_dir, IN_PLACE)
        held.enter_context(RunLock(run_dir))
    except OSError as err:  # a name too long, a path through a file, no permission
        where = err.filename or run_dir or Path(cfg.log.dir) / cfg.name
        raise CheckpointError(f"cannot create the run directory '{where}' ({err.strerror}): "
                              f"check log.dir, name or {option('run_dir')}") from None
    try:
        write_run_files(run_dir, cfg, None if resume is None else step)
    except OSError as err:
        if created:  # a disk full from the start: leave nothing behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise RunFailed(write_failure(err, run_dir)) from None
    return run_dir


def check_fresh(run_dir: Path, overwrite: bool) -> None:
    """A run may go into a new or empty directory, or replace a minitfm run with `overwrite`."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"cannot create the run directory '{run_dir}' (a file of that "
                              f"name exists): check log.dir or {option('run_dir')}")
    if not run_dir.exists() or all(p.name == ".lock" for p in run_dir.iterdir()):
        return
    if not is_run_dir(run_dir):
        raise MinitfmError(f"directory '{run_dir}' is not empty and holds no minitfm run (no "
                           f"config.yaml or metrics.jsonl written by minitfm): pick another "
                           f"{option('run_dir')}; {option('overwrite')} replaces only minitfm "
                           f"runs")
    if not overwrite:
        raise MinitfmError(f"run directory '{run_dir}' already exists: continue it with "
                           f"{option('resume_of', run_dir)}, pick another {option('run_dir')}, "
                           f"or pass {option('overwrite')}")


def check_clearable(run_dir: Path) -> None:
    """An overwritten run's checkpoints can be cleared: they are not behind a link (which
    `clear_made_files` never follows, and the old best.pt would stay beside the new run)."""
    if (run_dir / "checkpoints").is_symlink():
        raise MinitfmError(f"'{run_dir / 'checkpoints'}' is a symbolic link, and "
                           f"{option('overwrite')} never removes files through one: remove the "
                           f"old checkpoints and the link yourself, or pick another "
                           f"{option('run_dir')}")


def check_tensorboard_path(cfg: Config, run_dir: Path) -> None:
    """TensorBoard writes only under a path that is UTF-8 text (a Latin-1 file name is not):
    refused before anything is written."""
    try:
        str(run_dir).encode("utf-8")
    except UnicodeEncodeError:
        if cfg.log.tensorboard:
            raise MinitfmError(f"run directory '{run_dir}' has a name that is not "
                               f"UTF-8, and TensorBoard cannot write there: pick another "
                               f"{option('run_dir')} or log.dir, or set "
                               f"log.tensorboard=false") from None


def resume_run_dir(checkpoint: Path, run_dir: Path | None, overwrite: bool = False) -> Path:
    """Where a resumed run goes on: the checkpoint's own run, or `run_dir` for a loose file
    (checked, nothing written); `overwrite` is refused."""
    if overwrite:
        raise MinitfmError(f"{option('overwrite')} cannot be combined with "
                           f"{option('resume')}: a resumed run keeps its files")
    own = find_run_dir(checkpoint)
    if own is not None:
        if run_dir is not None and run_dir.resolve() != own:
            raise MinitfmError(f"{option('run_dir')} ('{run_dir}') cannot be combined with "
                               f"{option('resume')} of run '{own}': a run goes on in its own "
                               f"directory; {option('run_dir')} is for a checkpoint kept "
                               f"outside any run")
        return own
    if run_dir is None:
        raise MinitfmError(f"checkpoint '{checkpoint}' is not inside a minitfm run "
                           f"(<run>/checkpoints/): to continue it, give {option('run_dir')} (a "
                           f"new or empty directory, or a minitfm run directory)")
    check_fresh(run_dir, overwrite=True)  # a minitfm run, new or empty: no other
    return run_dir


def write_run_files(run_dir: Path, cfg: Config, resumed_at: int | None) -> None:
    """The resolved config.yaml; a fresh run (`resumed_at` None) also clears what an
    overwritten run left, a resumed one the records past its checkpoint's step (`RECORDS`:
    a process killed after its last save wrote them, and the run writes them again)."""
    for folder in (run_dir, run_dir / "checkpoints"):  # left by writes killed midway
        remove_files(folder, TEMP_FILE)
    if resumed_at is None:
        clear_made_files(run_dir)
    else:
        for name in RECORDS:
            drop_records_after(run_dir / name, resumed_at)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    write_atomic(run_dir / "config.yaml", to_yaml(cfg).encode("utf-8"))


# What minitfm writes into a run, folder by folder: training's records, checkpoints and event
# files, the id of its MLflow run (an overwritten run is a new MLflow run); the pictures of
# visualize-attention (`visualize.default_png`, `timeline.over_training`), ablate, explain
# (its JSON too: a page must not embed another model's role cards), patch and plot; explore's
# page; a sweep's eval-<lo>-<hi>.json; temp files of writes cut short.
MADE_FILES = {
    ".": r"metrics\.jsonl|attention\.jsonl|summary\.json|mlflow\.json|plot\.png"
         r"|explorer\.html|eval-\d+-\d+\.json|events\.out\.tfevents\..+",
    "checkpoints": r".+\.pt",
    "attention": r".+-step\d+(-(encoder|decoder|cross))?(-layer\d+)?(-head\d+)?\.png"
                 r"|over-training-layer\d+\.png",
    "ablate": r".+-step\d+-(zero|mean)\.png",
    "explain": r".+-step\d+\.(png|json)",
    "patch": r".+-step\d+\.png",
}
PICTURE_FOLDERS = ("attention", "ablate", "explain", "patch")  # removed once empty
TEMP_FILE = r"\..+\.tmp"


def clear_made_files(run_dir: Path) -> None:
    """Remove what minitfm wrote into a run being overwritten (`MADE_FILES`), and nothing else:
    a file of the user's stays, and so does the folder that holds one; a link is never
    followed (see `remove_files`)."""
    for folder, names in MADE_FILES.items():
        where = run_dir / folder
        remove_files(where, f"{names}|{TEMP_FILE}")
        if folder in PICTURE_FOLDERS and not where.is_symlink() and where.is_dir() \
                and not any(where.iterdir()):
            where.rmdir()


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


def write_failure(err: OSError, run_dir: Path) -> str:
    """One line for a failed write (a full disk, say): what failed, and what is still safe."""
    where = err.filename or run_dir
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))
    kept = (f"; {', '.join(saved)} in {run_dir / 'checkpoints'} stay valid" if saved
            else "; no checkpoint was written yet")
    return f"cannot write to '{where}' ({err.strerror or err}){kept}"
