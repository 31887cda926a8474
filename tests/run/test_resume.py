"""Resume and overwrite never discard what the user wrote, nor mix two runs in one file.

A hand edit of a run's config.yaml is applied on --resume (train.*, log.*, as KEY=VALUE is) or
refused with nothing written (task.*, model.*); the attention probe stays the same across a
resume; --overwrite clears what minitfm wrote into a run and only that; a second Ctrl-C during
the save keeps the previous last.pt.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from minitfm.config import load_config
from minitfm.errors import MinitfmError
from minitfm.lab.attention.probe import pick_probe
from minitfm.lab.attention.timeline import ATTENTION_FILE, read_timeline, recorded_probe
from minitfm.run.checkpoint import load_checkpoint
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set
from tests.helpers import TINY, assert_clean_error, run_cli

# Four steps with two evaluations and their attention snapshots: a run to resume, in a second.
SHORT = [*TINY, "train.steps=4", "train.eval_every=2", "train.eval_samples=50",
         "train.checkpoint_every=0", "train.target_exact_match=null",
         "log.tensorboard=false", "log.attention_every=eval"]


def trained(tmp_path_factory, name, settings):
    """A run of `settings` trained in a fresh folder `name`."""
    run_dir = tmp_path_factory.mktemp(name) / "run"
    result = run_cli("train", *settings, "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    return run_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished four-step run; tests continue copies of it."""
    return trained(tmp_path_factory, "base", SHORT)


@pytest.fixture
def run(base, tmp_path):
    """A copy of the base run, free to change."""
    return shutil.copytree(base, tmp_path / "run")


def snapshot(root):
    """Every file under `root` with its bytes: equal snapshots mean nothing was written."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def edit_config(run_dir, key, value):
    """Set the dotted `key` in the run's config.yaml, as a user with an editor would."""
    path = run_dir / "config.yaml"
    data = yaml.safe_load(path.read_text())
    section, name = key.split(".")
    data[section][name] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def last_step(run_dir):
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]


# --- M8: a hand-edited config.yaml on --resume ---

@pytest.mark.parametrize("key,value,overrides", [("train.steps", 6, []),
                                                ("log.log_every", 1, ["train.steps=6"])])
def test_an_edit_of_a_key_resume_may_change_is_applied_and_kept(run, key, value, overrides):
    edit_config(run, key, value)
    result = run_cli("train", "--resume", run, *overrides)
    assert result.exit_code == 0, result.stderr
    old = {"train.steps": 4, "log.log_every": 10}[key]
    note = f"differs from the checkpoint's config: continuing with its {key}: {old} -> {value}"
    assert note in result.stderr and "train.steps=6" not in note
    assert last_step(run) == 6
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["config"]
    written = yaml.safe_load((run / "config.yaml").read_text())
    for config in (saved, written):  # the edit is in the new checkpoint and stays in the file
        assert config[key.split(".")[0]][key.split(".")[1]] == value


def test_an_override_wins_over_an_edit_and_print_config_shows_both(run):
    edit_config(run, "train.steps", 6)
    edit_config(run, "train.lr", 0.5)
    result = run_cli("train", "--resume", run, "--print-config", "train.steps=9")
    assert result.exit_code == 0, result.stderr
    printed = yaml.safe_load(result.stdout)["train"]
    assert (printed["steps"], printed["lr"]) == (9, 0.5)
    result = run_cli("train", "--resume", run, "train.steps=5")
    assert result.exit_code == 0, result.stderr
    assert "its train.lr: 0.003 -> 0.5" in result.stderr and "train.steps:" not in result.stderr
    assert last_step(run) == 5


def test_an_unedited_config_gives_no_note(run):
    result = run_cli("train", "--resume", run, "train.steps=5")
    assert result.exit_code == 0, result.stderr
    assert "differs" not in result.stderr and last_step(run) == 5


def test_model_code_may_change_on_resume_by_edit_or_override(run):
    """model.code picks which code runs the weights, not the weights: a resume may switch it."""
    from minitfm.run.resume import resume_config

    checkpoint = load_checkpoint(run / "checkpoints" / "last.pt")
    last = run / "checkpoints" / "last.pt"
    assert resume_config(checkpoint, ["model.code=book"], last).cfg.model.code == "book"
    with pytest.raises(MinitfmError, match="model.d_model cannot change on"):
        resume_config(checkpoint, ["model.code=book", "model.d_model=64"], last)
    edit_config(run, "model.code", "book")
    resumed = resume_config(checkpoint, [], last)
    assert resumed.cfg.model.code == "book" and resumed.edits == [("model.code", "fast", "book")]
    result = run_cli("train", "--resume", run, "train.steps=5")
    assert result.exit_code == 0, result.stderr
    assert "continuing with its model.code: 'fast' -> 'book'" in result.stderr
    assert load_checkpoint(last)["config"]["model"]["code"] == "book" and last_step(run) == 5


@pytest.mark.parametrize("key,value,needles", [
    ("model.d_model", 64, ["model.d_model was edited in", "config.yaml", "(32 -> 64)",
                           "undo the edit"]),
    ("task.name", "reverse", ["task.name was edited in", "'copy' -> 'reverse'"]),
    ("train.steps", -3, ["config.yaml", "train.steps (-3)", "fix the file"]),
    ("train.stepz", 5, ["config.yaml", "unknown config key 'train.stepz'"]),
])
def test_an_edit_resume_cannot_apply_is_refused_and_nothing_written(run, key, value, needles):
    edit_config(run, key, value)
    before = snapshot(run)
    assert_clean_error(run_cli("train", "--resume", run), 2, *needles)
    assert snapshot(run) == before


def test_a_config_yaml_that_is_no_yaml_is_refused(run):
    (run / "config.yaml").write_text("train: [oops\n")
    before = snapshot(run)
    assert_clean_error(run_cli("train", "--resume", run), 2, "not valid YAML", "remove it")
    assert snapshot(run) == before


# --- M7: the attention probe across a resume ---

def probe_of(eval_samples):
    """SHORT's task, and the probe a fresh recorder picks from `eval_samples` held-out pairs."""
    cfg = load_config(None, SHORT)
    task = make_task(cfg.task)
    return task, pick_probe(eval_set(task, eval_samples, cfg.task.eval_seed))


@pytest.mark.parametrize("eval_samples", [1, 3, 200])
def test_the_probe_stays_the_same_when_eval_samples_changes(run, eval_samples):
    task, first = probe_of(50)
    result = run_cli("train", "--resume", run, "train.steps=8",
                     f"train.eval_samples={eval_samples}")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in (run / ATTENTION_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert [[task.vocab.id(t) for t in r["source"]] for r in records] == [first[0]] * 4
    timeline = read_timeline(run)  # one probe: the file reads, and draws
    assert timeline.steps == [2, 4, 6, 8]
    result = run_cli("visualize-attention", run, "--over-training")
    assert result.exit_code == 0, result.stderr


def test_the_cases_above_would_pick_another_probe():
    """Without the recorded probe, a smaller held-out set picks another example (so the test
    above would fail if the recorder picked its probe anew)."""
    assert probe_of(1)[1] != probe_of(50)[1] and probe_of(3)[1] != probe_of(50)[1]


@pytest.mark.parametrize("content,expected", [
    ("", None),
    ("not json\n", None),
    ('{"step": 2}\n', None),
    ('{"source": ["1"], "decoder_input": ["1"]}\n', None),  # no <bos>
    ('{"source": ["<eos>"], "decoder_input": ["<bos>"]}\n', None),
    ('{"source": ["9"], "decoder_input": ["<bos>", "9"]}\n', None),  # not in the vocabulary
    ('{"source": "1 2", "decoder_input": ["<bos>", "1"]}\n', None),
    ("[" * 100_000 + "]" * 100_000 + "\n", None),
    ('{"source": ["1", "2"], "decoder_input": ["<bos>", "1", "2"]}\n', ([4, 5], [4, 5])),
    ('{"source": ["1"], "decoder_input": ["<bos>", "1"]}\n{"source": ["2", "3"], '
     '"decoder_input": ["<bos>", "2", "3"]}\n{"source": ["4"', ([5, 6], [5, 6])),  # torn end
])
def test_the_recorded_probe_is_the_last_whole_record(tmp_path, content, expected):
    task, _ = probe_of(1)
    path = tmp_path / ATTENTION_FILE
    path.write_text(content)
    assert recorded_probe(path, task) == expected
    assert recorded_probe(tmp_path / "missing.jsonl", task) is None


# --- L17: --overwrite ---

MADE = ["attention/best-step4.png", "attention/last-step4-cross-layer0-head1.png",
        "attention/over-training-layer0.png", "attention/.best-step4.png.x1y2.tmp",
        "ablate/best-step4-zero.png", "ablate/last-step2-mean.png", "plot.png",
        "eval-1-6.json", "eval-17-32.json", ".summary.json.abc.tmp",
        "explain/best-step4.png", "explain/best-step4.json", "patch/last-step4.png"]
USERS = ["notes.md", "eval-mine.json", "plots/plot.png", "attention/notes.txt",
         "attention/step4.png", "ablate/ablated-by-hand.png.bak", "explain/cards.json",
         "patch/mine.png"]


def test_overwrite_removes_what_minitfm_wrote_and_nothing_else(run):
    for name in MADE + USERS:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("old")
    result = run_cli("train", *SHORT, "train.steps=2", "--run-dir", run, "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert [name for name in MADE if (run / name).exists()] == []
    assert [name for name in USERS if (run / name).read_text() != "old"] == []
    assert last_step(run) == 2 and (run / "attention").is_dir()  # it holds the user's files


def test_overwrite_removes_the_emptied_picture_folders(run):
    for name in ("attention/best-step4.png", "ablate/best-step4-zero.png"):
        (run / name).parent.mkdir(exist_ok=True)
        (run / name).write_text("old")
    result = run_cli("train", *SHORT, "train.steps=2", "--run-dir", run, "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert not (run / "attention").exists() and not (run / "ablate").exists()


def test_overwrite_never_enters_a_linked_picture_folder(run, tmp_path):
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "best-step4.png").write_text("mine")
    (run / "attention").symlink_to(elsewhere)
    result = run_cli("train", *SHORT, "train.steps=2", "--run-dir", run, "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert (elsewhere / "best-step4.png").read_text() == "mine"


# --- L1: a pairs resume after the data changed ---

def write_pairs(path, extra=""):
    words = [f"{a}{b}{c}" for a in "abcd" for b in "abcd" for c in "abcd"]
    path.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words) + extra)


@pytest.mark.parametrize("change", ["a new symbol", "a line less"])
def test_a_pairs_resume_after_the_data_changed_blames_the_data(tmp_path, change):
    data = tmp_path / "pairs.tsv"
    write_pairs(data)
    model_and_train = [item for item in SHORT if not item.startswith("task.")]
    result = run_cli("train", "task.name=pairs", f"task.train_path={data}", *model_and_train,
                     "train.steps=2", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    if change == "a new symbol":
        write_pairs(data, "zz\tzz\n")
    else:
        data.write_text("".join(data.read_text().splitlines(keepends=True)[1:]))
    before = snapshot(tmp_path / "run")
    assert_clean_error(run_cli("train", "--resume", tmp_path / "run", "train.steps=4"), 2,
                       "trained on other data than task.train_path")
    assert snapshot(tmp_path / "run") == before


# --- a torchrun checkpoint resumed in one process ---

def test_one_process_continues_rank_0s_streams_of_a_torchrun_checkpoint(base, tmp_path):
    """With another process count, rank 0's saved random streams go on (docs/operations.md);
    tests/run/test_distributed.py resumes a real 2-rank checkpoint, this one needs no launch."""
    import torch

    from minitfm.run.state import init_state

    saved = load_checkpoint(base / "checkpoints" / "last.pt")
    other = torch.Generator().manual_seed(12345).get_state()
    # as rank 0 of 2 saves: its own streams at the top and first in `ranks`, rank 1's after
    saved["rng"]["ranks"] = [
        {"torch": saved["rng"]["torch"], "data": saved["rng"]["data"],
         "cuda": torch.empty(0, dtype=torch.uint8)},
        {"torch": other, "data": other, "cuda": torch.empty(0, dtype=torch.uint8)}]
    cfg = load_config(None, SHORT)
    state = init_state(cfg, torch.device("cpu"))
    fresh = (torch.get_rng_state(), state.data_rng.get_state())
    state.load_state_dict(saved)
    rank0 = saved["rng"]["ranks"][0]
    assert not torch.equal(fresh[1], rank0["data"])  # four steps drew batches: it can fail
    assert torch.equal(state.data_rng.get_state(), rank0["data"])
    assert torch.equal(torch.get_rng_state(), rank0["torch"])
    assert state.step == 4


# --- test review #3: a second Ctrl-C during the save ---

# Runs the CLI with two hooks: a marker once a step is done (the loop and its signal handler
# are in place), and a save of last.pt that blocks, its temp file written, until a signal.
BLOCKED_SAVE = """
import os, sys, time
from pathlib import Path
import minitfm.run.session as session
from minitfm.app.cli import main

markers = Path(sys.argv.pop(1))
after_step, replace = session.Training.after_step, os.replace

def stepped(self, *args):
    going_on = after_step(self, *args)
    (markers / "running").touch()
    return going_on

def blocked(src, dst, *args, **kwargs):
    if Path(dst).name == "last.pt":
        (markers / "saving").touch()
        while True:  # the second Ctrl-C's handler raises here
            time.sleep(0.01)
    return replace(src, dst, *args, **kwargs)

session.Training.after_step, os.replace = stepped, blocked
main()
"""


def wait_for(path, proc, timeout=120):
    """Block until `path` exists; fail if the process ends first (no timing is asserted)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the process ended first: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {path.name} within {timeout} s")
        time.sleep(0.02)


@pytest.mark.slow  # starts another torch process
def test_a_second_ctrl_c_during_the_save_keeps_the_previous_last_pt(run, tmp_path):
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_SAVE, str(markers), "train",
                             "--resume", str(run), "train.steps=100000"],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:  # a child that ignores the second Ctrl-C spins in `blocked`: never left holding the run
        wait_for(markers / "running", proc)
        proc.send_signal(signal.SIGINT)  # the first: finish the step, then save last.pt
        wait_for(markers / "saving", proc)
        proc.send_signal(signal.SIGINT)  # the second, while the save waits to replace last.pt
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    assert "SIGINT again: stopped at once, without saving" in stderr, stderr
    assert last.read_bytes() == before and last_step(run) == 4
    assert not list(last.parent.glob(".*.tmp"))  # the cut-short temp file is gone


# --- #40: more steps on a resume never silently undo what a run learned ---

def jump(step, before, after, best=0.5):
    """`schedule_jump` for a checkpoint at `step` with `best` exact match; train overrides."""
    from minitfm.config import TrainConfig
    from minitfm.run.resume import schedule_jump

    base = {"steps": 100, "warmup_steps": 20, "lr": 1e-2}
    return schedule_jump({"step": step, "best_exact_match": best},
                         TrainConfig(**{**base, **before}), TrainConfig(**{**base, **after}), None)


@pytest.mark.parametrize("step,before,after", [
    (10, {}, {"steps": 1000}),  # inside the warmup the rate does not depend on steps
    (60, {}, {"steps": 80}),  # fewer steps: the rate falls
    (60, {"schedule": "constant"}, {"schedule": "constant", "steps": 1000}),
    (60, {"schedule": "inverse_sqrt"}, {"schedule": "inverse_sqrt", "steps": 1000}),
    (60, {}, {"lr": 1e-3}),  # a lower peak
])
def test_a_resume_that_does_not_raise_the_rate_says_nothing(step, before, after):
    assert jump(step, before, after, best=1.0) is None


def test_more_steps_on_a_cosine_raise_the_rate_and_are_said_with_the_rate_to_keep():
    from minitfm.book.loop import lr_factor
    from minitfm.config import TrainConfig

    note = jump(90, {}, {"steps": 1000})
    was = 1e-2 * lr_factor(90, TrainConfig(steps=100, warmup_steps=20, lr=1e-2))
    assert note.startswith(f"train.steps 100 -> 1000 sends the learning rate from {was:.3g} up")
    assert note.endswith(f"give train.steps=1000 train.schedule=constant train.lr={was:.3g}")
    assert "warm restart" in jump(100, {}, {"steps": 1000})  # from 0: no constant rate to offer
    assert "train.lr=" not in jump(100, {}, {"steps": 1000})


def test_the_suggested_constant_rate_is_taken_without_a_word():
    note = jump(90, {}, {"steps": 1000})
    rate = float(note.rpartition("train.lr=")[2])
    assert jump(90, {}, {"steps": 1000, "schedule": "constant", "lr": rate}, best=1.0) is None


def test_a_solved_run_is_not_restarted_and_nothing_is_written(run):
    """A run at its target, resumed with more steps: refused in one line that says how to
    train it on (the suggestion itself is taken, see above), and the run is left as it was."""
    import torch

    fresh = run.parent / "solved"
    edit = [*SHORT, "train.warmup_steps=1", "train.target_exact_match=0.5"]
    assert run_cli("train", *edit, "--run-dir", fresh).exit_code == 0
    path = fresh / "checkpoints" / "last.pt"
    checkpoint = load_checkpoint(path)
    checkpoint["best_exact_match"] = 0.6  # as if its last evaluation had reached the target
    torch.save(checkpoint, path)
    before = snapshot(fresh)
    result = run_cli("train", "--resume", fresh, "train.steps=400")
    assert_clean_error(result, 2, "reached its 50% target (60.0%)", "undoes what it learned",
                       "start a new run with train.steps=400")
    assert snapshot(fresh) == before


def test_an_unsolved_run_goes_on_with_a_warm_restart_said(run):
    edit = [*SHORT, "train.warmup_steps=1", "train.steps=4"]
    fresh = run.parent / "short"
    assert run_cli("train", *edit, "--run-dir", fresh).exit_code == 0
    result = run_cli("train", "--resume", fresh, "train.steps=6")
    assert result.exit_code == 0, result.stderr
    assert "train.steps 4 -> 6 sends the learning rate from 0 up to" in result.stderr
    assert "warm restart" in result.stderr and last_step(fresh) == 6


@pytest.mark.slow
def test_a_solved_run_trained_on_as_told_keeps_what_it_learned(tmp_path):
    """The README's "continue a run" on a solved run: refused with a rate to go on at; taken,
    the run trains 300 more steps past its target and no evaluation falls more than a point
    below the best before it."""
    run_dir = tmp_path / "run"
    quick = [*TINY, "train.target_exact_match=0.9", "train.eval_samples=400",
             "log.tensorboard=false", "threads=1"]
    assert run_cli("train", *quick, "--run-dir", run_dir).exit_code == 0
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["best_exact_match"] >= 0.9, "TINY should reach 90%"
    refused = run_cli("train", "--resume", run_dir, f"train.steps={checkpoint['step'] + 300}")
    assert refused.exit_code == 2, refused.stderr
    told = refused.stderr.split("give ")[1].split(" (and")[0].split()
    result = run_cli("train", "--resume", run_dir, *told, "train.target_exact_match=null",
                     f"train.steps={checkpoint['step'] + 300}")
    assert result.exit_code == 0, result.stderr
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "exact_match" in r]
    best = checkpoint["best_exact_match"]
    after = [r for r in evals if r["step"] > checkpoint["step"]]
    assert len(after) >= 6
    for record in after:
        assert record["exact_match"] >= best - 0.01, (record, best)
        best = max(best, record["exact_match"])


# --- L10, newcomer #11: a resume with no steps left, or steps behind the run ---

# Stops at its 5% target at step 30 of 50 (exact match 24%), in about a second.
TARGETED = [*SHORT, "train.steps=50", "train.warmup_steps=10", "train.lr=0.01",
            "train.eval_every=10", "train.target_exact_match=0.05", "train.checkpoint_every=0",
            "log.tensorboard=true", "threads=1"]


@pytest.fixture(scope="module")
def targeted(tmp_path_factory):
    """A run stopped at its target before its last step, with TensorBoard on."""
    run_dir = trained(tmp_path_factory, "targeted", TARGETED)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped at target" and summary["step"] < 50, summary
    return run_dir


@pytest.mark.parametrize("which", ["finished", "stopped at target"])
def test_steps_behind_the_run_are_refused_and_nothing_written(run, targeted, tmp_path, which):
    run_dir = run if which == "finished" else shutil.copytree(targeted, tmp_path / "t")
    step = last_step(run_dir)
    before = snapshot(run_dir)
    result = run_cli("train", "--resume", run_dir, f"train.steps={step - 1}")
    assert_clean_error(result, 2, f"is at step {step}: train.steps={step - 1} is behind it")
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("which, overrides, needle", [
    ("finished", [], "nothing to do: this run has finished (all 4 steps)"),
    ("finished", ["train.steps=4", "log.log_every=1"], "(all 4 steps)"),
    ("stopped at target", [], "nothing to do: this run has finished (it reached its 5% target "
                              "at step 30)"),
])
def test_a_run_with_nothing_left_to_do_says_so_and_writes_nothing(run, targeted, tmp_path,
                                                                 which, overrides, needle):
    run_dir = run if which == "finished" else shutil.copytree(targeted, tmp_path / "t")
    before = snapshot(run_dir)
    result = run_cli("train", "--resume", run_dir, *overrides)
    assert result.exit_code == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("nothing to do")]
    assert needle in line
    assert snapshot(run_dir) == before  # no eval line, events file, summary or config change


def test_a_run_stopped_at_its_target_goes_on_once_the_target_is_lifted(targeted, tmp_path):
    run_dir = shutil.copytree(targeted, tmp_path / "t")
    result = run_cli("train", "--resume", run_dir, "train.target_exact_match=null")
    assert result.exit_code == 0, result.stderr
    assert "nothing to do" not in result.stdout and last_step(run_dir) == 50


def test_the_api_resume_of_a_finished_run_returns_it_untouched(run):
    import minitfm

    before = snapshot(run)
    loaded = minitfm.train(resume=run, progress=False)
    assert loaded.checkpoint.parent.parent.resolve() == run.resolve()
    assert snapshot(run) == before


def test_the_progress_after_a_resume_shows_the_last_evaluation_not_a_dash(run):
    """Between evaluations the train line shows the latest exact match: after a resume, the
    one metrics.jsonl holds, until the next evaluation."""
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["split"] == "eval"][-1]
    result = run_cli("train", "--resume", run, "train.steps=6", "log.log_every=1",
                     "train.eval_every=0")
    assert result.exit_code == 0, result.stderr
    lines = [x for x in result.stdout.splitlines() if x.startswith("step ")]
    assert lines and lines[0].startswith("step      5 ")
    assert f"exact {last['exact_match']:.1%} (step {last['step']})" in lines[0], lines[0]


# --- M7: a hard kill between checkpoints, then --resume: each step once ---

KILLED = """
import os, signal, sys
from pathlib import Path
from minitfm.app.api import instruments
from minitfm.config import load_config
from minitfm.run.instruments import Instrument
from minitfm.run.session import RunOptions, start_training

class Kill(Instrument):
    '''SIGKILL after step 13, as a crash would: the last save was step 10's.'''
    def __init__(self, watching):
        self.watching = watching
    def on_step(self, stepped):
        if stepped.step == 13:
            for instrument in self.watching:  # TensorBoard's events so far on disk
                if getattr(instrument, "writer", None) is not None:
                    instrument.writer.flush()
            os.kill(os.getpid(), signal.SIGKILL)

watching = instruments()
start_training(load_config(None, sys.argv[2:]), RunOptions(run_dir=Path(sys.argv[1])),
               [*watching, Kill(watching)])
"""
EVERY_STEP = [*TINY, "train.steps=20", "train.checkpoint_every=5", "train.eval_every=0",
              "train.target_exact_match=null", "log.log_every=1", "log.gauge_every=1",
              "log.attention_every=1", "log.tensorboard=true"]


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # starts another torch process (the one killed)
def test_a_hard_kill_then_resume_leaves_each_step_once_for_every_reader(tmp_path):
    """Killed (SIGKILL) at step 13, after step 10's checkpoint, then resumed: metrics.jsonl,
    attention.jsonl and TensorBoard hold each step once, in order, as the resumed run made
    it; the lines up to step 10 and a line of the user's stay byte for byte."""
    from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator

    run_dir = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLED, str(run_dir), *EVERY_STEP],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    metrics = run_dir / "metrics.jsonl"
    assert last_step(run_dir) == 10
    assert [r["step"] for r in records(metrics) if r["split"] == "gauges"] == list(range(1, 14))
    lines = metrics.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["step"] <= 10]
    mine = b'{"note": "lr 3e-3 looks slow"}\n'  # a line of the user's, no record
    metrics.write_bytes(b"".join(kept[:3] + [mine] + lines[3:]))
    assert run_cli("train", "--resume", run_dir).exit_code == 0
    assert metrics.read_bytes().startswith(b"".join(kept[:3] + [mine] + kept[3:]))
    found = [r for r in records(metrics) if "split" in r]
    for split in ("train", "gauges"):
        assert [r["step"] for r in found if r["split"] == split] == list(range(1, 21)), split
    assert [r["step"] for r in found if r["split"] == "eval"] == [20]
    assert [r["step"] for r in records(run_dir / ATTENTION_FILE)] == list(range(1, 21))
    legacy = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    legacy.Reload()
    served = plugin_event_accumulator.EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    served.Reload()  # what the tensorboard server reads
    assert "7_gauges/exact" in legacy.Tags()["scalars"]
    for tag in legacy.Tags()["scalars"]:
        steps = [event.step for event in legacy.Scalars(tag)]
        assert steps == sorted(set(steps)) and steps[-1] == 20, (tag, steps)
        served_steps = [event.step for event in served.Tensors(tag)]
        assert served_steps == steps, (tag, served_steps)


@pytest.mark.parametrize("content,expected", [
    (b'{"step": 1, "split": "train"}\n{"step": 2, "split": "train"}\n',
     b'{"step": 1, "split": "train"}\n'),
    (b'{"step":1,"exact_match":null}\n{"step":3,"exact_match":0.5}\n',  # attention.jsonl's
     b'{"step":1,"exact_match":null}\n'),
    (b'{"step": 1, "split": "train"}\n{"step": 2, "spl', b'{"step": 1, "split": "train"}\n'),
    (b'{"step": 1, "split": "train"}\n{"st', b'{"step": 1, "split": "train"}\n'),  # torn
    (b'[1]\n{"step": 3}\n{"split": "train", "step": 3}\nnot json\n',  # only minitfm's go
     b'[1]\n{"split": "train", "step": 3}\nnot json\n'),
    (b'{"step": 2, "pad": "' + b"x" * 200_000 + b'"}\n{"step": 1, "pad": "' + b"y" * 200_000
     + b'"}\n', b'{"step": 1, "pad": "' + b"y" * 200_000 + b'"}\n'),  # lines longer than a read
], ids=["metrics", "attention", "torn-record", "torn-head", "others-stay", "long-lines"])
def test_a_resume_drops_the_records_past_its_step(tmp_path, content, expected):
    from minitfm.run.rundir import drop_records_after

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(content)
    drop_records_after(path, 1)
    assert path.read_bytes() == expected


def test_a_file_with_nothing_past_the_step_is_left_as_it_is(tmp_path):
    from minitfm.run.rundir import drop_records_after

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "split": "train"}\nmine\n')
    before = os.stat(path)
    drop_records_after(path, 1)
    drop_records_after(tmp_path / "attention.jsonl", 1)  # none: nothing to do, none made
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not (tmp_path / "attention.jsonl").exists()
