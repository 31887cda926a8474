"""When a run evaluates: full evaluations every train.eval_every steps, and quick checks near
the target that may call one sooner but never decide anything themselves."""

import json
from types import SimpleNamespace

import pytest
import torch

from minitfm.app.api import train_run as train
from minitfm.book.loop import run_loop
from minitfm.book.metrics import evaluate
from minitfm.config import Config, load_config
from minitfm.run import schedule
from minitfm.run.instruments import Instrument
from minitfm.run.schedule import LossMeter, check_due, check_pairs
from minitfm.run.session import Training
from minitfm.run.state import init_state
from minitfm.run.summary import read_summary
from tests.helpers import QUICK, TINY, run_cli


def state_for(*overrides: str):
    cfg = load_config(None, [*TINY, "train.steps=60", "train.eval_every=20",
                             "train.check_every=5", "train.target_exact_match=0.9", *overrides])
    return init_state(cfg, torch.device("cpu"))


class Scripted(Training):
    """The run's events with scripted exact matches for its evaluations and checks; it records
    those calls and its saves of last.pt, and writes nothing."""

    def __init__(self, state, evaluations: dict, checks: dict, run_dir):
        super().__init__(state, run_dir, [], pacer=None)
        self.evaluations, self.checks = evaluations, checks
        self.calls: list[tuple[str, int]] = []

    def run_eval(self):
        step = self.state.step
        self.calls.append(("evaluate", step))
        exact = self.evaluations.get(step, 0.0)
        self.state.best_exact_match = max(self.state.best_exact_match, exact)  # as run_eval
        return SimpleNamespace(exact_match=exact)

    def check(self):
        self.calls.append(("check", self.state.step))
        return self.checks.get(self.state.step, 0.0)

    def save(self, name):
        self.calls.append(("save", self.state.step))

    def follow_threads(self, step): ...


def test_checks_start_once_an_evaluation_reached_two_thirds_of_the_target(tmp_path):
    state = state_for()
    run = Scripted(state, evaluations={20: 0.55, 40: 0.65}, checks={}, run_dir=tmp_path)
    assert run_loop(state, run) == "finished"
    checks = [step for kind, step in run.calls if kind == "check"]
    assert checks == [45, 50, 55]  # 0.65 >= 0.9 * 2 / 3 at step 40 (0.55 is not); none at 40, 60
    assert [s for k, s in run.calls if k == "evaluate"] == [20, 40, 60]


def test_a_check_calls_an_evaluation_which_alone_stops_the_run(tmp_path):
    state = state_for()
    # The check at 45 sees the target, the evaluation it calls does not: the run goes on.
    # At 50 the check sees it again, and so does the evaluation: the run stops there.
    run = Scripted(state, evaluations={20: 0.7, 45: 0.85, 50: 0.95},
                   checks={25: 0.5, 45: 0.95, 50: 0.95}, run_dir=tmp_path)
    assert run_loop(state, run) == "stopped at target"
    assert state.step == 50
    after_20 = run.calls[run.calls.index(("save", 20)) + 1:]
    assert after_20 == [("check", 25), ("check", 30), ("check", 35), ("evaluate", 40),
                        ("save", 40), ("check", 45), ("evaluate", 45), ("save", 45),
                        ("check", 50), ("evaluate", 50)]


@pytest.mark.parametrize("override", ["train.target_exact_match=null", "train.check_every=0"])
def test_no_checks_without_a_target_or_with_check_every_0(override, tmp_path):
    state = state_for(override)
    run = Scripted(state, evaluations={20: 0.95}, checks={}, run_dir=tmp_path)
    run_loop(state, run)
    assert not [call for call in run.calls if call[0] == "check"]


def test_check_due_follows_the_best_evaluation_so_far_which_checkpoints_keep():
    state = state_for()
    cfg = state.cfg.train
    assert not check_due(45, cfg, state.best_exact_match)  # no evaluation yet
    state.best_exact_match = 0.55
    assert not check_due(45, cfg, state.best_exact_match)  # below two thirds of 0.9
    state.best_exact_match = 0.65
    assert check_due(45, cfg, state.best_exact_match)
    assert not check_due(46, cfg, state.best_exact_match)
    assert "best_exact_match" in init_state(state.cfg, torch.device("cpu")).state_dict()


def test_train_line_tokens_per_second_leaves_out_time_set_aside(monkeypatch):
    state = state_for()
    clock = iter([0.0, 1.0, 1.0 + 5.0, 2.0 + 5.0])  # start, aside, aside's end, flush
    monkeypatch.setattr(schedule.time, "perf_counter", lambda: next(clock))
    meter = LossMeter(0, state.cfg.train)
    meter.add(torch.tensor(1.0), 1000)
    with meter.aside():  # 5 s of evaluation
        pass
    meter.read()
    assert meter.flush()["tokens_per_s"] == pytest.approx(1000 / 2.0)  # 2 s of steps


def test_a_run_records_only_full_evaluations_and_stops_at_one(tmp_path, monkeypatch):
    cfg = load_config(None, [*QUICK, "train.steps=200", "train.eval_every=50",
                             "train.check_every=10", "train.target_exact_match=0.5"])
    checks = []  # (step, exact match) of each real quick check
    real = Training.check
    monkeypatch.setattr(Training, "check", lambda self: checks.append(
        (self.state.step, real(self))) or checks[-1][1])
    summary = train(cfg, run_dir=tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    evals = [r for r in records if r["split"] == "eval"]
    assert all(r["samples"] == cfg.train.eval_samples for r in evals)  # checks are no records
    assert summary["status"] == "stopped at target"
    assert evals[-1]["step"] == summary["step"] and evals[-1]["exact_match"] >= 0.5
    assert all(r["exact_match"] < 0.5 for r in evals[:-1])
    # quick checks ran between the evaluations; one that saw the target called an evaluation
    # at its own step, and the run stopped there (here: a check at 60, not the evaluation at 100)
    assert checks and all(step % 10 == 0 and step % 50 for step, _ in checks), checks
    seen = [step for step, exact in checks if exact >= 0.5]
    assert seen, checks
    assert evals[-1]["step"] == seen[0] == checks[-1][0]


def test_a_check_is_the_exact_match_of_the_first_fifth_of_the_held_out_set(tmp_path):
    """`Training.check` against the book's `evaluate` on `check_pairs` of the same set."""
    cfg = load_config(None, [*QUICK, "train.target_exact_match=null"])
    train(cfg, run_dir=tmp_path / "run")
    from minitfm.run.checkpoint import load_checkpoint
    from minitfm.run.resume import restore

    state = init_state(cfg, torch.device("cpu"))
    path = tmp_path / "run" / "checkpoints" / "last.pt"
    restore(state, load_checkpoint(path), path)
    run = Training(state, tmp_path / "run", [], pacer=None)
    pairs = check_pairs(run.eval_pairs)
    assert len(pairs) == cfg.train.eval_samples // 5
    expected = evaluate(state.model, state.task, pairs, "cpu").exact_match
    assert 0.0 < expected < 1.0  # a model half way: a check of the wrong pairs would differ
    assert run.check() == expected


class Timed(Scripted):
    """Scripted with a clock: each step takes 1 s, each evaluation 1000 s, each save 500 s;
    it records the train lines and each step's tokens."""

    def __init__(self, state, clock: list[float], **scripted):
        super().__init__(state, **scripted)
        self.clock, self.lines, self.tokens = clock, [], {}
        self.instruments = [Lines(self.lines)]

    def after_step(self, state, batch, loss, grad_norm):
        self.clock[0] += 1.0
        self.tokens[state.step] = batch.n_target_tokens
        return super().after_step(state, batch, loss, grad_norm)

    def run_eval(self):
        self.clock[0] += 1000.0
        return super().run_eval()

    def save(self, name):
        self.clock[0] += 500.0
        super().save(name)

    def check(self):
        self.clock[0] += 1000.0
        return super().check()



class Lines(Instrument):
    """An instrument that keeps the train lines."""

    def __init__(self, lines: list):
        self.lines = lines

    def on_train_line(self, line) -> None:
        self.lines.append(line)


def test_tokens_per_second_counts_the_training_steps_only(tmp_path, monkeypatch):
    """README: evaluations, checks, pictures and saves between the steps are left out."""
    clock = [0.0]
    monkeypatch.setattr(schedule.time, "perf_counter", lambda: clock[0])
    state = state_for("train.checkpoint_every=15", "log.log_every=10")
    run = Timed(state, clock, evaluations={20: 0.7}, checks={}, run_dir=tmp_path)
    assert run_loop(state, run) == "finished"
    kinds = {kind for kind, _ in run.calls}
    assert kinds == {"evaluate", "check", "save"}  # each kind of work happened between lines
    assert [line.step for line in run.lines] == [10, 20, 30, 40, 50, 60]
    for line in run.lines:  # 10 steps of 1 s each since the line before
        tokens = sum(run.tokens[step] for step in range(line.step - 9, line.step + 1))
        assert line.tokens_per_s == pytest.approx(tokens / 10.0), line


@pytest.mark.slow  # trains the default config: about 16 s on one thread
def test_the_default_config_stops_at_its_target_within_its_steps(tmp_path):
    """README, Start here: `minitfm train` solves reverse 1..16 before its 260 steps run out
    (at step 240 or 250 on the machines measured: the exact step is the CPU's)."""
    result = run_cli("train", "threads=1", "log.tensorboard=false", "log.attention_every=0",
                     "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    summary = read_summary(tmp_path / "run")
    default = Config().train
    assert summary["status"] == "stopped at target", summary
    assert summary["step"] < default.steps, summary
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    last = [r for r in evals if r["split"] == "eval"][-1]
    assert last["step"] == summary["step"] and last["exact_match"] >= default.target_exact_match
