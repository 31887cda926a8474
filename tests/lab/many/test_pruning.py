"""Pruning a search's trials from their runs' metrics.jsonl: the readings taken in as they are
written, the forecast's rule and the median pruner's, each with its words."""

import json
from types import SimpleNamespace

import pytest

from minitfm.lab.many.grid import Grid, plan_runs
from minitfm.lab.many.pruning import PruneWatch, Readings, is_short
from tests.helpers import TINY, once

FAST = once([*TINY, "train.steps=200", "train.target_exact_match=0.99"])


class FakeTrial:
    """What PruneWatch asks of an Optuna trial: report, should_prune."""

    def __init__(self, prune_at=None):
        self.reported, self.prune_at = [], prune_at

    def report(self, value, step):
        self.reported.append((step, value))

    def should_prune(self):
        return self.prune_at is not None and self.reported[-1][0] >= self.prune_at


def runs(tmp_path, seeds=(0, 1)):
    specs, _ = plan_runs(Grid(None, [("seed", [str(s) for s in seeds])], FAST), 1)
    for spec in specs:
        spec.run_dir = tmp_path / spec.id
        spec.run_dir.mkdir()
    return specs


def reading(step, exact, verdict=None, end=None, text="t"):
    forecast = None if verdict is None else {"verdict": verdict, "end_exact": end, "text": text}
    return {"step": step, "split": "gauges", "exact": exact, "forecast": forecast}


def write(spec, *records, partial=""):
    with open(spec.run_dir / "metrics.jsonl", "a") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
        f.write(partial)


def watch(specs, prune, trial, target=0.99):
    search = SimpleNamespace(prune=prune, objective=SimpleNamespace(target=target))
    return PruneWatch(search, specs, trial)


def test_readings_take_whole_lines_as_they_come_and_a_rewritten_file_anew(tmp_path):
    (spec, _) = runs(tmp_path)
    readings = Readings(spec.run_dir)
    readings.read()  # no file yet
    write(spec, reading(10, 0.1), {"step": 10, "split": "train", "loss": 1.0},
          partial='{"step": 20, "split": "gau')
    readings.read()
    assert list(readings.by_step) == [10]  # the half-written line waits
    with open(spec.run_dir / "metrics.jsonl", "a") as f:
        f.write('ges", "exact": 0.2}\nnot json\n')
    readings.read()
    assert list(readings.by_step) == [10, 20] and readings.at(25)["exact"] == 0.2
    (spec.run_dir / "metrics.jsonl").write_text(json.dumps(reading(10, 0.5)) + "\n")
    readings.read()  # shorter: a resume rewrote it
    assert readings.by_step == {10: reading(10, 0.5)}


def test_forecast_prunes_when_every_run_is_forecast_short(tmp_path):
    specs = runs(tmp_path)
    trial = FakeTrial()
    w = watch(specs, "forecast", trial)
    write(specs[0], reading(10, 0.0), reading(20, 0.1, "short", 0.4, "short of 99%: ~40%"))
    write(specs[1], reading(10, 0.0))
    assert w.look() is None  # seed 1 has no reading at 20 yet: the trial waits for it
    write(specs[1], reading(20, 0.1, "on course", 0.999))
    assert w.look() is None  # one run on course: the trial goes on
    write(specs[0], reading(30, 0.1, "short", 0.5, "short of 99%: ~50%"))
    write(specs[1], reading(30, 0.1, "short", 0.6, "no click by the run's end"))
    verdict = w.look()
    assert verdict.step == 30
    assert verdict.row_text() == ("pruned at step 30: seed 0: short of 99%: ~50%; seed 1: no "
                                  "click by the run's end")
    assert trial.reported == [(10, 1.0), (20, pytest.approx(0.9)), (30, pytest.approx(0.9))]


def test_a_run_that_reached_the_target_keeps_its_trial(tmp_path):
    specs = runs(tmp_path)
    w = watch(specs, "forecast", FakeTrial())
    (specs[0].run_dir / "summary.json").write_text(json.dumps(
        {"status": "stopped at target", "step": 20, "best_exact_match": 0.995}))
    write(specs[0], reading(20, 0.995))
    write(specs[1], reading(20, 0.2, "short", 0.3), reading(30, 0.2, "short", 0.3))
    assert w.look() is None
    (specs[0].run_dir / "summary.json").write_text(json.dumps(
        {"status": "finished", "step": 200, "best_exact_match": 0.7}))
    write(specs[1], reading(40, 0.2, "short", 0.3))
    assert "seed 0: ended short of it" in w.look().words


def test_the_margin_and_the_verdicts_that_never_prune():
    assert is_short({"verdict": "short", "end_exact": 0.5}, 0.99)
    assert is_short({"verdict": "short", "end_exact": None}, 0.99)
    for verdict in ("on course", "close call", "passed", None):
        assert not is_short({"verdict": verdict, "end_exact": 0.1}, 0.99)
    assert not is_short(None, 0.99) and not is_short("short", 0.99)


def test_median_prunes_when_optuna_says_so_and_reports_in_the_objective_s_direction(tmp_path):
    specs = runs(tmp_path, seeds=(0,))
    trial = FakeTrial(prune_at=20)
    w = watch(specs, "median", trial)
    write(specs[0], reading(10, 0.25), reading(20, 0.5))
    verdict = w.look()
    assert verdict.step == 20 and "below the median of the complete trials" in verdict.words
    assert "50.0% exact" in verdict.words
    assert trial.reported == [(10, 0.75), (20, 0.5)]  # shortfall: the objective is minimized
    maximize = FakeTrial()
    watch(specs, "median", maximize, target=None).look()
    assert maximize.reported == [(10, 0.25), (20, 0.5)]  # no target: exact match, maximized


def test_none_only_reports(tmp_path):
    specs = runs(tmp_path, seeds=(0,))
    write(specs[0], reading(10, 0.0, "short", 0.0), reading(20, 0.0, "short", 0.0))
    trial = FakeTrial(prune_at=0)
    assert watch(specs, "none", trial).look() is None and len(trial.reported) == 2
