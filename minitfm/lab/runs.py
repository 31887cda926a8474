"""`minitfm runs`: a table of the run directories under a folder, each with how it ended.

How a run ended (`summary.json`, its lock) is read by `minitfm.run.rundir`. No torch here:
listing runs is instant.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from minitfm.config import Config, flatten
from minitfm.errors import MinitfmError
from minitfm.run.rundir import has_config_yaml, read_summary, run_status

SWEEP_FILE = "sweep.json"  # marks a sweep folder (see minitfm.lab.sweep)
HIDDEN_KEYS = ("name", "log.dir", "threads")  # where a run went and how fast, not what it is


def find_runs(root: Path) -> list[Path]:
    """Run directories: `root` itself, its children, and the runs of sweep folders in it."""
    if not root.is_dir():
        raise MinitfmError(f"runs folder '{root}' not found: give a folder of run directories "
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
