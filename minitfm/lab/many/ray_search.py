"""A search on Ray (`minitfm sweep --on ray` with ranges): its trials asked, watched and told by
the driver as on this machine (`trials.py`), into the one study in the sweep folder; each job a
Ray task, run and reported as a grid's on Ray (`ray_launcher.py`).

As many trials' runs at once as the cluster has CPUs for (`--threads` each). Pruning reads the
runs' metrics.jsonl as they train: where the workers see the sweep folder (a shared filesystem,
or one machine) a pruned trial's tasks are cancelled, and each run saves its last.pt as under
Ctrl-C; where they do not, a run's files come back only at its end, and no trial is pruned (the
sweep says so). Ray is imported here and in `raycluster.py` only.
"""

from __future__ import annotations

from collections.abc import Callable

from minitfm.lab.many.grid import RunSpec
from minitfm.lab.many.ray_launcher import (
    MAX_RETRIES,
    TOKEN,
    RayScheduler,
    ray_jobs,
    run_work,
    write_token,
)
from minitfm.lab.many.raycluster import connect
from minitfm.lab.many.scheduler import Job
from minitfm.lab.many.trials import SearchScheduler, Trial, search_line


class RaySearchScheduler(SearchScheduler):
    """The trials' jobs as Ray tasks; what ended is reported as a grid's on Ray."""

    def __init__(self, study, plan, make_spec: Callable, say: Callable[[str], None], ray,
                 token: str):
        super().__init__(study, plan, make_spec, say)
        self.ray, self.token = ray, token
        self.remote = ray.remote(run_work)
        self.reporter = RayScheduler([], {}, ray, say)  # its `finish`: what came back, said

    def start(self, job: Job) -> None:
        (work,) = ray_jobs([job], self.plan, self.token).values()
        ref = self.remote.options(num_cpus=work.threads, max_retries=MAX_RETRIES).remote(work)
        self.running[ref] = job

    def collect(self, stopping: bool) -> None:
        """Each task that ended: its runs written (sent back) and reported; a task of a pruned
        trial was cancelled, its runs stopped where they were."""
        if not self.running:
            return
        done, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        for ref in done:
            job = self.running.pop(ref)
            trial = self.trial_of(job)
            commands, job.commands = job.commands, []  # a task runs all of a job's commands
            if trial.pruned is not None:
                continue
            reporter = self.reporter
            reporter.total, reporter.done, before = self.total, self.done, len(reporter.failed)
            job.commands = commands  # as the task was given them, for its report
            reporter.finish(job, ref, stopping)
            job.commands = []
            self.done = reporter.done
            if len(reporter.failed) > before:
                self.fail_trial(trial, reporter.failed[before:])

    def fail_trial(self, trial: Trial, specs: list[RunSpec]) -> None:
        self.failed.extend(specs)
        trial.failed.extend(specs)
        self.drop(trial)

    def forward(self, received: list[int]) -> None:
        """At the first signal, every task cancelled: each run saves its last.pt and stops."""
        if received and not self.forwarded:
            self.stopped = list(self.running.values())
            for ref in self.running:
                self.ray.cancel(ref)
        self.forwarded = len(received)

    def stop_runs(self, trial: Trial) -> None:
        for ref, job in self.running.items():
            if job in trial.jobs:
                self.ray.cancel(ref)


def run_trials_on_ray(plan, study, make_spec: Callable, env: dict[str, str],
                      say: Callable[[str], None]) -> list[RunSpec]:
    """Join the cluster and run the trials there (see the module's docstring); the runs that
    failed."""
    ray = connect(plan.ray_address, say)
    token = write_token(plan.folder)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        plan.parallel = max(1, cpus // plan.threads)
        scheduler = RaySearchScheduler(study, plan, make_spec, say, ray, token)
        scheduler.env = env
        say(search_line(plan, study))
        failed = scheduler.run()
        if scheduler.reporter.nodes:  # none when every task was cancelled (pruned)
            say(scheduler.reporter.summary())
        if plan.search.prune != "none" and "copied" in scheduler.reporter.modes:
            say("note: no trial was pruned on the nodes that do not see the sweep folder: "
                "their runs' files come back only at their end")
        return failed
    finally:
        (plan.folder / TOKEN).unlink(missing_ok=True)
        ray.shutdown()
