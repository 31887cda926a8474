"""Every run found by its settings: `minitfm runs --where/--group-by` over lone runs and sweep
folders, written here (config.yaml, summary.json, metrics.jsonl, eval-1-6.json as training and
a sweep's jobs leave them): nothing is trained, a few seconds.

Values compare as typed values (5e-3 is 0.005), each group's figures are the statistics
helpers' own, a key no run has is one line naming the close ones, and the tables fit 80
columns."""

import json
import os
import re
from pathlib import Path

import pytest

from minitfm.lab.many.query import load_records, same
from minitfm.lab.many.stats import mean_interval, rate_interval
from tests.helpers import assert_clean_error, run_cli
from tests.lab.many.fakes import fake_run, fake_sweep


@pytest.fixture
def runs(tmp_path) -> Path:
    """runs/: two lone runs (lr 0.005 and 0.01) and a sweep over lr and seeds 2, 0, 10."""
    root = tmp_path / "runs"
    fake_run(root / "lone-a", ["train.lr=0.005", "seed=7"], None, 0.5, when=1e9)
    fake_run(root / "lone-b", ["train.lr=0.01"], 150, 0.995, when=1.5e9)
    fake_sweep(root / "sweep-x", {f"lr={lr},seed={seed}": [f"train.lr={lr}", f"seed={seed}"]
                                  for lr in ("0.005", "0.01") for seed in (2, 0, 10)})
    return root


def listed(*args) -> list[dict]:
    result = run_cli("runs", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_where_finds_runs_across_lone_runs_and_sweeps_a_sweeps_runs_by_seed(runs):
    names = [row["name"] for row in listed(runs, "--where", "train.lr=0.005")]
    assert names == ["lone-a", *(f"sweep-x/lr=0.005,seed={seed}" for seed in (0, 2, 10))]
    inside = listed(runs / "sweep-x", "--where", "seed=10")  # a sweep folder's own runs
    assert [row["name"] for row in inside] == ["lr=0.005,seed=10", "lr=0.01,seed=10"]
    both = listed(runs, "--where", "train.lr=0.01", "--where", "seed=0")
    assert [row["name"] for row in both] == ["lone-b", "sweep-x/lr=0.01,seed=0"]  # seed 0: the
    assert both[1]["step"] == 104 and both[1]["status"] == "stopped at target"  # default
    assert listed(runs, "--where", "summary.status=finished")[0]["name"] == "lone-a"


def test_where_compares_typed_values(runs):
    """The value is read as an override's: 5e-3 is 0.005, 200.0 is the int 200; a bool is no
    number and text is no number."""
    as_written = listed(runs, "--where", "train.lr=0.005")
    assert listed(runs, "--where", "train.lr=5e-3") == as_written and len(as_written) == 4
    assert len(listed(runs, "--where", "train.steps=200.0")) == 8
    assert same(0.005, 5e-3) and same(200, 200.0) and same("rope", "rope") and same(None, None)
    assert not same(True, 1) and not same(1, True) and not same("0.005", 0.005)
    assert not same(0.005, 0.01) and not same(None, "null")
    none = run_cli("runs", runs, "--where", "train.lr=0.5")
    assert none.exit_code == 0 and none.stdout.startswith("no runs under ") and \
        "(train.lr is 0.005 or 0.01 here)" in none.stdout


def test_group_by_gives_each_groups_figures_as_the_statistics_helpers_do(runs):
    """n counts the runs that ended; held-out exact match and steps are mean_interval's, the
    runs at target rate_interval's (Wilson), a miss counted at its whole run."""
    groups = listed(runs, "--group-by", "train.lr")
    assert [(g["train.lr"], g["runs"], g["n"]) for g in groups] == [(0.005, 4, 4), (0.01, 4, 4)]
    low = groups[0]  # lone-a missed (200 steps, 0.5); the sweep's reached at 100 + i
    exact, steps = [0.5, 0.995, 0.995, 0.995], [200, 100, 101, 102]
    for name, values in (("exact_match held-out", exact), ("steps", steps)):
        interval = mean_interval(values)
        assert [low[f"{name} {end}"] for end in ("mean", "lo", "hi")] == \
            pytest.approx([interval.mean, interval.lo, interval.hi])
    rate = rate_interval(3, 4)
    assert low["reached"] == 3 and [low[f"success_rate {end}"] for end in ("mean", "lo", "hi")] \
        == pytest.approx([rate.mean, rate.lo, rate.hi])
    pairs = listed(runs, "--where", "train.lr=0.01", "--group-by", "seed", "--group-by",
                   "train.lr")
    assert [(g["seed"], g["n"]) for g in pairs] == [(0, 2), (2, 1), (10, 1)]  # lone-b: seed 0
    table = run_cli("runs", runs, "--group-by", "train.lr")
    assert table.exit_code == 0 and ", by train.lr (8 runs)" in table.stdout
    assert "3/4" in table.stdout and "4/4" in table.stdout


@pytest.mark.parametrize("args, needles", [
    (["--where", "lr=0.005"], ["--where 'lr'", "did you mean 'train.lr'?"]),
    (["--group-by", "positional"], ["--group-by 'positional'", "'model.positional'"]),
    (["--group-by", "train.lrr"], ["did you mean 'train.lr'"]),
    (["--where", "nothing.like.it=1"], ["no run under", "has this key", "train.lr"]),
    (["--where", "train.lr"], ["--where 'train.lr' must look like KEY=VALUE"]),
    (["--where", "=0.005"], ["must look like KEY=VALUE"]),
    (["--where", "train.lr=[1, 2]"], ["must give one value"]),
])
def test_a_bad_key_or_item_is_one_line(runs, args, needles):
    assert_clean_error(run_cli("runs", runs, *args), 2, *needles)


def test_the_tables_fit_80_columns(runs, tmp_path, monkeypatch):
    """Long run names and many changes wrap inside their column: piped, where a table takes
    its natural width, no line is over 80 (the old table put each change on a line of its
    own, over 100 columns wide)."""
    fake_sweep(runs / "sweep-positional-and-learning-rate-20261207-101500",
               {"positional=alibi,random_positions=64,lr=0.003,seed=0":
                ["model.positional=alibi", "model.random_positions=64", "train.lr=0.003",
                 "model.d_ff=128", "train.warmup_steps=5", "train.schedule=constant"]})
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(runs.parent)
    for args in ([], ["--where", "seed=0"], ["--group-by", "model.positional", "--group-by",
                                             "train.lr"]):
        result = run_cli("runs", "runs", *args)
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) > 4 and max(map(len, lines)) <= 80, result.stdout
    table = run_cli("runs", "runs").stdout
    assert " sweep-positional-and-learning-rate-202" in table  # folded, not cut
    assert "positional=alibi," in table and "model.positional" not in table  # short names
    assert re.search(r"\n sweep-x/ +\n   copy: n_symbols=5,", table)  # what they share


def test_a_records_keys_are_flat_and_its_gauges_the_last(runs):
    [record] = [r for r in load_records(runs) if r["run"] == "sweep-x/lr=0.01,seed=2"]
    assert record["sweep"] == "sweep-x" and record["status"] == "stopped at target"
    assert record["train.lr"] == 0.01 and record["seed"] == 2 and record["task.name"] == "copy"
    assert record["model.random_positions"] is None  # null in the config: None, not "null"
    assert record["summary.step"] == 103 and record["exact_match"] == 0.995
    assert record["reached"] is True and record["per_length.6"] == pytest.approx(0.935)
    assert record["gauges.step"] == 100 and record["gauges.align"] == 0.1
    assert "gauges.positions" not in record and "gauges.split" not in record


@pytest.mark.parametrize("file, content", [
    ("config.yaml", "a: [\n"), ("config.yaml", "[1]\n"), ("summary.json", "{status"),
    ("metrics.jsonl", '{"step": 1, "split": "gauges", "exact": 7}\n' + "x" * 70_000),
])
def test_a_damaged_run_is_counted_not_crashed_on(runs, file, content):
    (runs / "lone-b" / file).write_text(content)
    [record] = [r for r in load_records(runs) if r["run"] == "lone-b"]
    if file == "metrics.jsonl":  # the summary and config still say it all; no gauges
        assert record["status"] == "stopped at target" and "gauges.step" not in record
    else:
        assert record["status"] == "unreadable" and record["note"]
    result = run_cli("runs", runs, "--group-by", "train.lr")
    assert result.exit_code == 0 and "Traceback" not in result.stdout + result.stderr
    assert "(8 runs)" in result.stdout


def test_a_run_its_search_stopped_is_listed_as_pruned_until_resumed(tmp_path):
    # A pruned run's own summary says `interrupted`, as after Ctrl-C; the search's trials.jsonl
    # names the runs of its pruned trials. A run of a pruned trial that had ended keeps how it
    # ended, and one resumed to its end by hand says how it ended then.
    search = fake_sweep(tmp_path / "search", {f"trial={t:03d},seed={s}": [f"seed={s}"]
                                              for t in (0, 1) for s in (0, 1)})
    for name in ("trial=001,seed=0", "trial=000,seed=1"):  # pruned; the other Ctrl-C'd
        (search / name / "summary.json").write_text(json.dumps({"status": "interrupted",
                                                                "step": 60}))
    trials = [{"trial": 0, "state": "complete", "runs": ["trial=000,seed=0",
                                                         "trial=000,seed=1"]},
              {"trial": 1, "state": "pruned", "runs": ["trial=001,seed=0",
                                                       "trial=001,seed=1"]}]
    (search / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials)
                                         + "{not a trial\n")
    status = {row["name"]: row["status"] for row in listed(search)}
    assert status == {"trial=000,seed=0": "stopped at target",
                      "trial=000,seed=1": "interrupted", "trial=001,seed=0": "pruned",
                      "trial=001,seed=1": "stopped at target"}
    assert [row["name"] for row in listed(search, "--where", "status=pruned")] == [
        "trial=001,seed=0"]
    assert "pruned" in run_cli("runs", search).stdout  # the table's status column
    (search / "trial=001,seed=0" / "summary.json").write_text(json.dumps(
        {"status": "finished", "step": 200}))  # `minitfm train --resume` took it to its end
    assert {row["name"]: row["status"] for row in listed(search)}["trial=001,seed=0"] == \
        "finished"


@pytest.mark.parametrize("hostile", ["link", "nested", "fifo"])
def test_a_searchs_trials_file_is_read_as_a_runs_files_are(tmp_path, hostile):
    # Never through a link nor from a FIFO, a line nested past Python's limit skipped: the run
    # keeps its own summary's status, and nothing hangs or raises.
    search = fake_sweep(tmp_path / "search", {"trial=000": ["seed=0"], "trial=001": ["seed=0"]})
    for name in ("trial=000", "trial=001"):
        (search / name / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    line = json.dumps({"trial": 1, "state": "pruned", "runs": ["trial=001"]}) + "\n"
    if hostile == "link":
        (tmp_path / "elsewhere.jsonl").write_text(line)
        (search / "trials.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    elif hostile == "fifo":
        os.mkfifo(search / "trials.jsonl")
    else:
        (search / "trials.jsonl").write_text("[" * 100_000 + "\n" + line)
    status = {row["name"]: row["status"] for row in listed(search)}
    assert status == {"trial=000": "interrupted",
                      "trial=001": "pruned" if hostile == "nested" else "interrupted"}
