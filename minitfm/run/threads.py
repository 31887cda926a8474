"""How many CPU threads torch may use, so that several minitfm processes never oversubscribe.

OpenMP threads spin while they wait for each other: two processes of 2 threads each on 2 cores
ran ~100x slower than one (measured: ~250 tok/s instead of 29,000). So every minitfm process
that computes registers itself in a per-user folder (`<tmp>/minitfm-<uid>/procs/<pid>`, holding
`auto` or its fixed thread count) and keeps the file `flock`ed while it lives; the kernel drops
the lock when the process dies, even by SIGKILL, and whoever finds an unlocked file removes it.

`auto` resolves to `OMP_NUM_THREADS` when that is set (torchrun sets 1 per worker), else to
(cores - the fixed counts of the others) // (the processes on `auto`, this one included), at
least 1. Training re-reads the registry about once a second: a run alone on 2 cores uses 2
threads, drops to 1 when a second run starts and goes back to 2 when it ends.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

from minitfm.config import parse_threads

REGISTRY_ENV = "MINITFM_REGISTRY"  # another registry folder (tests)
RECHECK_S = 1.0  # how often a training run looks at its neighbours again


def cores() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0))


def registry_dir() -> Path:
    """The per-user folder of running minitfm processes."""
    if os.environ.get(REGISTRY_ENV):
        return Path(os.environ[REGISTRY_ENV])
    return Path(tempfile.gettempdir()) / f"minitfm-{os.getuid()}" / "procs"


def env_threads() -> int | None:
    """OMP_NUM_THREADS when set to a positive integer, else None."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def neighbours(registry: Path, own_pid: int) -> list[str | int]:
    """The settings (`auto` or a count) of the other live processes; stale files are removed."""
    found = []
    for path in registry.glob("[0-9]*"):
        if path.name == str(own_pid):
            continue
        setting = read_if_alive(path)
        if setting is not None:
            found.append(setting)
    return found


def read_if_alive(path: Path) -> str | int | None:
    """A registered setting, or None (removing the file) when its process has gone."""
    try:
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its process lives
                return parse_threads(f.read().strip() or "auto")
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:  # not replaced meanwhile
                path.unlink()
    except (OSError, ValueError):  # vanished, or unreadable: not ours to count
        pass
    return None


def resolve(setting: str | int, registry: Path | None = None, own_pid: int | None = None) -> int:
    """The thread count for `setting` given the other registered processes."""
    if setting != "auto":
        return int(setting)
    fixed = env_threads()
    if fixed is not None:
        return fixed
    others = neighbours(registry or registry_dir(), own_pid or os.getpid())
    taken = sum(s for s in others if s != "auto")
    sharing = 1 + sum(1 for s in others if s == "auto")
    return max(1, (cores() - taken) // sharing)


class ThreadClaim:
    """This process's registry entry, locked from `__enter__` to `__exit__` (or its death)."""

    def __init__(self, setting: str | int = "auto", registry: Path | None = None):
        self.setting = parse_threads(setting)
        self.registry = registry or registry_dir()
        self.file = None
        self.threads = 0  # what `apply` last gave torch

    @property
    def path(self) -> Path:
        return self.registry / str(os.getpid())

    def __enter__(self) -> ThreadClaim:
        try:
            self.registry.mkdir(parents=True, exist_ok=True)
            # Locked under a hidden name, then renamed: a visible entry is always locked.
            tmp = self.registry / f".{os.getpid()}.tmp"
            self.file = open(tmp, "w")
            fcntl.flock(self.file, fcntl.LOCK_EX)
            self._write()
            os.replace(tmp, self.path)
        except OSError:  # no writable temp folder: run unregistered, as torch would
            self.file = None
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.path.unlink(missing_ok=True)
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
        """This process's thread count now."""
        return resolve(self.setting, self.registry)

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
        """E.g. `2 threads (auto)`."""
        unit = "thread" if self.threads == 1 else "threads"
        return f"{self.threads} {unit} ({self.setting})"


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
