"""Run directories: where a run goes, how it is told apart, locked, prepared, and how it ended
(what a RUN argument means is `argument.py`'s).

A run directory `runs/<name>-<YYYYmmdd-HHMMSS>/` holds `config.yaml` (resolved),
`metrics.jsonl`, `checkpoints/last.pt`, `checkpoints/best.pt`, TensorBoard event files and,
whenever training stops, `summary.json`: `status` (finished, stopped at target, interrupted,
paused or failed), `step`, `steps`, `best_exact_match`, `wall_s` (summed over resumes) and
`ended`. A run without one is `running` while a process holds its `.lock`, else it was killed:
`interrupted` when it has `checkpoints/last.pt` (`--resume` continues it), `failed` when not.
A hand-edited or copied run can hold anything: its files are read with caps and checks, and a
damaged one is a `CheckpointError` saying which file and why (`minitfm runs` lists the run as
`unreadable`). Every file is opened by `files.open_run_file`: never through a link, only a
regular file. No torch here: listing runs is instant.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from minitfm.config import Config, to_yaml
from minitfm.errors import CheckpointError, MinitfmError, RunFailed, option, quote
from minitfm.run.files import (
    check_writable,
    drop_records_after,
    make_dirs,
    open_run_file,
    remove_files,
    to_json,
    unreadable,
    write_atomic,
)
from minitfm.yamlfile import MAX_CONFIG_BYTES, error_line, load_yaml

CHECKPOINTS = ("best", "last")
SUMMARY = "summary.json"
DONE = ("finished", "stopped at target")
STATUSES = (*DONE, "interrupted", "paused", "failed")  # what summary.json may say
UNREADABLE = "unreadable"  # a run whose summary.json or config.yaml is damaged
MAX_SUMMARY_BYTES = 1_000_000  # a summary is a few hundred bytes
# What training writes where it is (locked, appended to); every other file is replaced whole.
IN_PLACE = (".lock", "metrics.jsonl", "attention.jsonl")
RECORDS = ("metrics.jsonl", "attention.jsonl")  # of those, a record per line, step first
SECTIONS = ("task", "model", "train", "log")  # config.yaml's mappings of keys


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
# files; the pictures of visualize-attention (`visualize.default_png`, `timeline.over_training`),
# ablate, explain (its JSON too: a page must not embed another model's role cards), patch and
# plot; explore's page; a sweep's eval-<lo>-<hi>.json; temp files of writes cut short.
MADE_FILES = {
    ".": r"metrics\.jsonl|attention\.jsonl|summary\.json|plot\.png|explorer\.html"
         r"|eval-\d+-\d+\.json|events\.out\.tfevents\..+",
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
    followed (see `files.remove_files`)."""
    for folder, names in MADE_FILES.items():
        where = run_dir / folder
        remove_files(where, f"{names}|{TEMP_FILE}")
        if folder in PICTURE_FOLDERS and not where.is_symlink() and where.is_dir() \
                and not any(where.iterdir()):
            where.rmdir()


def write_failure(err: OSError, run_dir: Path) -> str:
    """One line for a failed write (a full disk, say): what failed, and what is still safe."""
    where = err.filename or run_dir
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))
    kept = (f"; {', '.join(saved)} in {run_dir / 'checkpoints'} stay valid" if saved
            else "; no checkpoint was written yet")
    return f"cannot write to '{where}' ({err.strerror or err}){kept}"


# --- how it ended ---

def write_summary(run_dir: Path, summary: dict[str, Any]) -> float:
    """Write `summary.json` atomically; `wall_s` adds up over resumes. Returns that total."""
    previous = read_summary(run_dir) or {}
    total = summary["wall_s"] + previous.get("wall_s", 0.0)
    record = {**summary, "wall_s": total, "ended": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_atomic(run_dir / SUMMARY, (to_json(record, indent=1) + "\n").encode("utf-8"))
    return total


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's `summary.json`, or None when it has none (or a damaged one)."""
    try:
        return load_summary(run_dir)
    except CheckpointError:
        return None


def load_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's `summary.json` (None when it has none), checked as minitfm writes it: an
    object whose `status` is one of STATUSES, its numbers (`SUMMARY_NUMBERS`) of their kind
    and range: no NaN, infinity or 400-digit step."""
    text = read_small(Path(run_dir) / SUMMARY, MAX_SUMMARY_BYTES)
    if text is None:
        return None
    try:
        summary = json.loads(text)
    except RecursionError:  # json nests recursively: "[[[[...]]]]"
        raise CheckpointError(f"{SUMMARY} is nested too deeply") from None
    except ValueError as err:
        raise CheckpointError(f"{SUMMARY} is not valid JSON ({err})") from None
    if not isinstance(summary, dict):
        raise CheckpointError(f"{SUMMARY} holds a {type(summary).__name__}, not the object "
                              f"minitfm writes")
    if summary.get("status") not in STATUSES:  # a list in it is no status either
        found = quote(summary["status"]) if "status" in summary else "missing"
        raise CheckpointError(f"{SUMMARY} has no status minitfm writes ({found}; one of "
                              f"{', '.join(STATUSES)})")
    for key, (kind, low, high) in SUMMARY_NUMBERS.items():  # NaN, Infinity, 1e308, a step
        value = summary.get(key)  # of 400 digits: JSON reads them, the maths cannot
        if key not in summary or (value is None and key not in ("step", "wall_s")):
            continue
        # NaN and the infinities fail the comparison (math.isfinite overflows on a long int)
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
            number = "an integer" if kind is int else "a number"
            raise CheckpointError(f"{SUMMARY}: {key} ({quote(value)}) is not {number} from "
                                  f"{low:,} to {high:,}")
    return summary


# summary.json's numbers as training writes them (kind, lowest, highest): what `runs`, `sweep`
# and `compare` compute with. A step at most train.steps' bound; 10**9 s is 31 years.
SUMMARY_NUMBERS = {"step": (int, 0, 10**9), "steps": (int, 1, 10**9),
                   "wall_s": ((int, float), 0, 10**9),
                   "best_exact_match": ((int, float), -1, 1),  # -1: not evaluated yet
                   "exact_match": ((int, float), 0, 1), "token_accuracy": ((int, float), 0, 1)}


def read_run_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's `config.yaml` as plain data (None when it has none), read as a user's config
    is (`yamlfile.load_yaml`: capped size, aliases bounded): a mapping of sections."""
    text = read_small(Path(run_dir) / "config.yaml", MAX_CONFIG_BYTES)
    if text is None:
        return None
    try:
        data = load_yaml(text)
    except yaml.MarkedYAMLError as err:
        raise CheckpointError(f"config.yaml is not valid YAML at line {error_line(err)} "
                              f"({err.problem})") from None
    except yaml.YAMLError as err:
        raise CheckpointError(f"config.yaml is not valid YAML ({err})") from None
    except RecursionError:  # PyYAML builds nested collections recursively
        raise CheckpointError("config.yaml is nested too deeply") from None
    if not isinstance(data, dict):
        what = "nothing" if data is None else f"a {type(data).__name__}"
        raise CheckpointError(f"config.yaml holds {what}, not the mapping of sections minitfm "
                              f"writes")
    for section in SECTIONS:
        if not isinstance(data.get(section, {}), dict):
            raise CheckpointError(f"config.yaml: {section} ({quote(data[section])}) is not a "
                                  f"mapping of keys")
    if not isinstance(data.get("task", {}).get("name", ""), str):
        raise CheckpointError(f"config.yaml: task.name ({quote(data['task']['name'])}) is "
                              f"not a task's name")
    return data


def read_small(path: Path, limit: int) -> str | None:
    """The text of the regular file `path`, at most `limit` bytes (None when there is none).
    Anything else is a CheckpointError: a link or a FIFO (see `files.open_run_file`), a folder,
    a larger file, bytes that are not UTF-8."""
    try:
        with open_run_file(path) as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointError(unreadable(path.name, err)) from None
    if len(data) > limit:
        raise CheckpointError(f"{path.name} is larger than {limit:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path.name} is not UTF-8 text") from None


def is_locked(run_dir: Path) -> bool:
    """True while a training process holds the run's `.lock` (see `RunLock`)."""
    try:
        lock = open_run_file(Path(run_dir) / ".lock")
    except OSError:  # no lock file (never trained), or no file minitfm made
        return False
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released again by the close
        except BlockingIOError:
            return True
        except OSError:  # a lock file that cannot be locked is held by nobody
            pass
    return False


def run_status(run_dir: Path) -> str:
    """running, finished, stopped at target, interrupted, paused, failed, or unreadable (a
    damaged summary.json)."""
    run_dir = Path(run_dir)
    if is_locked(run_dir):
        return "running"
    try:
        summary = load_summary(run_dir)
    except CheckpointError:
        return UNREADABLE
    if summary is not None:
        return summary["status"]
    return "interrupted" if (run_dir / "checkpoints" / "last.pt").is_file() else "failed"
