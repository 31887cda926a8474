"""`minitfm runs`: a table of the run directories under a folder, each with how it ended.

How a run ended (`summary.json`, its lock) is read by `minitfm.run.rundir`. A run can be
damaged by a hand edit, a copy from elsewhere or a bug: its files are read with caps and
checks, and a damaged one lists the run as `unreadable` with a note saying why, without
hiding the others. Runs are told apart by the config keys in which they differ
(`changed_keys`, and `short_label` for a legend). No torch here: listing runs is instant.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minitfm.config import Config, flatten
from minitfm.errors import CheckpointError, MinitfmError
from minitfm.run.rundir import (
    UNREADABLE,
    has_config_yaml,
    load_summary,
    read_run_config,
    run_status,
)

SWEEP_FILE = "sweep.json"  # marks a sweep folder (see minitfm.lab.sweep)
HIDDEN_KEYS = ("name", "log.dir", "threads")  # where a run went and how fast, not what it is
MAX_LINE = 65_536  # characters of one metrics.jsonl line; a record is about 200
NUMBERS = {"train": ("loss",), "eval": ("loss", "exact_match")}  # what plot and runs read


def find_runs(root: Path) -> list[Path]:
    """Run directories: `root` itself, its children, and the runs of sweep folders in it."""
    if not root.is_dir():
        found = "is not a folder" if root.exists() else "not found"
        raise MinitfmError(f"runs folder '{root}' {found}: give a folder of run directories "
                           f"(default ./runs) or a sweep folder")
    if has_config_yaml(root):
        return [root]
    found = []
    for child in sorted(root.iterdir()):
        if has_config_yaml(child):
            found.append(child)
        elif (child / SWEEP_FILE).is_file():
            found.extend(run for run in sorted(child.iterdir()) if has_config_yaml(run))
    return found


def changed_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a saved config that differ from the defaults (name, log.dir and threads
    left out)."""
    defaults = flatten(Config().model_dump())
    return {key: value for key, value in flatten(config).items()
            if key not in HIDDEN_KEYS and defaults.get(key) != value}


def short_names(keys: list[str]) -> dict[str, str]:
    """`model.positional` -> `positional`, unless two keys would share a name."""
    last = [key.rpartition(".")[2] for key in keys]
    return {key: name if last.count(name) == 1 else key for key, name in zip(keys, last)}


def short_label(configuration: str) -> str:
    """`task.name=copy, model.positional=rope` -> `name=copy, positional=rope`."""
    pairs = [part.partition("=")[::2] for part in configuration.split(", ")]
    names = short_names([key for key, _ in pairs])
    return ", ".join(f"{names[key]}={value}" for key, value in pairs)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of `metrics.jsonl` (none if it is missing); other lines are skipped."""
    return scan_metrics(run_dir)[0]


def scan_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of `metrics.jsonl`, and the numbers of the lines that hold none (a torn
    last line, left by a killed run, is skipped without a word)."""
    records, bad = [], []
    path = run_dir / "metrics.jsonl"
    if not path.is_file():  # a FIFO would block the read
        return records, bad
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, (line, whole) in enumerate(capped_lines(f), 1):
                record = parse_record(line)
                if record is not None:
                    records.append(record)
                elif whole:
                    bad.append(number)
    except OSError:
        pass
    return records, bad


def capped_lines(f) -> Iterator[tuple[str, bool]]:
    """Each line of `f` cut to MAX_LINE characters (a huge line costs no memory), and whether
    it ended with a newline (the last line of a killed run may not)."""
    while line := f.readline(MAX_LINE):
        head = line
        while line and not line.endswith("\n"):  # the rest of a long line: skipped
            line = f.readline(MAX_LINE)
        yield head, line.endswith("\n")


def parse_record(line: str) -> dict[str, Any] | None:
    """A metrics line as minitfm writes it: an object with an integer `step`, a `split`
    (train, eval) and numbers where `plot` and `runs` read them; else None."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than json can read
        return None
    if not isinstance(record, dict) or record.get("split") not in NUMBERS:
        return None
    numbers = all(is_number(record.get(key)) for key in NUMBERS[record["split"]])
    elapsed = is_number(record.get("elapsed_s", 0.0))
    step = isinstance(record.get("step"), int) and not isinstance(record["step"], bool)
    return record if numbers and elapsed and step else None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def skipped(bad: list[int]) -> str:
    """`metrics.jsonl line 7 holds no record minitfm writes`, or `lines 7, 9, 12 hold`."""
    if len(bad) == 1:
        return f"metrics.jsonl line {bad[0]} holds no record minitfm writes"
    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    return f"metrics.jsonl lines {shown} ({len(bad)}) hold no record minitfm writes"


def describe_run(run_dir: Path, root: Path) -> dict[str, Any]:
    """One row of `minitfm runs`: from summary.json, else from metrics.jsonl. A damaged
    summary.json or config.yaml makes the run `unreadable`; `note` says why, and which lines
    of metrics.jsonl were skipped."""
    notes: list[str] = []
    config, summary = readable(read_run_config, run_dir, notes), \
        readable(load_summary, run_dir, notes)
    damaged = bool(notes)
    metrics, bad = scan_metrics(run_dir)
    if bad:
        notes.append(f"{skipped(bad)}: skipped")
    evals = [r["exact_match"] for r in metrics if r["split"] == "eval"]
    latest = run_dir / "metrics.jsonl" if metrics else run_dir / "config.yaml"
    return {
        "name": str(run_dir.relative_to(root)) if run_dir != root else run_dir.name,
        "run_dir": str(run_dir),
        "task": config.get("task", {}).get("name", "reverse") if config else None,
        "changes": changed_keys(config),
        "step": summary.get("step", metrics[-1]["step"] if metrics else 0),
        "best_exact_match": max(evals) if evals else None,
        "wall_s": summary.get("wall_s", metrics[-1].get("elapsed_s") if metrics else None),
        "status": UNREADABLE if damaged else run_status(run_dir),
        "updated": updated(latest),
        **({"note": "; ".join(notes)} if notes else {}),
    }


def readable(read, run_dir: Path, notes: list[str]) -> dict[str, Any]:
    """`read(run_dir)` ({} when the file is missing); damaged, {} and the reason in `notes`."""
    try:
        return read(run_dir) or {}
    except CheckpointError as err:
        notes.append(str(err))
        return {}


def updated(path: Path) -> str:
    """When `path` last changed, local time (empty when it cannot be read)."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(path.stat().st_mtime))
    except OSError:
        return ""


def list_runs(root: Path) -> list[dict[str, Any]]:
    """Every run under `root`, oldest activity first."""
    rows = [describe_run(run, root) for run in find_runs(root)]
    return sorted(rows, key=lambda row: row["updated"])
