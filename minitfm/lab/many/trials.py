"""A search's trials run (`SearchScheduler`): each asked of Optuna, its runs run as the grid's
jobs, watched for pruning (`pruning.py`), told in order; then its tables.

The trials are drawn and told in a fixed order, so that a search stopped and run again draws
what it would have drawn: trial n is asked once trial n - `window` has been told (told in their
numbers' order), with a sampler seeded by `--sampler-seed` + n (`search.make_sampler`). Its
history is then always the same trials, whatever finished first; the cost is a core left
waiting while an older trial of the window still trains. Optuna is imported inside functions.
"""

from __future__ import annotations

import json
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minitfm.errors import Interrupted, shown_path
from minitfm.lab.many.grid import RunSpec
from minitfm.lab.many.pruning import PruneWatch, Verdict
from minitfm.lab.many.results import SweepResult, result_row, write_results
from minitfm.lab.many.runs import PRUNED, TRIALS_FILE
from minitfm.lab.many.scheduler import (
    POLL_S,
    Job,
    Scheduler,
    keep_result,
    plan_job,
    stop_message,
)
from minitfm.lab.many.search import (
    grid_points,
    make_sampler,
    open_study,
    trial_spec,
    values_text,
)
from minitfm.run.files import to_json, write_atomic
from minitfm.run.signals import CaughtSignals


@dataclass
class Trial:
    """One trial as this sweep runs it: Optuna's trial, its values, its runs and their jobs."""

    number: int
    optuna: Any  # optuna.trial.Trial
    values: dict[str, str]  # key -> the override text its runs train with
    specs: list[RunSpec]
    jobs: list[Job] = field(default_factory=list)
    watch: PruneWatch | None = None
    pruned: Verdict | None = None
    failed: list[RunSpec] = field(default_factory=list)


def training(job: Job) -> bool:
    """Whether the job's next command trains (an evaluation writes its result to a file)."""
    return bool(job.commands) and job.commands[0].out is None


class SearchScheduler(Scheduler):
    """Runs a search's trials: asks Optuna for each (`ask`), runs its runs as the grid's jobs,
    watches them for pruning, and tells Optuna how each ended, in order."""

    def __init__(self, study, plan, make_spec: Callable[[int, dict, str], RunSpec],
                 say: Callable[[str], None]):
        super().__init__([], plan.parallel, say)
        self.study, self.plan, self.search = study, plan, plan.search
        self.make_spec = make_spec
        self.window = max(1, plan.parallel // max(1, len(self.search.seeds)))  # trials at once
        self.active: list[Trial] = []  # asked, not yet told, in their numbers' order
        self.queue: list[Job] = []  # jobs of active trials not yet started
        self.env: dict[str, str] = {}  # for every job's commands (the sweep's MLflow run)
        self.told = 0  # trials the study holds that ended (`count_told`, then counted here)

    # -- the trials ----------------------------------------------------------------------
    def count_told(self) -> int:
        """The trials the study holds that ended (complete, pruned or failed)."""
        from optuna.trial import TrialState

        return sum(t.state != TrialState.RUNNING for t in self.study.get_trials(deepcopy=False))

    def resume_running(self) -> None:
        """The trials an earlier sweep asked and never told: run again, oldest first."""
        import optuna
        from optuna.trial import TrialState

        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            values = frozen.user_attrs.get("values")
            if not isinstance(values, dict):  # asked, killed before its values were kept
                self.study.tell(frozen.number, state=TrialState.FAIL)
                continue
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            self.add(frozen.number, trial, values)

    def ask(self) -> None:
        """Draw the next trial (see the module's docstring for the order)."""
        number = len(self.study.get_trials(deepcopy=False))
        self.study.sampler = make_sampler(self.search, number)
        if self.search.sampler == "grid":
            self.study.enqueue_trial(grid_points(self.search)[number])
        trial = self.study.ask({d.key: d.distribution() for d in self.search.space})
        values = {d.key: d.value_text(trial.params[d.key]) for d in self.search.space}
        trial.set_user_attr("values", values)
        self.add(trial.number, trial, values)

    def add(self, number: int, trial, values: dict[str, str]) -> None:
        """Trial `number` as this sweep runs it: a run per seed, their jobs queued."""
        seeds = self.search.seeds or [""]
        specs = [self.make_spec(number, values, seed) for seed in seeds]
        found = Trial(number, trial, values, specs)
        found.jobs = [plan_job(self.plan.grid, spec, self.plan.ranges, self.plan.threads,
                               self.plan.samples) for spec in specs]
        for job in found.jobs:
            job.env = self.env
        found.watch = PruneWatch(self.search, specs, trial)
        self.active.append(found)
        self.queue.extend(job for job in found.jobs if job.commands)

    def tell_finished(self) -> None:
        """Tell Optuna of the oldest active trials whose runs all ended, in order."""
        while self.active and self.all_ended(self.active[0]):
            self.tell(self.active.pop(0))

    def all_ended(self, trial: Trial) -> bool:
        """Whether nothing of the trial runs or waits: each run done, or the trial stopped."""
        running = {id(job) for job in self.running.values()}
        return not any(id(job) in running or job in self.queue for job in trial.jobs) \
            and (trial.pruned is not None or all(not job.commands for job in trial.jobs)
                 or trial.failed)

    def tell(self, trial: Trial) -> None:
        """Tell Optuna how the trial ended (its objective, pruned, or failed), and say it."""
        from optuna.trial import TrialState

        if trial.pruned is not None:
            trial.optuna.set_user_attr("pruned", trial.pruned.row_text())
            self.study.tell(trial.optuna, state=TrialState.PRUNED)
            state = f"pruned at step {trial.pruned.step}: {trial.pruned.words}"
        elif trial.failed:
            self.study.tell(trial.optuna, state=TrialState.FAIL)
            state = "failed"
        else:
            value = self.search.objective.of_trial(trial.specs)
            if value is None:
                self.study.tell(trial.optuna, state=TrialState.FAIL)
                state = "failed: a run ended without a score"
            else:
                self.study.tell(trial.optuna, value)
                state = f"objective {value:.4g}"
        self.told += 1
        self.say(f"trial {trial.number} ({values_text(trial.values)}): {state}")

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> list[RunSpec]:
        """Run trials until the study holds --trials told ones; the runs that failed. A signal
        raises Interrupted at the end, the trials then running left to resume."""
        self.resume_running()
        self.told = self.count_told()
        runs = max(1, len(self.search.seeds))  # `[3/64]`: runs ended of those left to run
        self.total = max(0, self.search.trials - self.told) * runs
        with CaughtSignals() as signals:
            while True:
                if not signals.received:
                    self.tell_finished()
                    while len(self.active) < self.window and \
                            self.told + len(self.active) < self.search.trials:
                        self.ask()
                    while self.queue and len(self.running) < self.parallel:
                        job = self.queue.pop(0)
                        job.started = time.monotonic()
                        self.start(job)
                self.forward(signals.received)
                self.collect(bool(signals.received))
                if not signals.received:
                    self.watch()
                if not self.running and (signals.received or not self.active):
                    break
                time.sleep(POLL_S)
        if signals.received:
            raise Interrupted(stop_message(signals.received[0], self.stopped),
                              128 + signals.received[0])
        return self.failed

    def trial_of(self, job: Job) -> Trial:
        return next(trial for trial in self.active if job in trial.jobs)

    def advance(self, code: int, job: Job, stopping: bool) -> None:
        """A command ended: the training of a pruned trial's run stops there (its checkpoint
        kept), a failed one fails its trial; else as in a grid (a run of a pruned trial that
        had ended its training is still evaluated)."""
        trial = self.trial_of(job)
        if trial.pruned is not None and not stopping and code != 0:
            keep_result(job.commands.pop(0), code)
            job.commands.clear()
            return
        before = len(self.failed)
        super().advance(code, job, stopping)
        if len(self.failed) > before:
            trial.failed.extend(self.failed[before:])
            self.drop(trial)

    def watch(self) -> None:
        """Read what the active trials' runs wrote since the last look; stop a trial that
        `PruneWatch` says cannot win: its running runs get SIGINT (each saves its last.pt)."""
        for trial in self.active:
            if trial.pruned is not None or trial.failed:
                continue
            verdict = trial.watch.look()
            if verdict is None:
                continue
            trial.pruned = verdict
            self.drop(trial)
            self.stop_runs(trial)

    # -- where the runs run: this machine's processes, as the grid's `Scheduler` starts and
    # collects them (`ray_search.py`: Ray's tasks) -----------------------------------------
    def stop_runs(self, trial: Trial) -> None:
        """SIGINT to the trial's trainings: as Ctrl-C, each run saves and stops."""
        for proc, job in self.running.items():
            if job in trial.jobs and training(job):
                proc.send_signal(signal.SIGINT)

    def drop(self, trial: Trial) -> None:
        """A trial that will not run on: its jobs not yet started are left out (but for the
        evaluations of runs that ended their training)."""
        for job in trial.jobs:
            if job not in self.running.values() and training(job):
                job.commands.clear()
        self.queue = [job for job in self.queue if job.commands]


def run_search(plan, say: Callable[[str], None], warn: Callable[[str], None],
               on_ray: Callable | None = None) -> SweepResult:
    """Run the search of `plan` (see `search.prepare_search`) in its folder, locked, on this
    machine or, with --on ray, by `on_ray` (`ray_search.run_trials_on_ray`); with log.mlflow,
    its runs as the children of the sweep's MLflow run (as a grid's: `sweep.run_sweep`). The
    results, written even when it stops early."""
    from contextlib import nullcontext

    from minitfm.lab.many.runs import SWEEP_FILE
    from minitfm.lab.many.sweep import SweepLock
    from minitfm.lab.many.sweep_folder import check_folder
    from minitfm.lab.watch.tracking import SweepRun

    if plan.on == "ray":
        from minitfm.lab.many.raycluster import check_cluster  # Ray is imported there only

        check_cluster(plan.ray_address)  # one line, before the sweep folder is made
    search = plan.search
    tracker = SweepRun.of([spec.cfg for spec in plan.checked])
    with SweepLock(plan.folder):
        check_folder(plan.folder, plan.grid, plan.base, [])
        record = to_json(plan.record(), indent=1) + "\n"
        write_atomic(plan.folder / SWEEP_FILE, record.encode("utf-8"))
        study = open_study(plan.folder, search)
        say(f"sweep folder: {shown_path(plan.folder)}")
        for text in plan.notes():
            say(f"note: {text}")
        swept = [(d.key, [d.text]) for d in search.space]
        try:
            with tracker.watching(plan.folder, plan.base, swept, warn) if tracker \
                    else nullcontext({}) as env:
                failed = run_trials(plan, study, env, say, on_ray)
        finally:
            rows = write_search(plan, study)
    keys = [d.key for d in search.space] + (["seed"] if search.seeds else [])
    return SweepResult(plan.folder, rows, keys, [spec.id for spec in failed])


def run_trials(plan, study, env: dict[str, str], say: Callable[[str], None],
               on_ray: Callable | None) -> list[RunSpec]:
    """The trials run where `--on` says; the runs that failed."""
    def make_spec(number: int, values: dict[str, str], seed: str) -> RunSpec:
        return trial_spec(plan, number, values, seed)

    if plan.on == "ray":
        return on_ray(plan, study, make_spec, env, say)
    scheduler = SearchScheduler(study, plan, make_spec, say)
    scheduler.env = env
    say(search_line(plan, study))
    return scheduler.run()


def trial_rows(plan, study) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(a row per run of every told or running trial, a line per trial)."""
    from optuna.trial import TrialState

    rows, trials = [], []
    best = None
    try:
        best = study.best_trial.number
    except ValueError:  # no trial complete yet
        pass
    for frozen in study.get_trials(deepcopy=False):
        values = frozen.user_attrs.get("values")
        if not isinstance(values, dict):
            continue
        specs = [trial_spec(plan, frozen.number, values, seed)
                 for seed in plan.search.seeds or [""]]
        state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned",
                 TrialState.FAIL: "failed"}.get(frozen.state, "running")
        pruned = frozen.user_attrs.get("pruned")
        for spec in specs:
            row = result_row(spec, plan.ranges)
            row.update({"trial": frozen.number, "trial_state": state, "pruned": pruned,
                        "objective": frozen.value if state == "complete" else None,
                        "trial_best": frozen.number == best})
            if state == "pruned" and row["status"] == "interrupted":  # stopped by the search
                row["status"] = PRUNED
            rows.append(row)
        trials.append({"trial": frozen.number, "state": state, "best": frozen.number == best,
                       "objective": frozen.value if state == "complete" else None,
                       "values": values, "pruned": pruned,
                       "runs": [spec.id for spec in specs],
                       "steps": [row["steps"] for row in rows[-len(specs):]]})
    return rows, trials


def write_search(plan, study) -> list[dict[str, Any]]:
    """The grid's tables (results, configurations: a configuration per trial), and
    trials.jsonl; the rows."""
    rows, trials = trial_rows(plan, study)
    if rows:
        keys = [d.key for d in plan.search.space] + (["seed"] if plan.search.seeds else [])
        write_results(plan.folder, rows, keys, list(plan.fixed),
                      ["trial", "trial_state", "objective", "pruned"])
    lines = "".join(json.dumps(t) + "\n" for t in trials)
    write_atomic(plan.folder / TRIALS_FILE, lines.encode("utf-8"))
    return rows


def search_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Trials by state."""
    states: dict[int, str] = {row["trial"]: row["trial_state"] for row in rows}
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    return counts


def search_line(plan, study) -> str:
    """What the search is about to do: `search of 32 trials (5 told, 1 to resume), 2 seeds
    each, 2 runs at a time, 1 thread each; sampler tpe (seed 0); pruning: forecast; objective:
    ...`."""
    from optuna.trial import TrialState

    search = plan.search
    trials = study.get_trials(deepcopy=False)
    told = sum(t.state != TrialState.RUNNING for t in trials)
    running = len(trials) - told
    again = f", {running} to resume" if running else ""
    each = f"{len(search.seeds)} seeds each" if search.seeds else "one run each"
    threads = f"{plan.threads} thread{'s' if plan.threads > 1 else ''} each"
    left = "nothing left to run; " if told >= search.trials else ""
    prune = search.prune + (" (Optuna's: none before 5 trials are complete)"
                            if search.prune == "median" else "")
    sampler = f"{search.sampler} (seed {search.sampler_seed})" if search.sampler != "grid" \
        else f"grid ({len(grid_points(search))} configurations, in the order of seed " \
             f"{search.sampler_seed})"
    return (f"search of {search.trials} trials ({told} done{again}), {each}, {left}"
            f"{plan.parallel} runs at a time, {threads}; sampler {sampler}; pruning: {prune}; "
            f"objective: "
            f"{search.objective.words(max(1, len(search.seeds)))}")


warnings.filterwarnings("ignore", message=".*is already reported.*")
warnings.filterwarnings("ignore", category=UserWarning, module="optuna")
