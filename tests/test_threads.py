"""The thread policy: a registry of live minitfm processes, and `auto` resolved from it."""

import fcntl
import os
import subprocess
import sys
import time

import pytest
import torch

from minitfm.config import load_config
from minitfm.errors import ConfigError
from minitfm.run import threads
from minitfm.run.summary import read_summary
from minitfm.run.threads import ThreadClaim, ThreadPacer, resolve
from tests.helpers import TINY, assert_clean_error, run_cli


@pytest.fixture
def alone(monkeypatch, tmp_path):
    """A fake registry on a 4-core machine, OMP_NUM_THREADS unset."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 4)
    return tmp_path / "procs"


def hold(registry, pid: int, setting: str):
    """A neighbour entry locked by this test process (as its owner would)."""
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)  # writable by no one else
    f = open(registry / str(pid), "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(setting)
    f.flush()
    return f


def test_auto_alone_takes_every_core(alone):
    assert resolve("auto", alone) == 4


def test_auto_shares_with_auto_neighbours_and_leaves_room_for_fixed_ones(alone):
    first = hold(alone, 999001, "auto")
    assert resolve("auto", alone) == 2
    second = hold(alone, 999002, "1")
    assert resolve("auto", alone) == 1  # (4 - 1) // 2
    third = hold(alone, 999003, "4")
    assert resolve("auto", alone) == 1  # never below one
    for f in (first, second, third):
        f.close()
    assert resolve("auto", alone) == 4


def test_stale_entries_are_removed(alone):
    alone.mkdir(mode=0o700, parents=True)
    (alone / "999004").write_text("2")  # nobody holds its lock: its process has gone
    (alone / ".999005.tmp").write_text("auto")  # being registered: not counted, not removed
    assert resolve("auto", alone) == 4
    assert not (alone / "999004").exists() and (alone / ".999005.tmp").exists()


def test_explicit_count_and_omp_num_threads_are_honoured(alone, monkeypatch):
    held = hold(alone, 999006, "auto")
    assert resolve(3, alone) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert resolve("auto", alone) == 1
    held.close()


def test_a_claim_registers_while_inside_and_a_killed_process_counts_no_more(alone):
    code = ("import sys, time; from pathlib import Path\n"
            "from minitfm.run.threads import ThreadClaim\n"
            "with ThreadClaim(2, Path(sys.argv[1])):\n    print('in', flush=True); "
            "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(alone)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "in"
        assert (alone / str(child.pid)).read_text() == "2"
        assert resolve("auto", alone) == 2
    finally:
        child.kill()
        child.wait()
    assert resolve("auto", alone) == 4
    assert not (alone / str(child.pid)).exists()
    with ThreadClaim("auto", alone) as claim:
        assert (alone / str(os.getpid())).read_text() == "auto"
        assert claim.resolve() == 4  # its own entry is not a neighbour
    assert not list(alone.iterdir())


def test_the_pacer_drops_to_one_thread_when_a_neighbour_starts(alone):
    try:
        with ThreadClaim("auto", alone) as claim:
            pacer = ThreadPacer(claim, every_s=0)
            claim.apply()
            assert torch.get_num_threads() == 4 and claim.describe() == "4 threads (auto)"
            neighbour = hold(alone, 999007, "auto")
            time.sleep(0.01)
            assert pacer.tick() and torch.get_num_threads() == 2
            assert not pacer.tick()
            neighbour.close()
            assert pacer.tick() and torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(1)


def test_the_pacer_of_a_run_looks_again_about_once_a_second(alone, monkeypatch):
    """docs/operations.md: `threads: auto` looks again about once a second. The pacer a run
    gets (`ThreadPacer(claim)`, its default period) on a clock the test moves."""
    now = [1000.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: now[0])
    try:
        with ThreadClaim("auto", alone) as claim:
            claim.apply()
            pacer = ThreadPacer(claim)
            neighbour = hold(alone, 999008, "auto")
            for moment in (1000.0, 1000.5, 1000.9):  # not yet: the neighbour is not seen
                now[0] = moment
                assert not pacer.tick() and torch.get_num_threads() == 4
            now[0] = 1001.0
            assert pacer.tick() and torch.get_num_threads() == 2
            neighbour.close()
            now[0] = 1001.6
            assert not pacer.tick() and torch.get_num_threads() == 2
            now[0] = 1002.1
            assert pacer.tick() and torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("value,expected", [("auto", "auto"), (2, 2), ("3", 3)])
def test_config_threads(value, expected):
    assert load_config(None, [f"threads={value}"]).threads == expected


@pytest.mark.parametrize("value", ["x", "0", "-2", "1.5", "null"])
def test_config_threads_refused(value):
    with pytest.raises(ConfigError, match=r"threads \(.*\) must be auto or a positive integer"):
        load_config(None, [f"threads={value}"])


def test_cli_threads_option_refused():
    assert_clean_error(run_cli("eval", "--threads", "many"), 2, "--threads ('many')")


@pytest.mark.parametrize("value,expected", [("1024", 1024), ("0001", 1)])
def test_config_threads_up_to_the_bound(value, expected):
    assert load_config(None, [f"threads={value}"]).threads == expected


@pytest.mark.parametrize("args,needle", [  # the report of 2026-11-24, L6
    (["train", "threads=1000000"], "threads (1000000) must be at most 1,024"),  # THR_huge_train
    (["eval", "--threads", "100000"], "--threads ('100000') must be at most 1,024"),  # _eval
    (["train", "threads=1025"], "threads (1025) must be at most 1,024"),
    (["predict", "--threads", "9" * 5000, "x"], "must be at most 1,024"),
])
def test_threads_beyond_any_machine_are_refused(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)  # a train or eval that went ahead would write into runs/ here
    assert_clean_error(run_cli(*args), 2, needle, "use auto")
    assert not list(tmp_path.iterdir())


def test_train_header_and_summary(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("train", *TINY, "train.steps=4", "train.eval_every=0", "device=cpu",
                     "log.tensorboard=false", "--run-dir", run_dir)  # threads are shown on a CPU
    assert result.exit_code == 0, result.stderr
    assert "1 thread (auto)" in " ".join(result.stdout.split())  # OMP_NUM_THREADS=1 decides
    summary = read_summary(run_dir)
    assert summary["status"] == "finished" and summary["step"] == summary["steps"] == 4
