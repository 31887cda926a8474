"""A search run end to end: its trials drawn, run and told; its tables; more trials continue it;
Ctrl-C and the same command again end as an uninterrupted search; a hopeless trial pruned."""

import json
import signal
import subprocess
import sys
import time

import pytest

from minitfm.lab.many.trials import TRIALS_FILE
from tests.helpers import TINY, once, run_cli

optuna = pytest.importorskip("optuna")

FAST = once([*TINY, "train.steps=20", "train.eval_every=0", "log.tensorboard=false",
             "log.gauge_every=5"])
SPACE = ["train.lr=tag(log,interval(3e-3,3e-2))", "train.warmup_steps=range(0,11,5)"]


def search(out, *args, base=FAST):
    return run_cli("sweep", *base, *SPACE, "--seeds", "0,1", *args, "--out", out,
                   "--eval-samples", "20")


def trials_of(out):
    return [json.loads(line) for line in (out / TRIALS_FILE).open()]


def trained(out, run):
    """How many times the run's log says it started training."""
    return (out / f"{run}.log").read_text().count(" parameters, ")


@pytest.mark.slow
def test_a_search_end_to_end_then_more_trials_continue_it(tmp_path):
    out = tmp_path / "s"
    result = search(out, "--trials", "2")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "search of 2 trials (0 done), 2 seeds each" in result.stdout
    assert "objective: fewest steps to 99% exact match (mean of 2 seeds" in result.stdout
    rows = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert [(r["trial"], r["seed"]) for r in rows] == [(t, s) for t in range(2) for s in (0, 1)]
    assert all(r["trial_state"] == "complete" and r["steps"] == 20 for r in rows)
    trials = trials_of(out)
    assert [t["state"] for t in trials] == ["complete"] * 2 and sum(t["best"] for t in trials) == 1
    for trial, pair in zip(trials, zip(rows[::2], rows[1::2])):
        lr = float(trial["values"]["train.lr"])
        assert 3e-3 <= lr <= 3e-2 and trial["values"]["train.warmup_steps"] in ("0", "5", "10")
        assert all(r["train.lr"] == lr for r in pair)  # the run trained the value drawn
        assert trial["objective"] == pytest.approx(sum(  # short of 99% in 20 steps, by the
            20 * (1 + (0.99 - r["exact_match"]["1..6"]) / 0.99) for r in pair) / 2)  # table's
    study = optuna.load_study(study_name="minitfm", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.value for t in study.trials] == pytest.approx([t["objective"] for t in trials])
    assert "2 trials: 2 complete; best: trial" in result.stdout
    header = (out / "results.csv").read_text().splitlines()[0]
    assert header.startswith("run,trial,trial_state,objective,pruned,train.lr,train.warmup_steps,"
                             "seed,")
    more = search(out, "--trials", "3")
    assert more.exit_code == 0 and "search of 3 trials (2 done)" in more.stdout
    assert len(trials_of(out)) == 3
    assert all(trained(out, r["run"]) == 1 for r in rows)  # no finished trial trained again
    listed = run_cli("runs", out)
    assert listed.exit_code == 0 and "trial=002,seed=1" in listed.stdout
    compared = run_cli("compare", out, "0", "trial=1")  # by the trials' numbers
    assert compared.exit_code == 0, compared.stdout + compared.stderr
    assert "trial=0, lr=" in compared.stdout and "trial=1, lr=" in compared.stdout
    assert "A: trial=0, lr=" in compared.stdout  # its number is the trial's: no `#1` before it
    wrong = run_cli("compare", out, "0", "9")
    assert wrong.exit_code == 2 and "its trial's number in the search's table" in wrong.stderr


@pytest.mark.slow
def test_stopped_and_run_again_it_ends_as_an_uninterrupted_search(tmp_path):
    base = once([*TINY, "train.steps=60", "train.eval_every=0", "log.tensorboard=false",
                 "train.checkpoint_every=10"])
    whole = search(tmp_path / "whole", "--trials", "2", base=base)
    assert whole.exit_code == 0, whole.stdout + whole.stderr
    out = tmp_path / "cut"
    argv = [sys.executable, "-m", "minitfm", "sweep", *once([*base, *SPACE]), "--seeds", "0,1",
            "--trials", "2", "--out", str(out), "--eval-samples", "20"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "trial=001,seed=0" / "checkpoints" / "last.pt").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "run the same command again to resume" in stderr
    again = search(out, "--trials", "2", base=base)
    assert again.exit_code == 0 and "1 to resume" in again.stdout, again.stdout
    cut, uncut = trials_of(out), trials_of(tmp_path / "whole")
    keys = ("trial", "state", "values", "objective", "steps")
    assert [{k: t[k] for k in keys} for t in cut] == [{k: t[k] for k in keys} for t in uncut]
    assert trained(out, "trial=000,seed=0") == 1  # told before the signal: never redone


@pytest.mark.slow  # a run of up to 200 steps
def test_a_hopeless_trial_is_pruned_with_the_forecast_s_words_and_kept(tmp_path):
    out = tmp_path / "s"
    base = once([*TINY, "log.tensorboard=false", "train.eval_every=100"])
    result = run_cli("sweep", *base, "train.lr=tag(log,interval(1e-6,2e-6))", "--seeds", "0",
                     "--trials", "1", "--prune", "forecast", "--out", out,
                     "--eval-samples", "20")
    assert result.exit_code == 0, result.stdout + result.stderr
    (trial,) = trials_of(out)
    assert trial["state"] == "pruned" and trial["objective"] is None
    assert trial["pruned"].startswith("pruned at step ") and "short of 99%" in trial["pruned"]
    step = int(trial["pruned"].split()[3].rstrip(":"))
    assert step < 200  # stopped early
    assert trial["runs"] == ["trial=000"]  # one seed: fixed, not a part of the run's name
    run = out / "trial=000"
    assert (run / "checkpoints" / "last.pt").is_file()  # resumable to its end by hand
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and step <= summary["step"] < 200
    assert "1 trials: 1 pruned; none complete" in result.stdout
    (row,) = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert row["trial_state"] == "pruned" and row["pruned"] == trial["pruned"]
    assert row["status"] == "pruned"  # results.csv as `runs` says it, not `interrupted`
    compared = run_cli("compare", out, "0", out / "trial=000")
    assert "trial=000 (pruned)" in compared.stderr, compared.stderr
    configurations = (out / "configurations.csv").read_text().splitlines()
    assert configurations[1].startswith("0,")  # `#`: the trial's number, as compare takes it
    listed = run_cli("runs", out, "--where", "status=pruned", "--json")
    assert [r["name"] for r in json.loads(listed.stdout)] == ["trial=000"], listed.stderr
