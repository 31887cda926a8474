"""Run folders written by hand, as training and a sweep's jobs leave them (config.yaml,
summary.json, metrics.jsonl, eval-1-6.json): runs to list and query with nothing trained."""

import json
import os
from pathlib import Path

from minitfm.config import load_config, to_yaml
from tests.helpers import TINY

BUDGET = 200
TARGET = 0.99


def fake_run(run_dir: Path, overrides: list[str], steps: int | None, exact: float,
             when: float = 1e9) -> Path:
    """A run that ended: `steps` None finished the budget short of the target, else stopped at
    it. Gauges every 50 steps (align = step / 1000), an evaluation of lengths 1..6."""
    run_dir.mkdir(parents=True)
    cfg = load_config(None, [*TINY, f"train.steps={BUDGET}",
                             f"train.target_exact_match={TARGET}", *overrides])
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    last = steps or BUDGET
    lines = [{"step": s, "split": "gauges", "exact": exact, "loss": 0.1, "token_accuracy": 0.9,
              "align": s / 1000, "positions": [0.5, 0.5]} for s in range(50, last + 1, 50)]
    lines.append({"step": last, "split": "eval", "loss": 0.1, "exact_match": exact})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {"status": "finished" if steps is None else "stopped at target", "step": last,
               "steps": BUDGET, "wall_s": last / 10, "exact_match": exact,
               "best_exact_match": exact if steps is None else 0.995}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    per_length = {str(n): {"count": 10, "exact_match": exact - n / 100} for n in range(1, 7)}
    (run_dir / "eval-1-6.json").write_text(json.dumps({"exact_match": exact, "samples": 60,
                                                       "per_length": per_length}))
    for path in run_dir.iterdir():
        os.utime(path, (when, when))
    return run_dir


def fake_sweep(folder: Path, runs: dict[str, list[str]], when: float = 2e9) -> Path:
    """A sweep folder (sweep.json) of runs named by their overrides."""
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"grid": {}}))
    for i, (name, overrides) in enumerate(runs.items()):
        fake_run(folder / name, overrides, 100 + i, 0.995, when - i)  # the last ends first
    return folder
