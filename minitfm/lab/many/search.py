"""`minitfm sweep` with ranges: a search, planned. Optuna draws `--trials` configurations from
the ranges (`space.py`), each trial is run with every seed (a full run each: its folder,
evaluations and row in the sweep's table), and hopeless trials are stopped (`pruning.py`); the
trials are run, in an order that a stopped search repeats, by `trials.py`.

The study is Optuna's RDB storage in the sweep folder (`study.db`, SQLite), so the same command
again resumes it: finished trials are never redone, an interrupted trial's runs resume from
their `last.pt`, and `--trials` more continues it.

The objective (`Objective`): the fewest steps to the target (mean over the seeds; a run short of
it counts as its budget x (1 + its shortfall / the target), its shortfall on the sweep's own
evaluation of the trained lengths, the table's exact match), or, with no target, the highest
exact match on the trained lengths. Optuna is imported inside functions: `pip install
'minitfm[search]'`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minitfm.errors import MinitfmError
from minitfm.lab.curves import read_eval
from minitfm.lab.many.grid import Grid, RunSpec
from minitfm.lab.many.results import eval_path
from minitfm.lab.many.seeds import reached
from minitfm.lab.many.space import Dimension, shown
from minitfm.run.summary import DONE, read_summary

STUDY_FILE = "study.db"  # the Optuna study, in the sweep folder
STUDY_NAME = "minitfm"
DEFAULT_TRIALS = 20  # as Hydra's Optuna sweeper
SEED_STRIDE = 1_000_003  # between the trial seeds of two sampler seeds: more than any search


@dataclass
class Search:
    """What a search asks for: the space, how many trials, how they are drawn and stopped."""

    space: list[Dimension]
    trials: int
    seeds: list[str]  # each trial's runs, one per seed (the config's seed alone: [])
    sampler: str = "tpe"
    sampler_seed: int = 0
    prune: str = "none"
    objective: Objective | None = None

    def spec(self) -> dict[str, Any]:
        """What makes two searches the same search (sweep.json): not --trials, which a search
        run again may raise to draw more."""
        return {"space": [[d.key, d.text] for d in self.space], "sampler": self.sampler,
                "sampler_seed": self.sampler_seed, "prune": self.prune}


@dataclass
class Objective:
    """What a trial is scored by: steps to `target` (minimized), or exact match (maximized)."""

    target: float | None

    @property
    def direction(self) -> str:
        return "maximize" if self.target is None else "minimize"

    def words(self, seeds: int) -> str:
        over = f"mean of {seeds} seeds" if seeds > 1 else "its run"
        if self.target is None:
            return f"highest exact match on the trained lengths ({over})"
        return (f"fewest steps to {self.target:.0%} exact match ({over}; a run short of it "
                f"counts as train.steps x (1 + its shortfall / {self.target:.0%}))")

    def of_run(self, spec: RunSpec) -> float | None:
        """One run's score (None: it did not end, or its evaluation is not there)."""
        lo, hi = spec.cfg.task.min_len, spec.cfg.task.max_len
        report = read_eval(eval_path(spec, lo, hi))  # the sweep's, as its table shows it
        if self.target is None:
            return None if report is None else report["exact_match"]
        summary = read_summary(spec.run_dir) or {}
        step = summary.get("step")
        if not isinstance(step, int) or summary.get("status") not in DONE:
            return None
        if reached(summary, self.target):  # by the run's own evaluations: where it stopped
            return float(step)
        if report is None:
            return None
        short = max(0.0, self.target - report["exact_match"]) / self.target
        return spec.cfg.train.steps * (1 + short)

    def of_trial(self, specs: list[RunSpec]) -> float | None:
        scores = [self.of_run(spec) for spec in specs]
        return None if not scores or None in scores else sum(scores) / len(scores)


def require_optuna() -> None:
    """A search needs Optuna: one line before anything else when it is missing."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise MinitfmError("a search (a range such as KEY=interval(A,B)) needs Optuna: pip "
                           "install 'minitfm[search]'") from None


def make_sampler(search: Search, number: int):
    """The sampler that draws trial `number`, seeded by `trial_seed` (see `trials.py`). A grid's
    trials are its points in a fixed shuffled order (`grid_points`), each given to Optuna
    before it is asked for (Optuna's GridSampler stops the study when the grid is used up,
    which only its `optimize` loop takes)."""
    import optuna

    seed = trial_seed(search.sampler_seed, number)
    if search.sampler in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def trial_seed(sampler_seed: int, number: int) -> int:
    """The seed of trial `number`'s sampler: the number itself under --sampler-seed 0, and
    SEED_STRIDE further on for each sampler seed, so that two sampler seeds share no trial's
    seed (seed + number did: --sampler-seed 1 drew seed 0's trials 1, 2, ... again)."""
    return (sampler_seed * SEED_STRIDE + number) % 2 ** 32  # numpy's seeds are 32 bits


def grid_points(search: Search) -> list[dict[str, Any]]:
    """Every configuration of a grid search, in the order --sampler-seed shuffles them to."""
    import itertools
    import random

    def typed(d: Dimension, text: str):
        return text if d.kind == "choice" else int(text) if d.kind == "int" else float(text)

    axes = [[typed(d, v) for v in d.values()] for d in search.space]
    points = [dict(zip((d.key for d in search.space), values, strict=True))
              for values in itertools.product(*axes)]
    random.Random(search.sampler_seed).shuffle(points)
    return points


def make_pruner(search: Search):
    """Optuna's pruner for --prune median (the others decide in `pruning.py`)."""
    import optuna

    if search.prune == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    return optuna.pruners.NopPruner()


def open_study(folder: Path, search: Search):
    """The sweep folder's study, made the first time."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=f"sqlite:///{(folder / STUDY_FILE).resolve()}",
                               study_name=STUDY_NAME, direction=search.objective.direction,
                               load_if_exists=True, pruner=make_pruner(search),
                               sampler=make_sampler(search, 0))


def values_text(values: dict[str, Any]) -> str:
    """A trial's values as its lines show them: `lr=0.006466, warmup_steps=60`."""
    from minitfm.lab.many.runs import short_names

    names = short_names(list(values))
    return ", ".join(f"{names[k]}={shown(str(v))}" for k, v in values.items())


def trial_spec(plan, number: int, values: dict[str, str], seed: str) -> RunSpec:
    """A run of trial `number`: the grid's fixed overrides, the trial's values, its seed."""
    from minitfm.config import load_config

    choice = {**values, **({"seed": seed} if seed else {})}
    overrides = [*plan.grid.fixed, *(f"{k}={v}" for k, v in choice.items())]
    cfg = load_config(plan.grid.config, [*overrides, f"threads={plan.threads}"])
    name = f"trial={number:03d}" + (f",seed={seed}" if seed else "")
    spec = RunSpec(name, choice, overrides, cfg, plan.folder / name, plan.fixed)
    spec.configuration = f"trial={number}, {values_text(values)}"
    return spec


def prepare_search(config: str | None, items: list[str], options):
    """A sweep with ranges, checked whole before anything is written (as `sweep.prepare` checks
    a grid): the space, the options, every end of every range as a run, the folder."""
    from minitfm.config import check_given_once
    from minitfm.lab.many.grid import changed_fixed, parse_grid, parse_lengths, plan_runs
    from minitfm.lab.many.pruning import check_forecast_pruning
    from minitfm.lab.many.space import parse_dimension, split_items
    from minitfm.lab.many.sweep import (
        Plan,
        check_evaluations,
        check_launcher,
        check_memory,
        check_no_workbook,
        check_search_options,
        job_shape,
    )
    from minitfm.lab.many.sweep_folder import (
        base_config,
        check_out,
        sweep_folder,
        sweep_name,
    )

    check_launcher(options)
    check_search_options(options, True)  # sweep.py: a grid checks they are not given
    require_optuna()
    searched, rest = split_items(items)
    check_searched_once(searched, rest)
    check_given_once(rest, sweep=True)
    swept, fixed = parse_grid(rest, options.seeds)
    space = [parse_dimension(key, text) for key, text in searched]
    seeds = []
    for key, values in swept:  # a plain list in a search is a choice (as in Hydra's sweeper)
        if key == "seed":
            seeds = values
        else:
            space.append(Dimension(key, ",".join(values), "choice", choices=tuple(values)))
    if options.sampler == "grid" and any(d.values() is None for d in space):
        d = next(d for d in space if d.values() is None)
        raise MinitfmError(f"--sampler grid runs every value, and {d.key}={d.text} is a float "
                           f"interval: give it as range(...) or choice(...), or --sampler tpe")
    trials = options.trials or DEFAULT_TRIALS
    if options.sampler == "grid":  # every configuration once, and no more
        trials = min(trials, math.prod(len(d.values()) for d in space))
    grid = Grid(config, [("seed", seeds)] if seeds else [], fixed)
    if options.on == "ray":  # the cluster's CPUs decide how many run at once (`ray_search`)
        parallel, per_job = trials * max(1, len(seeds)), options.threads or 1
    else:
        parallel, per_job = job_shape(trials * max(1, len(seeds)), options.jobs,
                                      options.threads)
    checked = ends_runs(grid, space, per_job, plan_runs)
    if options.on == "ray":
        check_no_workbook(checked)
    target = checked[0].cfg.train.target_exact_match
    if "train.target_exact_match" in [d.key for d in space]:
        raise MinitfmError("train.target_exact_match is what the search aims at: fix it "
                           "(train.target_exact_match=0.99), search the others")
    if options.prune != "none":
        if options.prune == "forecast":
            check_forecast_pruning(checked[0].cfg)
        elif not checked[0].cfg.log.gauge_every:
            raise MinitfmError("--prune needs the gauges' readings, and log.gauge_every is 0: "
                               "leave it on (the default)")
    search = Search(space, trials, seeds, options.sampler, options.sampler_seed, options.prune,
                    Objective(target))
    grid.search = search.spec()
    ranges = [parse_lengths(text) for text in options.eval_lengths or ()]
    if options.on != "ray":
        check_memory(checked, parallel)
    check_evaluations(checked, ranges, options.eval_samples)
    name = sweep_name(options.name, config)
    if options.out is not None:
        check_out(options.out)
    searched_keys = {d.key for d in space}
    fixed_changed = {key: text for key, text in changed_fixed(grid, checked[0].cfg).items()
                     if key not in searched_keys}  # not the others' ends, fixed to check one
    for spec in checked:
        spec.fixed = fixed_changed
    base = base_config(checked, grid)
    folder, note = sweep_folder(grid, name, options.out, base, checked)
    plan = Plan(grid, [], [], folder, parallel, per_job, ranges, options.eval_samples, base,
                note, [], "a search draws its trials one by one", options.on,
                options.ray_address)
    plan.search, plan.checked, plan.fixed = search, checked, fixed_changed
    return plan


def check_searched_once(searched: list[tuple[str, str]], rest: list[str]) -> None:
    """A key searched once, and not also set or swept: which would be meant?"""
    from minitfm.config import split_key_value

    given: dict[str, str] = {}
    for key, text in searched:
        if key in given:
            raise MinitfmError(f"{key} is given twice ({given[key]} and {text}): give it one "
                               f"range")
        given[key] = text
    for item in rest:
        split = split_key_value(item)
        if split is not None and split[0] in given:
            raise MinitfmError(f"{split[0]} is given a range ({given[split[0]]}) and a value "
                               f"({split[1].strip()}): give it one or the other")


def ends_runs(grid: Grid, space: list[Dimension], threads: int, plan_runs) -> list[RunSpec]:
    """The runs a search checks before its first trial: each end of each range (each value of
    each choice), the other keys at their low ends; a ConfigError names the first bad one."""
    checked = []
    for d in space:
        others = [f"{o.key}={o.ends()[0]}" for o in space if o is not d]
        ends = Grid(grid.config, [(d.key, list(dict.fromkeys(d.ends())))], [*grid.fixed,
                                                                            *others])
        if len(ends.swept[0][1]) == 1:
            ends = Grid(grid.config, [], [*ends.fixed, f"{d.key}={d.ends()[0]}"])
        runs, _ = plan_runs(ends, threads)
        checked.extend(runs)
    return checked
