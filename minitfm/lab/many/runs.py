"""`minitfm runs`: a table of the run directories under a folder, each with how it ended.

How a run ended (`summary.json`, its lock) is read by `minitfm.run.rundir`, its metrics by
`lab/curves.py`; a run its search pruned is `pruned` (`search_status`). A run can be damaged
by a hand edit, a copy from elsewhere or a bug: its files are read with caps and checks, and a
damaged one lists the run as `unreadable` with a note saying why, without hiding the others.
Runs are told apart by the config keys in which they differ (`changed_keys`, and `short_label`
for a legend). No torch here: listing runs is instant.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

from minitfm.config import Config, flatten
from minitfm.errors import CheckpointError, MinitfmError
from minitfm.lab.curves import scan_metrics, skipped
from minitfm.run.rundir import has_config_yaml, open_run_file
from minitfm.run.summary import UNREADABLE, load_summary, read_run_config, run_status

SWEEP_FILE = "sweep.json"  # marks a sweep folder (see minitfm.lab.many.sweep)
TRIALS_FILE = "trials.jsonl"  # a search's: a line per trial (see minitfm.lab.many.trials)
PRUNED = "pruned"  # the status of a run its search stopped (`search_status`)
MAX_TRIALS_BYTES = 20_000_000  # a trials.jsonl: about 400 bytes a trial
# where a run went, how fast, and where it is watched: not what it is
HIDDEN_KEYS = ("name", "log.dir", "threads", "log.mlflow")
NOTHING_READ = {"task": None, "changes": {}, "seed": None, "step": 0, "best_exact_match": None,
                "wall_s": None, "status": UNREADABLE, "updated": ""}  # a run that cannot be read


def read_record(folder: Path) -> dict[str, Any] | None:
    """A sweep folder's `sweep.json` ({"grid": ..., "base": ...}), None if none is readable."""
    try:
        with open_run_file(folder / SWEEP_FILE, "r") as f:
            record = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and "grid" in record else None


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
    """The keys of a saved config that differ from the defaults (`HIDDEN_KEYS` left out)."""
    defaults = flatten(Config().model_dump())
    return {key: value for key, value in flatten(config).items()
            if key not in HIDDEN_KEYS and defaults.get(key) != value}


def short_names(keys: list[str]) -> dict[str, str]:
    """`model.positional` -> `positional` (`task.name` -> `task`), unless two keys would share
    a name."""
    last = ["task" if key == "task.name" else key.rpartition(".")[2] for key in keys]
    return {key: name if last.count(name) == 1 else key for key, name in zip(keys, last)}


def short_label(configuration: str) -> str:
    """`task.name=copy, model.positional=rope` -> `task=copy, positional=rope`."""
    pairs = [part.partition("=")[::2] for part in configuration.split(", ")]
    names = short_names([key for key, _ in pairs])
    return ", ".join(f"{names[key]}={value}" for key, value in pairs)


def describe_run(run_dir: Path, root: Path) -> dict[str, Any]:
    """One row of `minitfm runs`: from summary.json, else from metrics.jsonl. A damaged
    summary.json or config.yaml, or a folder that cannot be read, makes the run `unreadable`;
    `note` says why, and which lines of metrics.jsonl were skipped."""
    name = str(run_dir.relative_to(root)) if run_dir != root else run_dir.name
    notes: list[str] = []
    readable(check_folder, run_dir, notes)
    if notes:  # nothing in it can be read
        return {"name": name, "run_dir": str(run_dir), **NOTHING_READ, "note": notes[0]}
    config, summary = readable(read_run_config, run_dir, notes), \
        readable(load_summary, run_dir, notes)
    damaged = bool(notes)
    try:
        metrics, bad = scan_metrics(run_dir)
    except CheckpointError as err:  # a FIFO, no permission: the summary says the rest
        metrics, bad = [], []
        notes.append(str(err))
    if bad:
        notes.append(f"{skipped(bad)}: skipped")
    evals = [r["exact_match"] for r in metrics if r["split"] == "eval"]
    latest = run_dir / "metrics.jsonl" if metrics else run_dir / "config.yaml"
    return {
        "name": name,
        "run_dir": str(run_dir),
        "task": config.get("task", {}).get("name", "reverse") if config else None,
        "changes": changed_keys(config),
        "seed": config.get("seed", Config.model_fields["seed"].default) if config else None,
        "step": summary.get("step", metrics[-1]["step"] if metrics else 0),
        "best_exact_match": max(evals) if evals else None,
        "wall_s": summary.get("wall_s", metrics[-1].get("elapsed_s") if metrics else None),
        "status": UNREADABLE if damaged else search_status(run_dir, run_status(run_dir)),
        "updated": updated(latest),
        **({"note": "; ".join(notes)} if notes else {}),
    }


def check_folder(run_dir: Path) -> None:
    """A run directory that can be looked into (another user's private one cannot)."""
    try:
        os.scandir(run_dir).close()
    except OSError as err:
        raise CheckpointError(f"cannot read the run directory ({err.strerror})") from None


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


def list_runs(root: Path, describe=describe_run) -> list[dict[str, Any]]:
    """Every run under `root` as `describe(run_dir, root)` gives it (a row with `run_dir`,
    `status`, `seed` and `updated`), oldest activity first; the runs of a sweep together
    (where its latest activity falls), in order of seed, then of name, however they
    finished."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in find_runs(root):
        groups.setdefault(str(sweep_of(run) or run), []).append(describe(run, root))
    ordered = sorted(groups.values(), key=lambda rows: max(row["updated"] for row in rows))
    return [row for rows in ordered for row in sorted(rows, key=seed_then_name)]


def sweep_of(run_dir: Path) -> Path | None:
    """The sweep folder that holds the run, None for a run of its own."""
    return run_dir.parent if (run_dir.parent / SWEEP_FILE).is_file() else None


def search_status(run_dir: Path, status: str) -> str:
    """A run's `status` as `minitfm runs` says it: `pruned` for a run its search stopped. Its own
    summary.json says `interrupted`, as after Ctrl-C (it can be resumed to its end by hand, and
    then says how it ended); the search's trials.jsonl names the runs of its pruned trials."""
    sweep = sweep_of(run_dir) if status == "interrupted" else None
    if sweep is None or not (sweep / TRIALS_FILE).is_file():
        return status
    stamp = (sweep / TRIALS_FILE).stat()
    return PRUNED if run_dir.name in pruned_runs(sweep / TRIALS_FILE, stamp.st_mtime_ns,
                                                 stamp.st_size) else status


@functools.lru_cache(maxsize=16)
def pruned_runs(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    """The runs of the pruned trials in a search's trials.jsonl (read once per version of the
    file: `runs` asks for every run of the search). A line that is not a trial's is skipped; a
    file that is no regular one, or too large for a search's (MAX_TRIALS_BYTES), names none."""
    names: set[str] = set()
    if size > MAX_TRIALS_BYTES:
        return frozenset()
    try:
        with open_run_file(path, "r", errors="replace") as file:
            lines = file.read(MAX_TRIALS_BYTES).splitlines()
    except (OSError, MinitfmError):
        return frozenset()
    for line in lines:
        try:
            trial = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(trial, dict) and trial.get("state") == PRUNED \
                and isinstance(trial.get("runs"), list):
            names.update(name for name in trial["runs"] if isinstance(name, str))
    return frozenset(names)


def seed_then_name(row: dict[str, Any]) -> tuple:
    """A row's place among its sweep's: its seed (an unreadable run's is not known: after the
    others), then its name (its folder's)."""
    seed = None if row["status"] == UNREADABLE else row.get("seed")
    return (seed is None, seed if isinstance(seed, int) else 0, row["run_dir"])
