"""How a run ended, and what its folder says of it: `summary.json`, the run's status, and its
config.yaml read back as plain data.

Whenever training stops, `summary.json` records `status` (finished, stopped at target,
interrupted, paused or failed), `step`, `steps`, `best_exact_match`, `wall_s` (summed over
resumes) and `ended`. A run without one is `running` while a process holds its `.lock`, else it
was killed: `interrupted` when it has `checkpoints/last.pt` (`--resume` continues it), `failed`
when not. A hand-edited or copied run can hold anything: its summary.json and config.yaml are
read with caps and checks, and a damaged one is a `CheckpointError` saying which file and why
(`minitfm runs` lists the run as `unreadable`). No torch here: listing runs is instant.
"""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path
from typing import Any

import yaml

from minitfm.errors import CheckpointError, quote
from minitfm.run.files import to_json, write_atomic
from minitfm.run.rundir import open_run_file, unreadable
from minitfm.yamlfile import MAX_CONFIG_BYTES, error_line, load_yaml

SUMMARY = "summary.json"
DONE = ("finished", "stopped at target")
STATUSES = (*DONE, "interrupted", "paused", "failed")  # what summary.json may say
UNREADABLE = "unreadable"  # a run whose summary.json or config.yaml is damaged
MAX_SUMMARY_BYTES = 1_000_000  # a summary is a few hundred bytes
SECTIONS = ("task", "model", "train", "log")  # config.yaml's mappings of keys


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
    is (`yamlfile.load_yaml`: capped size, aliases bounded; parsed by libyaml where there is
    one, as listings read hundreds): a mapping of sections."""
    text = read_small(Path(run_dir) / "config.yaml", MAX_CONFIG_BYTES)
    if text is None:
        return None
    try:
        data = load_yaml(text, fast=True)
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
    Anything else is a CheckpointError: a link or a FIFO (see `rundir.open_run_file`), a folder,
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
