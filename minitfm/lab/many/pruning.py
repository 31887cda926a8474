"""Stopping a search's trials that cannot win (`--prune`), from what their runs write as they
train: the gauges' readings in metrics.jsonl (`lab/watch/gauges.py`), each with its forecast.

- `median`: Optuna's MedianPruner. At each reading a trial reports its runs' mean exact match on
  the gauges' pairs (as a shortfall, 1 - exact, where the objective is minimized); it is stopped
  when that is worse than the median of the complete trials' at the same step.
- `forecast`: minitfm's forecast (`lab/watch/forecast.py`). A trial is stopped when the latest
  forecast of every one of its runs says `short` of the target (no line reaches it by the run's
  end, `no click by the run's end` included) with an end forecast at least PRUNE_MARGIN below
  the target. A run that reached the target is never short; one still in its warmup has no
  forecast yet.

Either way the trial's runs get SIGINT, as Ctrl-C: each saves its last.pt and stops (`minitfm
train --resume RUN` takes it to its end by hand), and the trial's row says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minitfm.lab.many.grid import RunSpec
from minitfm.lab.watch.forecast import CALIBRATED
from minitfm.run.summary import read_summary

# The end forecast at least this far below the target. None: the forecast's own "short"; a
# margin trades false prunes for compute (measured: docs/experiments.md, "Stopping the trials").
PRUNE_MARGIN = 0.0
MAX_READ = 50_000_000  # bytes read of one metrics.jsonl at a look


@dataclass
class Verdict:
    """Why a trial was stopped, and at which reading."""

    step: int
    words: str

    def row_text(self) -> str:
        return f"pruned at step {self.step}: {self.words}"


class Readings:
    """The gauges' readings of one run as its metrics.jsonl grows: step -> record."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        self.offset = 0
        self.by_step: dict[int, dict[str, Any]] = {}

    def read(self) -> None:
        """Take in the lines written since the last read (a file rewritten shorter, as a resume
        writes it, is read again from its start)."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:
                self.offset, self.by_step = 0, {}
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(size - self.offset, MAX_READ))
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("split") == "gauges" \
                    and isinstance(record.get("step"), int) \
                    and isinstance(record.get("exact"), (int, float)):
                self.by_step[record["step"]] = record

    def at(self, step: int) -> dict[str, Any] | None:
        """The latest reading at or before `step`."""
        steps = [s for s in self.by_step if s <= step]
        return self.by_step[max(steps)] if steps else None


class PruneWatch:
    """One trial's runs, watched for a reason to stop it (see the module's docstring)."""

    def __init__(self, search, specs: list[RunSpec], trial):
        self.prune, self.trial = search.prune, trial
        self.minimize = search.objective.target is not None
        self.target = search.objective.target
        self.specs = specs
        self.readings = [Readings(spec.run_dir) for spec in specs]
        self.last = 0  # the last step looked at

    def look(self) -> Verdict | None:
        """Read on; a Verdict when the trial should stop, else None."""
        ended = [ended_status(spec) for spec in self.specs]
        for readings in self.readings:
            readings.read()
        training = [r for r, status in zip(self.readings, ended, strict=True) if status is None]
        if not training:
            return None  # every run ended: nothing left to stop
        latest = [max(r.by_step, default=0) for r in training]
        reached = min(latest)
        steps = sorted(s for s in training[0].by_step if self.last < s <= reached)
        for step in steps:
            self.last = step
            records = [r.at(step) for r in self.readings]
            exacts = [rec["exact"] if rec else 0.0 for rec in records]
            value = sum(exacts) / len(exacts)
            self.trial.report(1 - value if self.minimize else value, step)
            if self.prune == "median" and self.trial.should_prune():
                return Verdict(step, f"below the median of the complete trials at this step "
                                     f"(gauges: {value:.1%} exact)")
            if self.prune == "forecast":
                verdict = self.forecast_verdict(step, records, ended)
                if verdict is not None:
                    return verdict
        return None

    def forecast_verdict(self, step: int, records: list, ended: list) -> Verdict | None:
        """Stop when every run's forecast says short of the target by PRUNE_MARGIN."""
        words = []
        for spec, record, status in zip(self.specs, records, ended, strict=True):
            if status is not None:  # ended: short only if it ended below the target
                if status["reached"]:
                    return None
                words.append(f"{seed_of(spec)}ended short of it")
                continue
            forecast = (record or {}).get("forecast")
            if not is_short(forecast, self.target):
                return None
            words.append(f"{seed_of(spec)}{forecast.get('text', 'short')}")
        return Verdict(step, "; ".join(words))


def is_short(forecast: Any, target: float) -> bool:
    """A forecast that says the run ends short of `target` by PRUNE_MARGIN at least."""
    if not isinstance(forecast, dict) or forecast.get("verdict") != "short":
        return False
    end = forecast.get("end_exact")
    return not isinstance(end, (int, float)) or end <= target - PRUNE_MARGIN


def seed_of(spec: RunSpec) -> str:
    return f"seed {spec.cfg.seed}: " if "seed" in spec.choice else ""


def ended_status(spec: RunSpec) -> dict[str, Any] | None:
    """A run's end as its summary says it (None: still training), and whether it reached its
    target."""
    summary = read_summary(spec.run_dir)
    if not summary or summary.get("status") not in ("finished", "stopped at target"):
        return None
    target = spec.cfg.train.target_exact_match
    best = summary.get("best_exact_match")
    return {"reached": summary.get("status") == "stopped at target"
            or (target is not None and isinstance(best, (int, float)) and best >= target)}


def check_forecast_pruning(cfg) -> None:
    """--prune forecast needs a target, the gauges, and a task the forecast was measured on."""
    from minitfm.errors import MinitfmError

    if cfg.train.target_exact_match is None:
        raise MinitfmError("--prune forecast stops trials forecast short of the target, and "
                           "train.target_exact_match is null: set a target, or --prune median")
    if not cfg.log.gauge_every:
        raise MinitfmError("--prune needs the gauges' readings, and log.gauge_every is 0: leave "
                           "it on (the default)")
    if cfg.task.name not in CALIBRATED:
        raise MinitfmError(f"--prune forecast: the forecast is uncalibrated for "
                           f"{cfg.task.name} (measured on {', '.join(CALIBRATED)}): use "
                           f"--prune median")
