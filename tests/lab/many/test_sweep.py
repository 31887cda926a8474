"""`minitfm sweep` end to end, failures, Ctrl-C and SIGTERM, refused grids and folders,
--dry-run; `minitfm runs`."""

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from minitfm.config import load_config, to_yaml
from minitfm.errors import MinitfmError
from minitfm.lab.many.grid import Grid, RunSpec, plan_runs, run_id
from minitfm.lab.many.scheduler import Command, Job, open_result, stop_message
from minitfm.lab.many.sweep import SweepLock, check_memory, plan_line, prepare, run_sweep
from minitfm.lab.options import SweepOptions
from minitfm.run import limits
from minitfm.run.checkpoint import load_checkpoint
from minitfm.run.summary import read_summary
from minitfm.run.threads import cores
from tests.helpers import TINY, assert_clean_error, assert_clean_errors, given_once, once, run_cli

FAST = [*TINY, "train.steps=20", "train.eval_every=0", "log.tensorboard=false"]
GRID = ["model.positional=sinusoidal,rope", "--seeds", "0,1"]


def sweep(out, *args):
    return run_cli("sweep", *FAST, *args, "--out", out, "--eval-samples", "50")


@pytest.mark.slow
def test_a_2x2_sweep_end_to_end_then_resume_skips_it(tmp_path):
    out = tmp_path / "sw"
    result = sweep(out, *GRID, "--eval-lengths", "7..8")
    assert result.exit_code == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert len(rows) == 4 and {r["seed"] for r in rows} == {0, 1}
    assert {r["model.positional"] for r in rows} == {"sinusoidal", "rope"}
    for row in rows:
        assert row["status"] == "finished" and row["steps"] == 20
        assert set(row["exact_match"]) == {"1..6", "7..8"}
        assert sorted(map(int, row["per_length"])) == list(range(1, 9))
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and "exact_match 7..8" in csv_lines[0]
    assert (out / "results.png").stat().st_size > 0
    assert "exact match 7..8" in result.stdout and "±" in result.stdout  # 2 seeds each
    again = sweep(out, *GRID, "--eval-lengths", "7..8")
    assert again.exit_code == 0 and "4 already done" in again.stdout
    assert all((out / f"{r['run']}.log").read_text().count(" parameters, ") == 1
               for r in rows)  # nothing trained twice


def write_record(plan):
    """The folder and sweep.json that `run_sweep` would leave for `plan`."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    (plan.folder / "sweep.json").write_text(json.dumps(plan.record()))


def test_the_same_grid_finds_its_folder_again(tmp_path):
    grid = ["seed=0,1", "train.steps=2", f"log.dir={tmp_path}"]
    stale = tmp_path / "sweep-default-20260101-000000"  # a folder without sweep.json
    stale.mkdir()
    first = prepare(None, grid)
    assert first.folder.parent == tmp_path and first.folder != stale
    assert not first.folder.exists()
    write_record(first)
    assert prepare(None, grid).folder == first.folder
    other = ["seed=0,2", *grid[1:]]
    new = prepare(None, other).folder
    assert new not in (stale, first.folder) and not new.exists()
    with pytest.raises(MinitfmError, match="holds another sweep"):
        prepare(None, other, SweepOptions(out=first.folder))


def test_an_edited_base_config_never_joins_the_old_folder(tmp_path):
    config = tmp_path / "base.yaml"
    config.write_text("model: {d_model: 16, n_heads: 2}\n")
    grid = ["seed=0,1", f"log.dir={tmp_path / 'runs'}"]
    old = prepare(str(config), grid)
    write_record(old)
    config.write_text("model: {d_model: 32, n_heads: 2}\n")
    new = prepare(str(config), grid)
    assert new.folder != old.folder and not new.folder.exists()
    assert "model.d_model was 16, now 32" in new.note
    dry = run_cli("sweep", config, *grid, "--dry-run")
    assert dry.exit_code == 0 and dry.stderr.startswith("note: the base config changed")
    assert f"{old.folder}/" not in dry.stdout
    assert_clean_error(run_cli("sweep", config, *grid, "--out", old.folder, "--dry-run"), 2,
                       "another base config", "model.d_model was 16, now 32")
    config.write_text("model: {d_model: 16, n_heads: 2}\n")  # restored: resumed
    assert prepare(str(config), grid).folder == old.folder


LONG = [*TINY, "train.steps=100000", "train.eval_every=0", "train.target_exact_match=null",
        "log.log_every=1", "log.tensorboard=false", "train.checkpoint_every=5"]


HANG_S = 300  # a hang guard, not a speed limit: far past any start-up on a busy machine


def wait_for(proc, ready, timeout: float = HANG_S) -> None:
    """Poll until `ready()`; the sweep ending first fails the test (its jobs cannot finish),
    and so does a sweep still not ready after `timeout` s (one job failed at its start, say,
    and the other would run its 100,000 steps)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the sweep was not ready within {timeout} s"
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


@contextmanager
def sweep_process(cmd: list[str]):
    """`cmd` started in a session of its own; if the test fails while it runs, it and its jobs
    (each in a session of its own) are killed: no job outlives the test holding its run."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            for job in children(proc.pid):
                os.killpg(job, signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.slow
@pytest.mark.skipif(cores() < 2, reason="two jobs at once need two cores")
def test_ctrl_c_stops_every_job_with_a_checkpoint_then_sigterm_stops_the_resume(tmp_path):
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "minitfm", *given_once(["sweep", *LONG, "--seeds", "0,1",
                                                         "--jobs", "2", "--out", out,
                                                         "--eval-samples", "20"])]
    checkpoints = [out / f"seed={s}" / "checkpoints" / "last.pt" for s in (0, 1)]
    with sweep_process(cmd) as proc:
        wait_for(proc, lambda: all(p.exists() for p in checkpoints))
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, stderr
    assert stderr == ("interrupted: SIGINT: stopped 2 run(s), each with its "
                      "checkpoints/last.pt; run the same command again to resume\n"), stderr
    stopped = [load_checkpoint(path)["step"] for path in checkpoints]
    for path, step in zip(checkpoints, stopped):
        assert 5 <= step < 100000
        assert read_summary(path.parent.parent)["status"] == "interrupted"
    plan = run_cli("sweep", *LONG, "--seeds", "0,1", "--jobs", "2", "--out", out, "--dry-run")
    assert [line.count(" --resume ") for line in plan.stdout.splitlines()] == [1, 1]
    inodes = [path.stat().st_ino for path in checkpoints]  # each save replaces the file
    with sweep_process(cmd) as proc:
        wait_for(proc, lambda: all(p.stat().st_ino != i for p, i in zip(checkpoints, inodes)))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 143 and stderr.startswith("interrupted: SIGTERM"), stderr
    for path, step in zip(checkpoints, stopped):
        assert step < load_checkpoint(path)["step"] < 100000
        run_dir = path.parent.parent
        assert "--resume" in (run_dir.parent / f"{run_dir.name}.log").read_text()


@pytest.mark.slow
def test_a_failed_job_exits_1_and_the_others_still_give_results(tmp_path):
    out = tmp_path / "sw"
    result = sweep(out, "train.lr=3e-3,1e30")  # 1e30: the loss becomes NaN at once
    assert_clean_error(result, 1, "1 of 2 runs failed (lr=1e30)")
    assert "failed: lr=1e30 (exit 1)" in result.stdout and "loss became nan" in result.stdout
    rows = {row["run"]: row for row in map(json.loads, (out / "results.jsonl").open())}
    assert rows["lr=3e-3"]["status"] == "finished" and rows["lr=3e-3"]["steps"] == 20
    assert rows["lr=3e-3"]["exact_match"]["1..6"] is not None
    assert rows["lr=1e30"]["status"] == "failed"
    assert rows["lr=1e30"]["exact_match"]["1..6"] is None
    assert (out / "results.csv").read_text().count("\n") == 3
    assert (out / "results.png").is_file()


@pytest.mark.slow
def test_the_dry_run_commands_then_out_write_only_the_results(tmp_path):
    out = tmp_path / "sw"
    lines = sweep(out, "seed=3", "--dry-run").stdout.splitlines()
    assert len(lines) == 1 and not out.exists()
    assert subprocess.run(["bash", "-c", lines[0]]).returncode == 0  # as a scheduler would
    result = sweep(out, "seed=3")
    assert result.exit_code == 0, result.stderr
    assert "1 runs (1 already done)" in result.stdout
    assert not (out / "run.log").exists()  # the sweep started no command of its own
    rows = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert len(rows) == 1 and rows[0]["status"] == "finished"
    assert rows[0]["exact_match"]["1..6"] is not None


@pytest.mark.parametrize("grid,needle", [
    (["model.d_modle=32,64"], "model.d_modle"),
    (["train.steps="], "train.steps="),
    (["train.steps=1,,2"], "train.steps=1,,2"),
    (["model.d_model=30,32", "model.n_heads=4"], "model.d_model (30)"),
    (["threads=x,1"], "--threads"),
    (["seed=0,1", "--seeds", "2,3"], "seed"),
    (["seed=0,1", "--eval-lengths", "9"], "--eval-lengths"),
    # M4: a value twice, or two values that make one config, would train into one folder
    (["--seeds", "0,0"], "gives the value '0' twice"),
    (["seed=0,00"], "('0' and '00')"),
    (["train.lr=1,1.0"], "the runs 'lr=1' and 'lr=1.0' have the same config"),
    # L11: a run id longer than a file name may be; a --name too long for the folder
    ([f"log.dir=runs,{'x' * 250}"], "needs a file name of 258 bytes, more than 255"),
    (["seed=0,1", "--name", "n" * 240], "--name has 240 characters"),
    # L8: counted before any run is made
    ([f"seed={','.join(map(str, range(101)))}", f"train.steps={','.join(map(str, range(100)))}"],
     "10,100 runs (101 seed x 100 train.steps): at most 10,000"),
    # L7: every evaluation is checked before the training
    (["seed=0,1", "--eval-lengths", "17..99999999999999999999"], "at most 65,536"),
    (["seed=0,1", "--eval-lengths", "7..65536", "--eval-samples", "100000"],
     "--eval-lengths (65536) needs"),
    (["seed=0,1", "model.positional=learned", "model.max_len=8", "--eval-lengths", "7..9"],
     "--eval-lengths 7..9 needs 10 positions"),
    (["seed=0,1", "model.positional=learned", "model.max_len=6"],  # what train refuses
     "model.max_len (6) is too small for task.max_len (6): sequences need 7 positions"),
    # L10: jobs x threads never above the cores, one thread each included
    (["seed=0,1", "--jobs", str(cores() + 1)], f"--jobs ({cores() + 1}) x --threads (1)"),
])
def test_bad_grids_are_refused_before_anything_starts(tmp_path, monkeypatch, grid, needle):
    monkeypatch.chdir(tmp_path)
    assert_clean_error(run_cli("sweep", *FAST, *grid), 2, needle)
    assert list(tmp_path.iterdir()) == []


def test_two_names_of_one_data_file_are_one_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = ["task.name=pairs", "task.train_path=d.tsv,./d.tsv"]
    assert_clean_error(run_cli("sweep", *grid), 2, "have the same config")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("values", [
    ("d/a.tsv", "d_a.tsv", "d%2Fa.tsv", "d a.tsv", "d_.tsv", "dé.tsv", "d%C3%A9.tsv"),
    ("0.5", "0_5", ".5", "0%2E5"),
])
def test_run_ids_are_file_names_that_never_collide(values):
    ids = [run_id({"task.train_path": value}) for value in values]
    assert len(set(ids)) == len(ids), ids
    assert all(re.fullmatch(r"[A-Za-z0-9_.,=+%-]+", i) for i in ids), ids


def files_under(folder):
    """Every path under `folder` with its bytes (None for a folder): to see that nothing moved."""
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def plant(kind: str, out) -> None:
    """What `--out` holds before the sweep (see test_out_that_is_no_sweep_folder_is_refused)."""
    if kind == "user files":
        out.mkdir()
        (out / "results.csv").write_text("my precious results")
    elif kind in ("a run", "inside a run"):
        run = out if kind == "a run" else out.parent
        run.mkdir()
        (run / "config.yaml").write_text(to_yaml(load_config(None)))
    elif kind in ("a file", "under a file"):
        (out if kind == "a file" else out.parent).write_text("hi")
    elif kind == "a broken sweep.json":
        out.mkdir()
        (out / "sweep.json").write_text("{")
    elif kind == "another sweep":
        out.mkdir()
        grid = {"config": None, "swept": [["seed", ["5", "6"]]], "fixed": []}
        (out / "sweep.json").write_text(json.dumps({"grid": grid}))


@pytest.mark.parametrize("kind,where,needle", [
    ("user files", "sw", "holds 'results.csv', which is no part of this sweep"),
    ("a run", "sw", "is a run directory or inside one"),
    ("inside a run", "run/sw", "is a run directory or inside one"),
    ("a file", "sw", "is not a folder"),
    ("under a file", "f/sw", "'{tmp}/f' is not a folder"),
    ("a broken sweep.json", "sw", "holds 'sweep.json', which is no part of this sweep"),
    ("another sweep", "sw", "holds another sweep"),
])
def test_out_that_is_no_sweep_folder_is_refused(tmp_path, kind, where, needle):
    out = tmp_path / where
    plant(kind, out)
    before = files_under(tmp_path)
    result = sweep(out, "seed=0,1")  # a real sweep, not --dry-run: it must write nothing
    assert_clean_error(result, 2, needle.format(tmp=tmp_path))
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("entries", [(), (".lock",), ("seed=0/", "seed=0.log")])
def test_out_may_be_empty_or_hold_this_sweeps_own_runs(tmp_path, entries):
    out = tmp_path / "sw"
    out.mkdir()
    for name in entries:  # what a sweep killed at its start, or its --dry-run's commands, left
        (out / name).mkdir() if name.endswith("/") else (out / name).write_text("")
    result = sweep(out, "seed=0,1", "--dry-run")
    assert result.exit_code == 0 and result.stdout.count(f"--run-dir {out}/seed=") == 2


def test_a_config_name_with_other_characters_names_a_folder(tmp_path):
    config = tmp_path / "my copy (2).yaml"
    config.write_text("task: {name: copy}\n")
    result = run_cli("sweep", config, *FAST, f"log.dir={tmp_path / 'runs'}", "seed=0,1",
                     "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count(f"--run-dir {tmp_path / 'runs'}/sweep-my_copy__2_-") == 2


def test_a_second_sweep_in_a_folder_in_use_is_refused(tmp_path):
    out = tmp_path / "sw"
    with SweepLock(out):
        assert_clean_error(sweep(out, "seed=0,1"), 2, "is in use by another sweep")
    assert [p.name for p in out.iterdir()] == [".lock"]
    command = Command(["true"], out / "eval-1-6.json")
    names = []
    for _ in range(2):  # each command's output has a temp file of its own, never a fixed name
        with open_result(command):
            names.append(command.tmp.name)
    assert names[0] != names[1] and all(n.startswith(".eval-1-6.json.") for n in names)


def test_jobs_that_together_exceed_the_memory_are_refused(monkeypatch):
    runs, _ = plan_runs(Grid(None, [("seed", ["0", "1"])], [*FAST]), threads=1)
    monkeypatch.setattr(limits, "available_bytes", lambda: 500_000_000)
    check_memory(runs, 1)  # one at a time fits
    with pytest.raises(MinitfmError, match=r"--jobs \(2\) needs ~6\d\d\.\d MB for 2 runs at once"):
        check_memory(runs, 2)


@pytest.mark.parametrize("saved,message", [
    ((), "no job was running; run the same command again to resume"),
    ((False, False), "stopped 2 run(s) before any saved a checkpoint; run the same "
                     "command again to start them again"),
    ((True, False), "stopped 2 runs, 1 with checkpoints/last.pt (the others had saved "
                    "none yet); run the same command again to resume"),
    ((True, True), "stopped 2 run(s), each with its checkpoints/last.pt; run the same "
                   "command again to resume"),
])
def test_a_stopped_sweep_says_which_checkpoints_exist(tmp_path, saved, message):
    jobs = []
    for seed, has in enumerate(saved):
        run_dir = tmp_path / f"seed={seed}"
        (run_dir / "checkpoints").mkdir(parents=True)
        if has:
            (run_dir / "checkpoints" / "last.pt").write_bytes(b"")
        jobs.append(Job(RunSpec(f"seed={seed}", {}, [], load_config(None), run_dir), []))
    assert stop_message(signal.SIGINT, jobs) == f"SIGINT: {message}"


def test_dry_run_prints_one_shell_line_per_run(tmp_path):
    out = tmp_path / "sw"
    result = sweep(out, *GRID, "--eval-lengths", "7..8", "--dry-run")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and not out.exists()
    for line in lines:
        assert subprocess.run(["bash", "-n", "-c", line]).returncode == 0
        words = shlex.split(line)
        assert words[1:5] == ["-P", "-m", "minitfm", "train"] and "threads=1" in words
        assert words.count("eval") == 2 and "positional=" in line


def test_runs_lists_finished_interrupted_and_swept_runs(tmp_path):
    root = tmp_path / "runs"
    assert run_cli("train", *FAST, "--run-dir", root / "done").exit_code == 0
    stopped = run_cli("train", *FAST, "train.checkpoint_every=5", "--run-dir", root / "cut")
    assert stopped.exit_code == 0
    (root / "cut" / "summary.json").unlink()  # as if killed: a checkpoint, no summary
    (root / "sweep-x").mkdir()
    (root / "sweep-x" / "sweep.json").write_text("{}")
    shutil.copytree(root / "done", root / "sweep-x" / "seed=0")
    result = run_cli("runs", root, "--json")
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"done", "cut", "sweep-x/seed=0"}
    assert rows["done"]["status"] == "finished" and rows["done"]["step"] == 20
    assert rows["cut"]["status"] == "interrupted"
    assert rows["done"]["task"] == "copy" and rows["done"]["changes"]["model.d_model"] == 32
    assert "threads" not in rows["done"]["changes"] and "name" not in rows["done"]["changes"]
    table = run_cli("runs", root)
    assert table.exit_code == 0 and "interrupted" in table.stdout
    inside = json.loads(run_cli("runs", root / "sweep-x", "--json").stdout)
    assert [row["name"] for row in inside] == ["seed=0"]
    assert_clean_error(run_cli("runs", tmp_path / "nowhere"), 2, "nowhere")


def test_skip_invalid_leaves_out_the_impossible_combinations(tmp_path):
    grid = ["model.positional=none,rope", "model.random_positions=null,64"]
    assert_clean_error(sweep(tmp_path / "sw", *grid, "--dry-run"), 2, "model.random_positions")
    result = sweep(tmp_path / "sw", *grid, "--dry-run", "--skip-invalid")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and not any("positional=none,random_positions=64" in x for x in lines)


def fake_row(tmp_path, name, configuration, seed, exact, per_length):
    """A results.jsonl row whose run directory holds held-out exact matches at steps 50, 100."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": 50 * (i + 1), "split": "eval", "loss": 1.0, "exact_match": e}) + "\n"
        for i, e in enumerate(exact)))
    return {"run": name, "run_dir": str(run_dir), "seed": seed, "configuration": configuration,
            "trained_lengths": [1, 6], "per_length": per_length, "exact_match": {}}


def test_results_picture_shows_exact_match_over_training_and_lengths_only_when_beyond(tmp_path):
    from minitfm.lab.many.results import results_figure
    from minitfm.lab.pictures import LINE_COLOURS

    rows = [fake_row(tmp_path, f"r{i}", f"model.positional={p}", seed, [0.1 * (i + 1), 1.0],
                     {6: 1.0}) for i, (p, seed) in enumerate(
                         [("sinusoidal", 0), ("sinusoidal", 1), ("rope", 0)])]
    (curves,) = results_figure(rows).get_axes()  # within the trained lengths: no length panel
    lines = curves.get_lines()
    assert [list(line.get_xdata()) for line in lines] == [[50, 100]] * 3  # a line per run
    assert [line.get_ydata()[0] for line in lines] == pytest.approx([0.1, 0.2, 0.3])
    colours = [line.get_color() for line in lines]
    assert colours == [LINE_COLOURS[0], LINE_COLOURS[0], LINE_COLOURS[1]]  # seeds share one
    assert [t.get_text() for t in curves.get_legend().get_texts()] == [
        "positional=sinusoidal", "positional=rope"]
    for row in rows:
        row["per_length"] = {6: 1.0, 8: 0.2}
    curves, lengths = results_figure(rows).get_axes()[:2]
    assert lengths.get_xlabel() == "input length" and len(lengths.get_lines()) == 2


def gauged_row(tmp_path, name, configuration, seed):
    """`fake_row` whose run also read its gauges every 10 steps (exact match rising by 0.1)."""
    row = fake_row(tmp_path, name, configuration, seed, [0.4, 0.9], {6: 1.0})
    with open(Path(row["run_dir"]) / "metrics.jsonl", "a") as f:
        for step in range(10, 101, 10):
            f.write(json.dumps({"step": step, "split": "gauges", "exact": step / 100,
                                "loss": 1.0, "token_accuracy": 0.5}) + "\n")
    return row


def test_results_picture_draws_the_gauges_curves_and_the_evaluations_as_points(tmp_path):
    """Not the three evaluations of a run joined by straight lines: the gauges' readings as a
    line, the evaluations as points over it, in the run's configuration's colour."""
    from minitfm.lab.many.results import results_figure
    from minitfm.lab.pictures import LINE_COLOURS

    rows = [gauged_row(tmp_path, f"r{i}", f"model.positional={p}", 0)
            for i, p in enumerate(["sinusoidal", "rope"])]
    (curves,) = results_figure(rows).get_axes()
    lines = curves.get_lines()
    assert len(lines) == 4  # per run: the gauges' line, the evaluations' points
    for i, (gauges, evals) in enumerate(zip(lines[::2], lines[1::2], strict=True)):
        assert gauges.get_xdata().tolist() == list(range(10, 101, 10))
        assert gauges.get_ydata().tolist() == pytest.approx([s / 100 for s in range(10, 101, 10)])
        assert gauges.get_linestyle() == "-" and gauges.get_marker() == "None"
        assert evals.get_xdata().tolist() == [50, 100] and evals.get_linestyle() == "None"
        assert gauges.get_color() == evals.get_color() == LINE_COLOURS[i]
    assert [t.get_text() for t in curves.get_legend().get_texts()] == [
        "positional=sinusoidal", "positional=rope"]


def test_a_sweep_of_seeds_alone_is_labelled_by_its_seeds_not_all(tmp_path):
    from minitfm.lab.many.results import results_figure

    rows = [gauged_row(tmp_path, f"seed={s}", "all", s) for s in range(3)]
    (curves,) = results_figure(rows).get_axes()
    assert [t.get_text() for t in curves.get_legend().get_texts()] == ["seeds 0..2"]


def test_many_configurations_are_small_multiples_a_style_meaning_one_family(tmp_path):
    """The lengthgen sweep's 18 configurations (docs/lengthgen.png): a column per positional
    scheme, each line's colour its task and its dash its random positions, the same in every
    column; every text inside the picture."""
    from minitfm.lab.many.results import results_figure
    from tests.lab.attention.test_viz import texts_outside

    schemes = ["sinusoidal", "learned", "rope", "alibi", "none"]
    rows = [fake_row(tmp_path, f"{task}-{scheme}-{spread}",
                     f"task.name={task}, model.positional={scheme}, "
                     f"model.random_positions={spread}", 0, [0.5, 1.0], {6: 1.0, 9: 0.5})
            for task in ("copy", "reverse") for scheme in schemes for spread in ("null", "64")
            if not (scheme == "none" and spread == "64")]
    fig = results_figure(rows)
    top = fig.get_axes()[:len(schemes)]
    assert [ax.get_title() for ax in top] == [f"positional={s}" for s in schemes]
    styles = {}
    for ax in fig.get_axes():
        for line in ax.get_lines():
            style = (line.get_color(), line.get_linestyle())
            styles.setdefault(line.get_label(), set()).add(style)
    families = [f"task={t}, random_positions={r}"
                for t in ("copy", "reverse") for r in ("null", "64")]
    assert set(styles) == set(families)
    assert all(len(found) == 1 for found in styles.values())  # one style per family everywhere
    (copy_null,), (copy_64,), (reverse_null,), _ = (styles[f] for f in families)
    assert copy_null[0] == copy_64[0] != reverse_null[0] and copy_null[1] != copy_64[1]
    assert max(len(ax.get_lines()) for ax in fig.get_axes()) == 4
    assert [t.get_text() for t in top[-1].get_legend().get_texts()] == [
        *families, "trained lengths 1..6"]
    assert texts_outside(fig) == []


def test_a_swept_task_is_labelled_task_not_name():
    from minitfm.lab.many.runs import short_label

    assert short_label("task.name=copy, model.positional=rope") == "task=copy, positional=rope"


# --- stacks: what the sweep does, and says it does (#55: adversarial M8, newcomer 3) ---

def done(plan, stacked: bool) -> None:
    """Each run of `plan` as a finished run that trained alone (or stacked), evaluated."""
    for spec in plan.runs:
        spec.run_dir.mkdir(parents=True)
        summary = {"status": "finished", "step": 20, "steps": 20, **({"stack": 2} if stacked
                                                                      else {})}
        (spec.run_dir / "summary.json").write_text(json.dumps(summary))
        (spec.run_dir / "eval-1-6.json").write_text('{"exact_match": 1.0, "per_length": {}}')


def test_stack_with_as_many_jobs_as_runs_still_stacks_them_and_the_dry_run_agrees(tmp_path):
    """`--stack --jobs 2` with two runs of one shape trained each alone and said "not stacked:
    as asked (--stack)": a stack holds two runs or more, fewer jobs than asked; the dry run's
    note says the same (its lines train each run alone: other schedulers take them)."""
    out = tmp_path / "sw"
    plan = prepare(None, [*once(FAST), "seed=0,1"], SweepOptions(jobs=2, stack=True, out=out))
    assert [[spec.id for spec in stack] for stack in plan.stacks] == [["seed=0", "seed=1"]]
    jobs = plan.jobs()
    assert [[spec.id for spec in job.specs] for job in jobs] == [["seed=0", "seed=1"]]
    assert plan_line(plan, jobs) == (
        "2 runs (0 already done) in 1 stack of 2 runs, 1 at a time, 1 thread each; stacked: as "
        "asked (--stack); 1 at a time rather than 2: a stack holds two runs or more")
    dry = sweep(out, "seed=0,1", "--jobs", "2", "--stack", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stderr == ("note: these lines train each run alone; minitfm sweep itself would "
                          "train them in 1 stack of 2 runs; stacked: as asked (--stack)\n")
    assert [shlex.split(line)[4] for line in dry.stdout.splitlines()] == ["train", "train"]


def test_stacks_the_memory_cannot_hold_are_said_so_never_as_asked(tmp_path, monkeypatch):
    from minitfm.lab.many import stacking

    runs, _ = plan_runs(Grid(None, [("seed", ["0", "1"])], once(FAST)), threads=1)
    per_run = sum(size for _, _, size in limits.training_parts(runs[0].cfg))
    monkeypatch.setattr(stacking, "available_bytes",
                        lambda: 2 * (stacking.PROCESS_BYTES + per_run) + per_run // 2)
    plan = prepare(None, [*once(FAST), "seed=0,1"], SweepOptions(jobs=2, stack=True,
                                                                 out=tmp_path / "sw"))
    assert plan.stacks == [] and len(plan.jobs()) == 2
    assert plan_line(plan, plan.jobs()) == (
        "2 runs (0 already done), 2 at a time, 1 thread each; not stacked: the memory holds one "
        "run of each shape per job at 2 jobs at once; lower --jobs to make room for stacks")


def test_a_finished_sweep_asked_to_stack_trains_nothing_again_and_says_so(tmp_path):
    """`sweep --stack` of a finished sweep trained alone finds its folder (the same grid and
    config) and reuses its runs: it says they were trained alone, that nothing is left to
    stack, and how to get a stacked sweep; the other way round likewise."""
    grid = [*once(FAST), "seed=0,1", f"log.dir={tmp_path}"]
    plan = prepare(None, grid, SweepOptions(stack=True))
    write_record(plan)
    done(plan, stacked=False)
    again = prepare(None, grid, SweepOptions(stack=True))
    assert again.folder == plan.folder and again.stacks
    jobs = again.jobs()
    assert not any(job.commands for job in jobs)
    assert plan_line(again, jobs) == (
        "2 runs (2 already done, trained alone): nothing left to train, so nothing to stack; "
        "to train them stacked, give a --name (a sweep folder of its own)")
    alone = prepare(None, grid, SweepOptions(stack=False))
    assert plan_line(alone, alone.jobs()) == "2 runs (2 already done): nothing left to train"
    for spec in plan.runs:
        (spec.run_dir / "summary.json").write_text('{"status": "finished", "stack": 2}')
    assert plan_line(alone, alone.jobs()) == \
        "2 runs (2 already done, trained stacked): nothing left to train"
    assert plan_line(again, again.jobs()) == \
        "2 runs (2 already done): nothing left to train, so nothing to stack"


# --- mistakes of the grid: each key once, seeds as ranges, the words of a message (#55) ---

@pytest.mark.parametrize("grid, needles", [
    (["train.steps=20", "train.steps=20,30"],  # L3: fixed and swept
     ["train.steps is given twice (20 and 20,30): give it once; to sweep it, list its values "
      "in one item: train.steps=20,30"]),
    (["seed=1", "seed=2"], ["seed is given twice (1, 2): give it once; to sweep it, list its "
                            "values in one item: seed=1,2"]),
    (["model.d_model=16", "model.d_model=32", "seed=0,1", "seed=2,3"],
     ["model.d_model is given twice (16, 32)", "seed is given twice (0,1 and 2,3)"]),
])
def test_a_key_given_twice_in_a_grid_is_refused(tmp_path, monkeypatch, grid, needles):
    """L2, L3: the last one won without a word (a swept value over a fixed one too)."""
    monkeypatch.chdir(tmp_path)
    assert_clean_errors(run_cli("sweep", "configs/copy.yaml", *grid, "--dry-run",
                                as_typed=True), 2, *needles)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, needle", [
    (["--seeds", "0-7"], "--seeds ('0-7'): write a range as 0..7 (A..B, both ends included)"),
    (["--seeds", "3,-2-5"], "write a range as -2..5"),
    (["seed=0..7"], "seed=0..7: seed= takes seeds one by one (seed=0,1,2); give a range as "
                    "--seeds 0..7"),
    (["--seed", "0..7"], "no option --seed: give the seeds as --seeds 0..7"),
])
def test_a_range_of_seeds_written_otherwise_gets_the_hint_that_works(tmp_path, monkeypatch,
                                                                    args, needle):
    monkeypatch.chdir(tmp_path)
    assert_clean_error(run_cli("sweep", *FAST, *args, "--dry-run"), 2, needle)
    followed = run_cli("sweep", *FAST, "--seeds", "0..7", "--dry-run")  # the hint, followed
    assert followed.exit_code == 0 and len(followed.stdout.splitlines()) == 8


def test_a_grid_of_one_run_is_named_the_run(tmp_path, monkeypatch):
    """A grid without values has one run, whose folder is `run`: "but the run 'run' learns"
    read badly."""
    monkeypatch.chdir(tmp_path)
    result = run_cli("sweep", *FAST, "model.positional=learned", "model.max_len=8",
                     "--eval-lengths", "7..9", "--dry-run")
    assert_clean_error(result, 2, "needs 10 positions but the run learns 8 (model.max_len)")


def test_the_dry_run_says_what_skip_invalid_left_out(tmp_path):
    """As the sweep itself does (`skipped (invalid) ...`), on stderr: stdout is the lines."""
    result = sweep(tmp_path / "sw", "model.positional=none,rope", "model.random_positions=64",
                   "--skip-invalid", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 and "positional=rope" in result.stdout
    assert result.stderr.startswith("note: skipped (invalid) positional=none: "
                                    "model.random_positions (64) needs positions to randomize")
    assert len(result.stderr.splitlines()) == 1


# --- a sweep names what it varied and what it fixed (#57 item 1) ---

def tiny_config(tmp_path) -> Path:
    """FAST as a config file, `tiny.yaml`: a sweep of it changes only what its grid says."""
    config = tmp_path / "tiny.yaml"
    config.write_text(to_yaml(load_config(None, once(FAST))))
    return config


@pytest.mark.parametrize("grid, named", [
    (["seed=0,1"], "sweep-tiny"),  # no override: the name of old
    (["train.lr=0.005", "seed=0,1"], "sweep-tiny-lr0.005"),  # newcomer §2: sweep-reverse-<stamp>
    (["train.lr=3e-3", "seed=0,1"], "sweep-tiny"),  # the file's own value: nothing changed
    (["seed=3"], "sweep-tiny"),  # seeds are never named, fixed or swept
    (["name=x", "seed=0,1"], "sweep-tiny"),  # what a run is called, not what it trains
    (["train.lr=0.01,0.005", "train.steps=30", "seed=0,1"], "sweep-tiny-lr0.01,0.005-steps30"),
    (["task.name=reverse", "model.positional=rope"], "sweep-tiny-taskreverse-positionalrope"),
    (["model.max_len=64", "task.max_len=5"], "sweep-tiny-model.max_len64-task.max_len5"),
])
def test_a_sweep_folder_is_named_by_what_its_grid_changes_in_the_config(tmp_path, grid, named):
    config = tiny_config(tmp_path)
    plan = prepare(str(config), [*grid, f"log.dir={tmp_path / 'runs'}"])
    assert plan.folder.parent == tmp_path / "runs"
    assert re.fullmatch(re.escape(named) + r"-\d{8}-\d{6}", plan.folder.name), plan.folder.name


def test_the_changes_are_a_file_name_escaped_as_a_run_id_is():
    from minitfm.lab.many.grid import grid_text

    grid = Grid(None, [("task.train_path", ["d é.tsv", "a/b.tsv"]), ("seed", ["0", "1"])], [])
    assert grid_text(grid, {"task.name": "pairs"}, 200) == \
        "train_pathd%20%C3%A9.tsv,a%2Fb.tsv-taskpairs"
    assert grid_text(grid, {"task.name": "pairs"}, 30) == "and2more"
    assert grid_text(grid, {"task.name": "pairs"}, 7) == ""


def test_a_long_list_of_changes_is_cut_with_a_mark_and_the_name_fits_a_file_name(tmp_path):
    config = tiny_config(tmp_path)
    grid = ["train.lr=0.005", "train.steps=30", "model.d_ff=128", "train.warmup_steps=3",
            "train.batch_size=8", "task.n_symbols=7", f"log.dir={tmp_path / 'runs'}"]
    whole = prepare(str(config), grid).folder.name
    assert whole.startswith("sweep-tiny-lr0.005-steps30-d_ff128-warmup_steps3-batch_size8-"
                            "n_symbols7-")
    cut = {190: "-lr0.005-steps30-d_ff128-and3more", 200: "-lr0.005-steps30-and4more",
           221: "-and6more", 222: "", 230: ""}  # 230: the longest --name, no room for a mark
    for length, changes in cut.items():
        name = "n" * length
        folder = prepare(str(config), grid, SweepOptions(name=name)).folder.name
        assert re.fullmatch(f"sweep-{name}{changes}" + r"-\d{8}-\d{6}", folder), folder
        assert len(f"{folder}-99".encode()) <= 255  # -99: a name taken in that second


def test_a_named_sweep_is_found_again_and_an_old_folder_of_its_grid_resumed(tmp_path):
    """The folder is found again by its grid (resume): one an older minitfm named
    `sweep-<name>-<stamp>` too, the newest by its stamp, never another name's (`--name tiny-x`,
    the same grid: `sweep-tiny-x-...` begins as `sweep-tiny-...` does)."""
    config = tiny_config(tmp_path)
    grid = ["train.lr=0.005", "seed=0,1", f"log.dir={tmp_path / 'runs'}"]
    first = prepare(str(config), grid)
    write_record(first)
    other = prepare(str(config), grid, SweepOptions(name="tiny-x"))  # the same grid, named
    write_record(other)
    assert other.folder != first.folder
    assert prepare(str(config), grid).folder == first.folder
    assert other.folder.name.startswith("sweep-tiny-x-lr0.005-")
    old = tmp_path / "runs" / "sweep-tiny-20990101-000000"  # a later one, as named of old
    old.mkdir()
    (old / "sweep.json").write_text((first.folder / "sweep.json").read_text())
    assert prepare(str(config), grid).folder == old
    old_2 = tmp_path / "runs" / "sweep-tiny-lr0.005-20990101-000000-2"  # taken at that second
    old_2.mkdir()
    (old_2 / "sweep.json").write_text((first.folder / "sweep.json").read_text())
    assert prepare(str(config), grid).folder == old_2
    assert prepare(str(config), grid, SweepOptions(name="tiny-x")).folder == other.folder


def test_results_and_configurations_have_a_column_for_every_changed_key(tmp_path):
    """Newcomer §2: the lr sweep's results.csv had no lr column (a fixed key is not swept)."""
    config = tiny_config(tmp_path)
    grid = ["model.positional=sinusoidal,rope", "train.lr=0.005", "train.steps=20",
            "seed=0,1", f"log.dir={tmp_path / 'runs'}"]
    plan = prepare(str(config), grid)
    done(plan, stacked=False)
    run_sweep(plan, lambda line: None)  # every run done: nothing trained, the results written
    results = list(csv.reader((plan.folder / "results.csv").open()))
    assert results[0][:5] == ["run", "model.positional", "seed", "train.lr", "status"]
    assert {row[3] for row in results[1:]} == {"0.005"}
    rows = [json.loads(line) for line in (plan.folder / "results.jsonl").open()]
    assert all(row["train.lr"] == 0.005 and "train.steps" not in row for row in rows)
    table = list(csv.DictReader((plan.folder / "configurations.csv").open()))
    assert [(row["model.positional"], row["train.lr"]) for row in table] == \
        [("sinusoidal", "0.005"), ("rope", "0.005")]
    assert "train.steps" not in table[0] and "seed" not in table[0]


@pytest.mark.slow
def test_the_lr_study_says_its_lr_in_folders_results_and_compare(tmp_path):
    """Newcomer §2 end to end: a sweep of the config and one with train.lr fixed, then compare
    of a configuration of each: the folders, results.csv and compare's title name the lr;
    the same command again resumes its folder."""
    config, runs = tiny_config(tmp_path), tmp_path / "runs"
    common = ["--seeds", "0,1", "--eval-samples", "50", f"log.dir={runs}"]
    for grid in ([], ["train.lr=0.01"]):
        result = run_cli("sweep", config, *grid, *common)
        assert result.exit_code == 0, result.stdout + result.stderr
    (plain,) = [p for p in runs.iterdir() if re.fullmatch(r"sweep-tiny-\d{8}-\d{6}", p.name)]
    (tuned,) = runs.glob("sweep-tiny-lr0.01-*")
    header = (tuned / "results.csv").read_text().splitlines()[0]
    assert header.startswith("run,seed,train.lr,status,")
    assert "train.lr" not in (plain / "results.csv").read_text()
    result = run_cli("compare", plain, "1", tuned, "1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "A: #1 all (n = 2), train.lr=0.003  vs  B: #1 all (n = 2), train.lr=0.01, paired by "
        "seed (2 seeds)")
    report = json.loads(run_cli("compare", "--a", plain, "--b", tuned, "--json").stdout)
    assert report["differs"] == {"train.lr": {"a": [0.003], "b": [0.01]}}
    again = run_cli("sweep", config, "train.lr=0.01", *common)
    assert again.exit_code == 0 and "2 runs (2 already done)" in again.stdout
    assert tuned.name in again.stdout  # "sweep folder: ..."
    assert len(list(runs.iterdir())) == 2
