"""A search planned: what it refuses before any run starts (one line each, exit 2), what it
checks of its space, its objective, and the folder it picks."""

import builtins
import json

import pytest

from minitfm.lab.many.grid import Grid
from minitfm.lab.many.search import (
    Objective,
    ends_runs,
    make_sampler,
    prepare_search,
    require_optuna,
)
from minitfm.lab.many.space import parse_dimension
from minitfm.lab.options import SweepOptions
from tests.helpers import TINY, assert_clean_error, once, run_cli

pytest.importorskip("optuna")

FAST = once([*TINY, "train.steps=20", "train.eval_every=0", "log.tensorboard=false"])
LR = "train.lr=tag(log,interval(1e-3,1e-2))"


def search(tmp_path, *args):
    return run_cli("sweep", *FAST, *args, "--out", tmp_path / "s", "--eval-samples", "20")


@pytest.mark.parametrize("args, words", [
    ([LR, "--dry-run"], "a search draws its trials as it goes"),
    (["train.lr=0.01,0.02", "--trials", "4"], "--trials goes with a search"),
    (["train.lr=0.01,0.02", "--prune", "median"], "--prune goes with a search"),
    (["train.lr=0.01,0.02", "--sampler", "random"], "--sampler goes with a search"),
    (["train.lr=interval(1e-2,1e-3)"], "the interval is empty"),
    (["train.warmup_steps=range(5,5)"], "the range is empty"),
    (["train.lr=tag(log,interval(0,1e-2))"], "a log range needs bounds above 0"),
    ([LR, "seed=interval(0,3)"], "the seeds are a list every trial of a search runs"),
    ([LR, "--seeds", "range(0,3)"], "not a range to search"),
    ([LR, "--sampler", "cmaes"], "--sampler ('cmaes') must be one of tpe, random, grid"),
    ([LR, "--prune", "hyperband"], "--prune ('hyperband') must be one of none, median"),
    ([LR, "--sampler", "grid"], "--sampler grid runs every value"),
    ([LR, "--stack"], "leave out --stack"),
    ([LR, "--on", "ray", "--jobs", "2"], "--jobs is for --on local"),
    ([LR, "train.target_exact_match=choice(0.9,0.99)"], "is what the search aims at"),
    ([LR, "train.target_exact_match=null", "--prune", "forecast"], "set a target"),
    ([LR, "task.name=add", "task.max_len=4", "--prune", "forecast"], "uncalibrated for add"),
    ([LR, "log.gauge_every=0", "--prune", "median"], "log.gauge_every is 0"),
    (["train.warmup_steps=int(interval(-5,10))"], "warmup_steps=-5"),  # an end the config refuses
    (["train.lr=intervall(1e-3,1e-2)", "--trials", "2"], "did you mean interval?"),
])
def test_refused_before_any_run_starts(tmp_path, args, words):
    result = search(tmp_path, *args)
    assert_clean_error(result, 2, words)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("again, words", [
    ("train.lr=interval(1e-3,2e-2)", "train.lr is given twice (tag(log,interval(1e-3,1e-2)) "
                                     "and interval(1e-3,2e-2)): give it one range"),
    ("train.lr=0.01,0.02", "train.lr is given a range (tag(log,interval(1e-3,1e-2))) and a "
                           "value (0.01,0.02)"),
])
def test_a_key_searched_twice_or_also_set_is_refused(tmp_path, again, words):
    base = [item for item in FAST if not item.startswith("train.lr=")]
    result = run_cli("sweep", *base, LR, again, "--out", tmp_path / "s", as_typed=True)
    assert_clean_error(result, 2, words)
    assert not (tmp_path / "s").exists()


def test_optuna_missing_is_one_line(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError("No module named 'optuna'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    result = search(tmp_path, LR)
    assert_clean_error(result, 2, "needs Optuna: pip install 'minitfm[search]'")
    assert not (tmp_path / "s").exists()
    with pytest.raises(Exception, match="minitfm\\[search\\]"):
        require_optuna()


def test_every_end_of_every_range_is_checked_as_a_run():
    space = [parse_dimension("train.lr", "interval(1e-3,1e-2)"),
             parse_dimension("model.positional", "choice(sinusoidal,rope)")]
    runs = ends_runs(Grid(None, [], FAST), space, 1, __import__(
        "minitfm.lab.many.grid", fromlist=["plan_runs"]).plan_runs)
    seen = {(spec.cfg.train.lr, spec.cfg.model.positional) for spec in runs}
    assert seen == {(1e-3, "sinusoidal"), (1e-2, "sinusoidal"), (1e-3, "rope")}


def test_the_plan_names_the_search_and_finds_its_folder_again(tmp_path):
    options = SweepOptions(seeds="0,1", trials=3, prune="forecast", out=None)
    items = once([*FAST, f"log.dir={tmp_path}", LR, "train.warmup_steps=range(10,31,10)"])
    plan = prepare_search(None, items, options)
    assert plan.folder.name.startswith("sweep-default-search-lr-warmup_steps-")
    assert plan.search.seeds == ["0", "1"] and plan.search.trials == 3
    assert plan.grid.spec()["search"] == {
        "space": [["train.lr", "tag(log,interval(1e-3,1e-2))"],
                  ["train.warmup_steps", "range(10,31,10)"]],
        "sampler": "tpe", "sampler_seed": 0, "prune": "forecast"}
    assert "train.lr" not in plan.base and "train.warmup_steps" not in plan.base
    plan.folder.mkdir()
    (plan.folder / "sweep.json").write_text(json.dumps(plan.record()))
    again = prepare_search(None, items, SweepOptions(seeds="0,1", trials=9, prune="forecast"))
    assert again.folder == plan.folder  # more trials continue the same study
    other = prepare_search(None, items, SweepOptions(seeds="0,1", trials=3, sampler_seed=1,
                                                     prune="forecast"))
    assert other.folder != plan.folder  # another sampler seed is another search


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_another_sampler_seed_draws_other_trials_not_the_same_ones_shifted(tmp_path, sampler):
    # The newcomer's finding of 2026-12-08: with trial n's sampler seeded by seed + n,
    # --sampler-seed 1 drew --sampler-seed 0's trials 1, 2, 3 as its trials 0, 1, 2.
    import optuna

    def drawn(sampler_seed):
        options = SweepOptions(seeds="0", trials=4, sampler=sampler, sampler_seed=sampler_seed)
        plan = prepare_search(None, once([*FAST, f"log.dir={tmp_path}", LR]), options)
        study = optuna.create_study()
        values = []
        for number in range(4):  # each trial asked of its own sampler, as trials.py does
            study.sampler = make_sampler(plan.search, number)
            trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-2,
                                                                             log=True)})
            values.append(trial.params["lr"])
            study.tell(trial, 1.0)
        return values

    assert drawn(0) == drawn(0)  # the same seed draws the same trials
    assert not set(drawn(0)) & set(drawn(1))


def test_the_objective_counts_a_run_short_of_the_target_past_its_budget(tmp_path):
    from minitfm.lab.many.grid import plan_runs

    objective = Objective(0.9)
    (spec,), _ = plan_runs(Grid(None, [], FAST), 1)
    spec.run_dir = tmp_path

    def ended(evaluated=None, **summary):
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        report = tmp_path / "eval-1-6.json"  # the sweep's evaluation of the trained lengths
        report.unlink(missing_ok=True)
        if evaluated is not None:
            report.write_text(json.dumps({"exact_match": evaluated, "per_length": {}}))
        return objective.of_run(spec)

    assert ended(status="stopped at target", step=12, best_exact_match=0.95) == 12
    # short of it: the shortfall of the table's exact match (the sweep's evaluation)
    assert ended(0.45, status="finished", step=20, best_exact_match=0.6) == pytest.approx(30)
    assert ended(None, status="finished", step=20, best_exact_match=0.6) is None
    assert ended(0.95, status="finished", step=20, best_exact_match=0.8) == 20  # never below
    assert ended(0.5, status="finished", step=20, best_exact_match=0.9) == 20  # reached at the end
    assert ended(0.5, status="interrupted", step=7, best_exact_match=0.1) is None
    assert objective.direction == "minimize" and Objective(None).direction == "maximize"
    assert Objective(None).of_run(spec) == 0.5  # no target: the exact match itself


@pytest.mark.slow  # three runs
def test_a_grid_search_runs_each_configuration_once_in_a_seeded_order(tmp_path):
    out = tmp_path / "g"
    result = run_cli("sweep", *FAST, "train.warmup_steps=range(0,21,10)", "--sampler", "grid",
                     "--out", out, "--eval-samples", "20")  # --trials 20 by default: 3 here
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "search of 3 trials" in result.stdout and "grid (3 configurations" in result.stdout
    trials = [json.loads(line) for line in (out / "trials.jsonl").open()]
    assert sorted(t["values"]["train.warmup_steps"] for t in trials) == ["0", "10", "20"]
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert header[:6] == ["run", "trial", "trial_state", "objective", "pruned",
                          "train.warmup_steps"]
    assert "its settings: train.warmup_steps=" in result.stdout
