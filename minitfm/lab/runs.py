"""How each run ended, and `minitfm runs`: a table of the run directories under a folder.

Training writes `summary.json` into its run directory whenever it stops: `status` (finished,
stopped at target, interrupted, paused or failed), `step`, `steps`, `best_exact_match`,
`wall_s` (summed over resumes) and `ended`. A run without one is `running` while a process
holds its `.lock`, else it was killed: `interrupted` when it has `checkpoints/last.pt`
(`--resume` continues it), `failed` when not. No torch here: listing runs is instant.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from minitfm.config import Config, flatten
from minitfm.errors import MinitfmError

SUMMARY = "summary.json"
SWEEP_FILE = "sweep.json"  # marks a sweep folder (see minitfm.lab.sweep)
DONE = ("finished", "stopped at target")
HIDDEN_KEYS = ("name", "log.dir", "threads")  # where a run went and how fast, not what it is


def write_summary(run_dir: Path, summary: dict[str, Any]) -> float:
    """Write `summary.json` atomically; `wall_s` adds up over resumes. Returns that total."""
    previous = read_summary(run_dir) or {}
    total = summary["wall_s"] + previous.get("wall_s", 0.0)
    record = {**summary, "wall_s": total, "ended": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = run_dir / f".{SUMMARY}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / SUMMARY)
    return total


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's `summary.json`, or None when it has none (or an unreadable one)."""
    try:
        return json.loads((Path(run_dir) / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_locked(run_dir: Path) -> bool:
    """True while a training process holds the run's `.lock` (see checkpoint.RunLock)."""
    try:
        with open(Path(run_dir) / ".lock") as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released again by the close
    except BlockingIOError:
        return True
    except OSError:  # no lock file: never trained
        pass
    return False


def run_status(run_dir: Path) -> str:
    """running, finished, stopped at target, interrupted, paused or failed."""
    run_dir = Path(run_dir)
    if is_locked(run_dir):
        return "running"
    summary = read_summary(run_dir)
    if summary is not None:
        return summary["status"]
    return "interrupted" if (run_dir / "checkpoints" / "last.pt").is_file() else "failed"


def is_run(path: Path) -> bool:
    return (path / "config.yaml").is_file()


def find_runs(root: Path) -> list[Path]:
    """Run directories: `root` itself, its children, and the runs of sweep folders in it."""
    if not root.is_dir():
        raise MinitfmError(f"runs folder '{root}' not found: give a folder of run directories "
                           f"(default ./runs) or a sweep folder")
    if is_run(root):
        return [root]
    found = []
    for child in sorted(root.iterdir()):
        if is_run(child):
            found.append(child)
        elif (child / SWEEP_FILE).is_file():
            found.extend(run for run in sorted(child.iterdir()) if is_run(run))
    return found


def changed_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a saved config that differ from the defaults (name, log.dir and threads
    left out)."""
    defaults = flatten(Config().model_dump())
    return {key: value for key, value in flatten(config).items()
            if key not in HIDDEN_KEYS and defaults.get(key) != value}


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of `metrics.jsonl` (none if it is missing); a torn last line is skipped."""
    records = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return records


def describe_run(run_dir: Path, root: Path) -> dict[str, Any]:
    """One row of `minitfm runs`: from summary.json, else from metrics.jsonl."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    summary = read_summary(run_dir) or {}
    metrics = read_metrics(run_dir)
    evals = [r["exact_match"] for r in metrics if r.get("split") == "eval"]
    latest = run_dir / "metrics.jsonl" if metrics else run_dir / "config.yaml"
    return {
        "name": str(run_dir.relative_to(root)) if run_dir != root else run_dir.name,
        "run_dir": str(run_dir),
        "task": config.get("task", {}).get("name", "reverse"),
        "changes": changed_keys(config),
        "step": summary.get("step", metrics[-1]["step"] if metrics else 0),
        "best_exact_match": max(evals) if evals else None,
        "wall_s": summary.get("wall_s", metrics[-1].get("elapsed_s") if metrics else None),
        "status": run_status(run_dir),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(latest.stat().st_mtime)),
    }


def list_runs(root: Path) -> list[dict[str, Any]]:
    """Every run under `root`, oldest activity first."""
    rows = [describe_run(run, root) for run in find_runs(root)]
    return sorted(rows, key=lambda row: row["updated"])
