"""`minitfm sweep` end to end, resume, Ctrl-C, bad grids and --dry-run; `minitfm runs`."""

import json
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from minitfm.errors import MinitfmError
from minitfm.lab.sweep import Grid, sweep_folder
from minitfm.run.checkpoint import load_checkpoint
from minitfm.run.rundir import read_summary
from tests.helpers import TINY, assert_clean_error, run_cli

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


def test_the_same_grid_finds_its_folder_again(tmp_path):
    grid = Grid(None, [("seed", ["0", "1"])], ["train.steps=2"])
    (tmp_path / "sweep-s-20260101-000000").mkdir()
    old = tmp_path / "sweep-s-20260102-000000"
    old.mkdir()
    (old / "sweep.json").write_text(json.dumps({"grid": grid.spec()}))
    fixed = [f"log.dir={tmp_path}", *grid.fixed]
    assert sweep_folder(Grid(None, grid.swept, fixed), "s", None).name.startswith("sweep-s-2")
    same = Grid(None, grid.swept, fixed)
    (old / "sweep.json").write_text(json.dumps({"grid": same.spec()}))
    assert sweep_folder(same, "s", None) == old
    other = Grid(None, [("seed", ["0", "2"])], fixed)
    assert sweep_folder(other, "s", None) not in (old, tmp_path / "sweep-s-20260101-000000")
    assert_raises_other_sweep(other, old)


def assert_raises_other_sweep(grid, folder):
    with pytest.raises(MinitfmError, match="holds another sweep"):
        sweep_folder(grid, "s", folder)


LONG = [*TINY, "train.steps=300", "train.eval_every=0", "train.target_exact_match=null",
        "log.log_every=1", "log.tensorboard=false", "train.checkpoint_every=5"]


@pytest.mark.slow
def test_ctrl_c_stops_every_job_with_a_checkpoint_then_resumes(tmp_path):
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "minitfm", "sweep", *LONG, "--seeds", "0,1", "--jobs", "2",
           "--out", str(out), "--eval-samples", "20"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoints = [out / f"seed={s}" / "checkpoints" / "last.pt" for s in (0, 1)]
    deadline = time.monotonic() + 90
    while not all(p.exists() for p in checkpoints):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the jobs did not start in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.startswith("interrupted: SIGINT") and stderr.count("\n") == 1, stderr
    for path in checkpoints:
        assert 5 <= load_checkpoint(path)["step"] < 300
        assert read_summary(path.parent.parent)["status"] == "interrupted"
    result = run_cli("sweep", *LONG, "--seeds", "0,1", "--jobs", "2", "--out", out,
                     "--eval-samples", "20")
    assert result.exit_code == 0, result.stdout + result.stderr
    for path in checkpoints:
        assert load_checkpoint(path)["step"] == 300
        run_dir = path.parent.parent
        assert "--resume" in (run_dir.parent / f"{run_dir.name}.log").read_text()


@pytest.mark.parametrize("grid,needle", [
    (["model.d_modle=32,64"], "model.d_modle"),
    (["train.steps="], "train.steps="),
    (["train.steps=1,,2"], "train.steps=1,,2"),
    (["model.d_model=30,32", "model.n_heads=4"], "model.d_model (30)"),
    (["threads=x,1"], "--threads"),
    (["seed=0,1", "--seeds", "2,3"], "seed"),
    (["seed=0,1", "--eval-lengths", "9"], "--eval-lengths"),
])
def test_bad_grids_are_refused_before_anything_starts(tmp_path, monkeypatch, grid, needle):
    monkeypatch.chdir(tmp_path)
    assert_clean_error(run_cli("sweep", *FAST, *grid), 2, needle)
    assert list(tmp_path.iterdir()) == []


def test_dry_run_prints_one_shell_line_per_run(tmp_path):
    out = tmp_path / "sw"
    result = sweep(out, *GRID, "--eval-lengths", "7..8", "--dry-run")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and not out.exists()
    for line in lines:
        assert subprocess.run(["bash", "-n", "-c", line]).returncode == 0
        words = shlex.split(line)
        assert words[1:4] == ["-m", "minitfm", "train"] and "threads=1" in words
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
