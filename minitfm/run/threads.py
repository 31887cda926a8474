"""How many CPU threads torch may use, so that several minitfm processes never oversubscribe.

OpenMP threads spin while they wait for each other: two processes of 2 threads each on 2 cores
ran about a hundred times slower than one (docs/operations.md). So every minitfm process
that computes registers itself in a per-user folder (see `registry_dir`) as a file named by its
pid, holding `auto` or its fixed thread count, and keeps the file `flock`ed while it lives; the
kernel drops the lock when the process dies, even by SIGKILL, and whoever finds an unlocked file
removes it.

The folder is used only when this user alone can write it: in a folder of someone else's, a
planted link would make minitfm overwrite a file of yours, and a planted FIFO would hang it. It
is opened once and checked (a folder, not a link, owned by this user, writable by no one else);
every entry is then reached through that open folder, written only as a file this process has
just created, and read only when it is a regular file. When anything is off, the process runs
unregistered (or skips the entry) and says so once (`warn`).

`auto` resolves to `OMP_NUM_THREADS` when that is set (torchrun sets 1 per worker), else to
(cores - the cores other programs keep busy - the fixed counts of the others) // (the processes
on `auto`, this one included), at least 1. Other programs' load is read from /proc (see
`cpuload`): OpenMP threads on a core that a busy program also wants wait for each other just
the same. Training looks again about once a second: a run alone on 2 cores uses 2 threads,
drops to 1 when a second run (or any busy program) starts and goes back to 2 when it ends.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO

from minitfm.config import parse_threads
from minitfm.errors import quote
from minitfm.run.cpuload import CpuLoad
from minitfm.run.rundir import kind

REGISTRY_ENV = "MINITFM_REGISTRY"  # another registry folder (tests)
RECHECK_S = 1.0  # how often a training run looks at its neighbours again
ENTRY_BYTES = 16  # an entry holds `auto` or a count: never read more
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO put in place of a checked entry must not block the open
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
PATH_CHARS = 300  # a path in a warning is shown whole, so that it can be fixed
UNUSED = "not used (threads=auto cannot see other minitfm processes)"

Warn = Callable[[str], None]


def cpus() -> set[int]:
    """The CPUs this process may run on: its affinity mask, which containers and taskset narrow
    (where the system has none, as on macOS, every CPU)."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def cores() -> int:
    """How many CPUs this process may run on (`cpus`)."""
    return len(cpus())


def registry_dir() -> Path:
    """The per-user folder of running minitfm processes: $MINITFM_REGISTRY, else
    `$XDG_RUNTIME_DIR/minitfm/procs`, else `~/.cache/minitfm/procs` ($XDG_CACHE_HOME if set),
    else (no writable home) a folder `minitfm-<uid>` of its own in the temp folder."""
    if os.environ.get(REGISTRY_ENV):
        return Path(os.environ[REGISTRY_ENV])
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if writable(runtime):
        return Path(runtime) / "minitfm" / "procs"
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    if writable(cache) or writable(os.path.dirname(cache)):
        return Path(cache) / "minitfm" / "procs"
    try:
        tmp = tempfile.gettempdir()
    except OSError:  # no usable temp folder either: the registry will not open, quietly
        tmp = "/tmp"
    return Path(tmp) / f"minitfm-{os.geteuid()}"


def writable(folder: str) -> bool:
    """True when `folder` is an absolute path to a folder this process may create files in."""
    return os.path.isabs(folder) and os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)


def python_warning(text: str) -> None:
    """The default `warn` of a library caller: a Python warning."""
    warnings.warn(text, RuntimeWarning, stacklevel=2)


def env_threads() -> int | None:
    """OMP_NUM_THREADS when set to a positive integer, else None."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isascii() and value.isdigit() and int(value) >= 1 else None


def distrust(info: os.stat_result) -> tuple[str, str] | None:
    """Why a registry folder with this `lstat` must not be used, and the fix; None: it may."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link", "remove the link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder", "remove it"
    if info.st_uid != os.geteuid():
        return (f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})",
                f"have it removed, or set {REGISTRY_ENV} to a folder of yours")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})",
                "make it yours alone with chmod 700")
    return None


class Registry:
    """An open registry folder, checked to be this user's alone; entries are reached through it.

    Holding the folder open (not its path) means that whatever is renamed or linked on the way
    afterwards, every entry read, created or removed is one in this very folder.
    """

    def __init__(self, path: Path, fd: int, warn: Warn):
        self.path, self.fd, self.warn = path, fd, warn

    @classmethod
    def open(cls, path: Path, warn: Warn, create: bool = True) -> Registry | None:
        """The folder at `path` (made 0700 first when `create`), or None: it cannot be made or
        opened (quietly, as torch would run), or it is not safe to use (after a warning)."""
        fd = None
        try:
            if create:
                make_folder(path)
            fd = os.open(path, FOLDER_FLAGS)  # never through a link in place of the folder
        except OSError:
            pass
        try:
            problem = distrust(os.fstat(fd) if fd is not None else os.lstat(path))
        except OSError:  # not there: nobody registered
            return None
        if problem is None and fd is not None:
            return cls(path, fd, warn)
        if fd is not None:
            os.close(fd)
        if problem is not None:
            reason, fix = problem
            warn(f"thread registry {quote(str(path), PATH_CHARS)} {reason}: {UNUSED}; {fix}")
        return None

    def close(self) -> None:
        """Let go of the folder."""
        os.close(self.fd)

    def neighbours(self, own_pid: int) -> dict[int, str | int]:
        """The settings (`auto` or a count) of the other live processes, by pid; stale files
        are removed."""
        found = {}
        try:
            names = os.listdir(self.fd)
        except OSError:  # the folder was removed meanwhile: nobody left to count
            return found
        for name in names:
            if name.isdigit() and name != str(own_pid):
                setting = self.read_if_alive(name)
                if setting is not None:
                    found[int(name)] = setting
        return found

    def read_if_alive(self, name: str) -> str | int | None:
        """A registered setting, or None (removing the file) when its process has gone."""
        try:
            info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):  # no minitfm wrote it: never open it
                self.warn(f"thread registry entry {quote(str(self.path / name), PATH_CHARS)} is "
                          f"{kind(info.st_mode)}, not a file minitfm wrote: skipped; remove it")
                return None
            with open(os.open(name, READ_FLAGS, dir_fd=self.fd), "rb") as f:
                opened = os.fstat(f.fileno())
                if opened.st_ino != info.st_ino:  # replaced since: read it next time
                    return None
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # held: its process lives
                    return parse_threads(f.read(ENTRY_BYTES).decode().strip() or "auto")
                if os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_ino == opened.st_ino:
                    os.unlink(name, dir_fd=self.fd)  # not replaced meanwhile: stale
        except (OSError, ValueError):  # vanished, or unreadable: not ours to count
            pass
        return None

    def join(self, pid: int) -> IO[str]:
        """A new entry for `pid`, locked and opened for writing its setting."""
        # Created and locked under a hidden name, then renamed: a visible entry is always locked.
        # O_EXCL|O_NOFOLLOW: the file is one this process makes, never one found in place.
        hidden = f".{pid}.tmp"
        try:
            fd = os.open(hidden, NEW_FILE_FLAGS, 0o600, dir_fd=self.fd)
        except FileExistsError:  # left by a killed process that had this pid: only a name
            os.unlink(hidden, dir_fd=self.fd)
            fd = os.open(hidden, NEW_FILE_FLAGS, 0o600, dir_fd=self.fd)
        file = open(fd, "w")
        try:
            fcntl.flock(file, fcntl.LOCK_EX)
            os.replace(hidden, str(pid), src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError:
            file.close()
            raise
        return file

    def leave(self, pid: int) -> None:
        """Remove the entry of `pid` (this process's own)."""
        try:
            os.unlink(str(pid), dir_fd=self.fd)
        except FileNotFoundError:
            pass


def make_folder(path: Path) -> None:
    """Create `path` and its parent (0700) when missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:  # made before, or planted: checked once opened
        pass


def share(setting: str | int, others: Callable[[], dict[int, str | int]],
          busy: Callable[[list[int]], int] = lambda pids: 0) -> int:
    """The thread count for `setting`. For `auto`, `others()` gives the settings of the other
    live minitfm processes by pid, and `busy(their pids)` the cores that programs other than
    minitfm's keep busy (`cpuload.CpuLoad.others`)."""
    if setting != "auto":
        return int(setting)
    fixed = env_threads()
    if fixed is not None:
        return fixed
    found = others()
    taken = sum(s for s in found.values() if s != "auto")
    sharing = 1 + sum(1 for s in found.values() if s == "auto")
    return max(1, (cores() - busy(list(found)) - taken) // sharing)


def resolve(setting: str | int, registry: Path | None = None, own_pid: int | None = None,
            warn: Warn = python_warning) -> int:
    """The thread count for `setting` given the processes registered in `registry` (default:
    this user's), which is read, not joined, and the cores other programs keep busy (looked
    at over MIN_WINDOW_S)."""
    own_pid = own_pid or os.getpid()

    def others() -> dict[int, str | int]:
        folder = Registry.open(registry or registry_dir(), warn, create=False)
        if folder is None:
            return {}
        try:
            return folder.neighbours(own_pid)
        finally:
            folder.close()

    load = CpuLoad(cpus())
    return share(setting, others, lambda pids: load.others([own_pid, *pids]))


class ThreadClaim:
    """This process's registry entry, locked from `__enter__` to `__exit__` (or its death).

    `warn` hears, once, why the registry is not used (or an entry skipped): the CLI prints it
    as a `warning:` line; a library caller gets a Python warning.
    """

    def __init__(self, setting: str | int = "auto", registry: Path | None = None,
                 warn: Warn = python_warning):
        self.setting = parse_threads(setting)
        self.registry = registry or registry_dir()
        self.folder: Registry | None = None
        self.file: IO[str] | None = None
        self.threads = 0  # what `apply` last gave torch
        self.busy = 0  # cores that other programs kept busy, at the last look (`auto` only)
        self.load = CpuLoad(cpus())
        self._warn, self.warned = warn, False

    @property
    def path(self) -> Path:
        return self.registry / str(os.getpid())

    def warn(self, text: str) -> None:
        """Pass the first warning on; the others would only repeat it."""
        if not self.warned:
            self.warned = True
            self._warn(text)

    def __enter__(self) -> ThreadClaim:
        self.folder = Registry.open(self.registry, self.warn)
        if self.folder is not None:
            try:
                self.file = self.folder.join(os.getpid())
                self._write()
            except OSError:  # a full disk, say: unregistered, as torch would run, yet seeing others
                self._unregister()
        # other programs' load is measured from here: `train` registers before torch loads
        self.load.start([os.getpid(), *(self.folder.neighbours(os.getpid()) if self.folder
                                         else ())])
        return self

    def __exit__(self, *exc) -> None:
        self._unregister()
        if self.folder is not None:
            self.folder.close()
            self.folder = None

    def _unregister(self) -> None:
        if self.file is not None:
            self.folder.leave(os.getpid())
            self.file.close()
            self.file = None

    def _write(self) -> None:
        env = env_threads() if self.setting == "auto" else None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(str(env or self.setting))  # under OMP_NUM_THREADS a fixed count
        self.file.flush()

    def update(self, setting: str | int) -> None:
        """Change the registered setting (e.g. once a resumed run's config is known)."""
        self.setting = parse_threads(setting)
        if self.file is not None:
            self._write()

    def resolve(self) -> int:
        """This process's thread count now (as if alone among minitfm's processes when the
        registry is not used), seeing the cores other programs kept busy since the last look."""
        folder, self.busy = self.folder, 0

        def busy(pids: list[int]) -> int:
            self.busy = self.load.others([os.getpid(), *pids])
            return self.busy

        return share(self.setting, lambda: folder.neighbours(os.getpid()) if folder else {},
                     busy)

    def apply(self) -> bool:
        """Give torch the resolved count; True when it changed."""
        import torch

        threads = self.resolve()
        changed = threads != self.threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.threads = threads
        return changed

    def describe(self) -> str:
        """E.g. `2 threads (auto)`, `1 thread (auto; other programs keep 1 of 2 cores busy)`."""
        unit = "thread" if self.threads == 1 else "threads"
        busy = f"; other programs keep {self.busy} of {cores()} cores busy" if self.busy else ""
        return f"{self.threads} {unit} ({self.setting}{busy})"


class ThreadPacer:
    """Re-applies a claim about once a second; cheap enough to call after every step."""

    def __init__(self, claim: ThreadClaim, every_s: float = RECHECK_S):
        self.claim, self.every_s = claim, every_s
        self.next = time.monotonic() + every_s

    def tick(self) -> bool:
        """True when the thread count just changed."""
        now = time.monotonic()
        if now < self.next or self.claim.setting != "auto":
            return False
        self.next = now + self.every_s
        return self.claim.apply()
