"""The thread policy: a registry of live minitfm processes, and `auto` resolved from it."""

import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from minitfm.config import load_config
from minitfm.errors import ConfigError
from minitfm.run import threads
from minitfm.run.cpuload import MIN_WINDOW_S, TICKS_PER_S, CpuLoad, busy_ticks, process_ticks
from minitfm.run.summary import read_summary
from minitfm.run.threads import ThreadClaim, ThreadPacer, resolve
from tests.helpers import TINY, assert_clean_error, run_cli


@pytest.fixture
def alone(monkeypatch, tmp_path):
    """A fake registry on a 4-core machine that no other program keeps busy (whatever this
    shared machine runs meanwhile), OMP_NUM_THREADS unset."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.setattr(threads.CpuLoad, "others", lambda self, pids: 0)
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


# --- other programs' load (run/cpuload.py) ---

STAT = ("cpu  {total} 0 0 0 0 0 0 0 0 0\ncpu0 {c0} 0 0 500 7 0 0 0 0 0\n"
        "cpu1 {c1} 0 0 500 0 0 0 0 0 0\ncpu2 {c2} 0 0 0 0 0 0 0 0 0\nintr 1 2 3\n"
        "procs_running 3\n")


def proc_stat(pid: int, ticks: int, started: int = 0, name: str = "python") -> str:
    """A /proc/PID/stat line whose utime + stime is `ticks` (utime 2/3 of it), started `started`
    ticks after the machine."""
    utime = 2 * ticks // 3
    return (f"{pid} ({name}) R 1 1 1 0 -1 4194304 99 0 0 0 {utime} {ticks - utime} 0 0 20 0 "
            f"1 0 {started} 3133440 379")


class FakeProc:
    """/proc on a clock that a test moves: `busy` ticks on cpu0/cpu1 (cpu2 is not ours), each
    process's ticks and start."""

    def __init__(self):
        self.now, self.busy, self.ticks, self.started = 100.0, [1000, 2000, 0], {}, {}

    def read(self, name: str) -> str:
        if name == "uptime":
            return f"{self.now:.2f} 12.00\n"
        if name == "stat":
            c0, c1, c2 = self.busy
            return STAT.format(total=c0 + c1 + c2, c0=c0, c1=c1, c2=c2)
        pid = int(name.split("/")[0])
        if pid not in self.ticks:
            raise FileNotFoundError(name)
        return proc_stat(pid, self.ticks[pid], self.started[pid], name="a ) b")  # ") " in a name

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def load(self) -> CpuLoad:
        return CpuLoad({0, 1}, self.read, self.sleep)

    def process(self, pid: int, ticks: int, started_s: float) -> None:
        """A process that ran `ticks` since it started, at `started_s` (seconds of uptime)."""
        self.ticks[pid], self.started[pid] = ticks, round(started_s * TICKS_PER_S)

    def run(self, seconds: float, cpu0: float, cpu1: float, **processes: float) -> None:
        """`seconds` go by with cpu0 and cpu1 busy that share of the time; each process (by
        name pid<N>) runs that many cores; one not there yet starts now."""
        for name in processes:
            if int(name[3:]) not in self.ticks:
                self.process(int(name[3:]), 0, self.now)
        self.now += seconds
        self.busy[0] += round(cpu0 * seconds * TICKS_PER_S)
        self.busy[1] += round(cpu1 * seconds * TICKS_PER_S)
        self.busy[2] += round(seconds * TICKS_PER_S)  # another CPU, outside our affinity
        for name, cores in processes.items():
            self.ticks[int(name[3:])] += round(cores * seconds * TICKS_PER_S)


def test_busy_ticks_count_user_nice_system_irq_softirq_steal_of_our_cpus_only():
    stat = "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 4 1000 1000 8 16 32 64 64\ncpu7 1 1 1 1 1 1 1 1\n"
    assert busy_ticks(stat, {0}) == 1 + 2 + 4 + 8 + 16 + 32  # not idle, iowait, guest (in user)
    assert busy_ticks(stat, {0, 7}) == 63 + 6 and busy_ticks(stat, {3}) == 0
    assert process_ticks(proc_stat(12, 300, 4567, name="x ) (y")) == (300, 4567)


def test_one_busy_program_reads_one_core_and_minitfm_processes_none():
    proc = FakeProc()
    load = proc.load()
    proc.process(11, 50, 90.0)  # this process
    proc.process(22, 0, 95.0)  # a registered minitfm neighbour
    load.start([11, 22])
    # this run on 2 threads gets 4/3 of a core, a busy program the 2/3 left
    proc.run(1.0, 1.0, 1.0, pid11=4 / 3)
    assert load.others([11, 22]) == 1
    proc.run(1.0, 1.0, 1.0, pid11=1, pid22=1)  # two minitfm processes, nothing else
    assert load.others([11, 22]) == 0
    proc.run(2.0, 0.9, 0.5, pid11=1)  # 0.4 of a core: a passing program, rounded away
    assert load.others([11]) == 0
    proc.run(2.0, 1.0, 0.6, pid11=1, pid33=0.5)  # a minitfm process started meanwhile
    assert load.others([11, 33]) == 0  # its ticks since it started are its own
    proc.run(1.0, 1.0, 1.0)  # two busy programs (this process idle)
    assert load.others([11, 33]) == 2


def test_a_long_lived_process_that_registers_late_lends_no_ticks_to_the_window():
    """A test runner that registers a claim after minutes of work: its lifetime's ticks are
    not this window's (that would hide other programs); for one window its load counts as
    other programs', then it is followed like the others."""
    proc = FakeProc()
    load = proc.load()
    proc.process(11, 0, 99.0)
    proc.process(44, 30_000, 0.0)  # five minutes of ticks before it registered
    load.start([11])
    proc.run(1.0, 1.0, 0.0, pid44=1)  # it keeps one core busy
    assert load.others([11, 44]) == 1
    proc.run(1.0, 1.0, 0.0, pid44=1)
    assert load.others([11, 44]) == 0


def test_the_first_look_waits_for_a_window_and_no_proc_counts_nothing():
    proc = FakeProc()
    proc.process(11, 0, 99.0)
    load = proc.load()
    start = proc.now
    assert load.others([11]) == 0  # no ticks went by: nothing busy
    assert proc.now - start == pytest.approx(MIN_WINDOW_S)  # it waited that long, no more
    proc.sleep(5.0)
    assert load.others([11]) == 0 and proc.now - start == pytest.approx(5.0 + MIN_WINDOW_S)

    def unreadable(name: str) -> str:
        raise FileNotFoundError(f"/proc/{name}")

    assert CpuLoad({0, 1}, unreadable, proc.sleep).others([11]) == 0


def test_auto_leaves_other_programs_the_cores_they_keep_busy(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 4)
    busy = [1]
    monkeypatch.setattr(threads.CpuLoad, "others", lambda self, pids: busy[0])
    registry = tmp_path / "procs"
    assert resolve("auto", registry) == 3
    neighbour = hold(registry, 999009, "auto")
    assert resolve("auto", registry) == 1  # (4 - 1) // 2
    busy[0] = 4
    assert resolve("auto", registry) == 1  # never below one
    neighbour.close()
    busy[0] = 1
    with ThreadClaim("auto", registry) as claim:
        claim.apply()
        assert claim.describe() == "3 threads (auto; other programs keep 1 of 4 cores busy)"
        assert resolve(2, registry) == 2  # a fixed count is what it says
    torch.set_num_threads(1)


@pytest.mark.skipif(threads.cores() < 2, reason="one core: auto takes one thread anyway")
def test_a_busy_program_makes_auto_take_fewer_threads(monkeypatch, tmp_path):
    """A real busy loop: while it runs, at least one of our cores is busy at every moment (the
    scheduler leaves no core idle while it waits), whatever else the machine runs."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    loop = subprocess.Popen([sys.executable, "-c", "print('go', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert loop.stdout.readline().strip() == "go"
        with ThreadClaim("auto", tmp_path / "procs") as claim:
            time.sleep(0.5)  # this process idle: the window sees the loop
            claim.apply()
            assert claim.busy >= 1 and claim.threads <= threads.cores() - 1
            assert "other programs keep" in claim.describe()
    finally:
        os.kill(loop.pid, signal.SIGKILL)
        loop.wait()
        torch.set_num_threads(1)
