"""Interrupts, crashes, concurrent runs and hostile files, with real processes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from minitfm.errors import shown_path
from minitfm.run.checkpoint import load_checkpoint
from tests.helpers import TINY, assert_clean_error, given_once, run_cli

LONG = [*TINY, "train.steps=400", "train.eval_every=0", "train.target_exact_match=null",
        "log.log_every=1", "log.tensorboard=false", "train.checkpoint_every=5"]


def start_training(run_dir, *extra):
    """A real `python -m minitfm train` process, pinned to one thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "minitfm", *given_once(["train", *LONG, *extra]),
                             "--run-dir", str(run_dir)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_steps(run_dir, n, proc, timeout=60):
    """Block until metrics.jsonl has `n` train lines (the process is then mid-run)."""
    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"training ended early: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("training did not start in time")


@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_and_resume_finishes(tmp_path, signum, code):
    run_dir = tmp_path / "run"
    proc = start_training(run_dir)
    wait_for_steps(run_dir, 10, proc)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    name = signal.Signals(signum).name  # the user stopped it: no error, one line
    assert stderr.startswith(f"interrupted: {name} at step ") and stderr.count("\n") == 1
    stopped_at = load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
    assert 10 <= stopped_at < 400
    assert f"interrupted at step {stopped_at} of 400" in stdout  # the summary says why
    assert f"minitfm train --resume {shown_path(run_dir)}" in stdout
    result = run_cli("train", "--resume", run_dir)
    assert result.exit_code == 0, result.stderr
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 400
    lines = map(json.loads, (run_dir / "metrics.jsonl").open())
    steps = [r["step"] for r in lines if r["split"] == "train"]
    assert steps == list(range(1, 401))  # no step lost, none repeated


@pytest.mark.slow
def test_sigkill_leaves_a_loadable_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_training(run_dir)
    wait_for_steps(run_dir, 30, proc)
    proc.kill()
    proc.communicate(timeout=30)
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["step"] >= 5 and state["step"] % 5 == 0
    result = run_cli("train", "--resume", run_dir, "train.steps=" + str(state["step"] + 10))
    assert result.exit_code == 0, result.stderr
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == state["step"] + 10
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))


@pytest.mark.slow
def test_a_run_directory_in_use_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_training(run_dir, "train.steps=100000")
    try:
        wait_for_steps(run_dir, 12, proc)  # last.pt exists from step 5 on
        before = (run_dir / "config.yaml").read_text()
        assert_clean_error(run_cli("train", "--resume", run_dir), 2, "in use")
        assert_clean_error(run_cli("train", *TINY, "--run-dir", run_dir, "--overwrite"), 2,
                           "in use")
        assert (run_dir / "config.yaml").read_text() == before
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 143


class Payload:
    """Unpickling this would create a file: the side effect a checkpoint must never have."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_malicious_checkpoint_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format": "minitfm-checkpoint/1", "model": Payload(marker)}, evil)
    for args in (["eval", evil], ["predict", evil, "1 2"], ["train", "--resume", evil]):
        assert_clean_error(run_cli(*args), 2, "refused", "system")
    assert not marker.exists()


def test_a_foreign_file_is_not_a_checkpoint(tmp_path):
    foreign = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(3)}, foreign)
    assert_clean_error(run_cli("eval", foreign), 2, "not a minitfm checkpoint")


BAD_INPUTS = [
    (["train", "train.steps=0"], "train.steps"),
    (["train", "log.dir=afile/runs"], "afile"),
    (["train", "--resume", "nowhere"], "nowhere"),
    (["train", "--resume", "nowhere", "configs/copy.yaml"], "configs/copy.yaml"),
    (["eval", "--samples", "0"], "--samples"),
    (["eval", "--samples", "many"], "--samples"),
    (["eval", "--batch-size", "-1"], "--batch-size"),
    (["eval", "--unknown-flag"], "--unknown-flag"),
    (["eval", "nowhere"], "nowhere"),
    (["predict"], "no runs"),
    (["visualize-attention", "--layer", "x"], "--layer"),
    (["no-such-command"], "no-such-command"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUTS, ids=lambda a: " ".join(map(str, a)))
def test_bad_input_corpus(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    result = run_cli(*args)
    assert_clean_error(result, 2, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_failed_write_keeps_the_previous_summary_and_picture(tmp_path):
    """summary.json and pictures go through the one atomic write: a full disk midway leaves
    the old file whole and no temp file behind."""
    from unittest import mock

    from minitfm.errors import MinitfmError
    from minitfm.lab.pictures import write_picture
    from minitfm.run.summary import read_summary, write_summary

    write_summary(tmp_path, {"wall_s": 1.0, "status": "paused"})
    write_picture(tmp_path / "a.png", "--out", lambda buffer: buffer.write(b"old"))
    full = OSError(28, "No space left on device")
    with mock.patch("os.fsync", side_effect=full):
        with pytest.raises(OSError, match="No space left"):
            write_summary(tmp_path, {"wall_s": 2.0, "status": "finished"})
        with pytest.raises(MinitfmError, match="cannot write .*No space left.* --out"):
            write_picture(tmp_path / "a.png", "--out", lambda buffer: buffer.write(b"new"))
    assert read_summary(tmp_path)["status"] == "paused"
    assert (tmp_path / "a.png").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "summary.json"]


def test_one_signal_catcher_holds_records_and_restores():
    """signals_held (torch loading), StopSignal (training) and sweep's catcher are one class."""
    from minitfm.errors import Interrupted
    from minitfm.run.signals import CaughtSignals, StopSignal, signals_held

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted, match=r"^Ctrl-C \(SIGINT\) while starting: nothing was "
                                          r"done$") as caught:
        with signals_held():
            signal.raise_signal(signal.SIGINT)
    assert caught.value.exit_code == 130
    with CaughtSignals() as signals:  # a sweep forwards every one to its jobs
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    assert signals.received == [signal.SIGTERM, signal.SIGTERM]
    with StopSignal() as stop, pytest.raises(Interrupted, match="SIGINT again") as again:
        signal.raise_signal(signal.SIGINT)
        assert stop.signum == signal.SIGINT
        signal.raise_signal(signal.SIGINT)
    assert again.value.exit_code == 130
    assert {signum: signal.getsignal(signum) for signum in before} == before
