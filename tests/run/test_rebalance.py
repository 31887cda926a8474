"""`threads: auto` during a run: it follows other minitfm processes, and says so once, with why."""

import fcntl

import torch

from minitfm.config import load_config
from minitfm.run import session, threads
from minitfm.run.instruments import Instrument, Note, Stepped
from minitfm.run.session import RunOptions
from minitfm.run.threads import ThreadClaim, ThreadPacer
from tests.helpers import TINY


def register(registry, pid: int):
    """A neighbour on `auto`, its entry locked as its live owner would hold it."""
    registry.mkdir(parents=True, exist_ok=True)
    entry = open(registry / str(pid), "w")
    fcntl.flock(entry, fcntl.LOCK_EX)
    entry.write("auto")
    entry.flush()
    return entry


class Neighbour(Instrument):
    """An instrument through which a neighbour ends after step 3 and another starts after step
    4 (the pacer looks right after `on_step`); it keeps the run's notes and thread counts."""

    def __init__(self, registry, entry):
        self.registry, self.entry, self.messages, self.threads = registry, entry, [], {}

    def on_step(self, stepped: Stepped) -> None:
        step = stepped.step
        self.threads[step] = torch.get_num_threads()  # before the pacer looks
        if step == 3:
            self.entry.close()  # its lock goes with it, as when its process ends
        elif step == 4:
            self.entry = register(self.registry, 999102)

    def on_note(self, note: Note) -> None:
        if not note.warning:  # not the warmup's, before the run
            self.messages.append(note.text)


def train_beside_a_neighbour(monkeypatch, tmp_path, setting) -> Neighbour:
    """Train 5 steps on 2 cores with `threads=setting` while the neighbours come and go."""
    registry = tmp_path / "procs"
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # else it decides, as in the suite
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads.CpuLoad, "others", lambda self, pids: 0)  # no other program
    # A pacer that looks at every step instead of once a second: no clock in the test.
    monkeypatch.setattr(session, "ThreadPacer", lambda claim: ThreadPacer(claim, every_s=0))
    cfg = load_config(None, [*TINY, "train.steps=5", "train.eval_every=0",
                             f"threads={setting}", "log.tensorboard=false"])
    reporter = Neighbour(registry, register(registry, 999101))
    try:
        with ThreadClaim(setting, registry) as claim:
            summary = session.start_training(
                cfg, RunOptions(run_dir=tmp_path / "run", threads=claim), [reporter])
    finally:
        reporter.entry.close()
        torch.set_num_threads(1)  # the suite's pinned count (conftest)
    assert summary["status"] == "finished" and summary["step"] == 5
    return reporter


def test_auto_threads_follow_the_neighbours_during_a_run_and_say_so_once(monkeypatch, tmp_path):
    # One neighbour on auto: 1 thread each. It ends: 2. Another starts: 1 again, unsaid (a
    # suite's worth of neighbours printed 16 such lines into a learner's first run).
    reporter = train_beside_a_neighbour(monkeypatch, tmp_path, "auto")
    assert reporter.messages == [
        "step 3: now 2 threads instead of 1: a minitfm process ended, and threads=auto shares "
        "the cores among minitfm's processes (later changes are not shown; see "
        "docs/operations.md#many-runs-on-one-machine)"]
    assert reporter.threads == {1: 1, 2: 1, 3: 1, 4: 2, 5: 1}  # every change made, one said


def test_the_threads_note_says_which_way_and_why():
    assert session.threads_note(126, 2, 1).startswith(
        "step 126: now 1 thread instead of 2: another minitfm process started, and threads=auto "
        "shares the cores")


def test_a_fixed_count_stays_whatever_the_neighbours_do(monkeypatch, tmp_path):
    assert train_beside_a_neighbour(monkeypatch, tmp_path, 1).messages == []


class BusyProgram(Instrument):
    """An instrument through which another program gets busy after step 2 and stops after
    step 4 (what /proc would show: `others` reads it); it keeps the notes and thread counts."""

    def __init__(self):
        self.busy, self.messages, self.threads = 0, [], {}

    def on_step(self, stepped: Stepped) -> None:
        self.threads[stepped.step] = torch.get_num_threads()  # before the pacer looks
        self.busy = {2: 1, 4: 0}.get(stepped.step, self.busy)

    def on_note(self, note: Note) -> None:
        if not note.warning:
            self.messages.append(note.text)


def test_auto_threads_leave_a_busy_program_its_core_and_say_so(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(session, "ThreadPacer", lambda claim: ThreadPacer(claim, every_s=0))
    program = BusyProgram()
    monkeypatch.setattr(threads.CpuLoad, "others", lambda self, pids: program.busy)
    cfg = load_config(None, [*TINY, "train.steps=5", "train.eval_every=0", "threads=auto",
                             "log.tensorboard=false"])
    try:
        with ThreadClaim("auto", tmp_path / "procs") as claim:
            session.start_training(cfg, RunOptions(run_dir=tmp_path / "run", threads=claim),
                                   [program])
    finally:
        torch.set_num_threads(1)  # the suite's pinned count (conftest)
    assert program.messages == [
        "step 2: now 1 thread instead of 2: other programs keep 1 core busy, and threads=auto "
        "leaves them the cores they keep busy (later changes are not shown; see "
        "docs/operations.md#many-runs-on-one-machine)"]
    assert program.threads == {1: 2, 2: 2, 3: 1, 4: 1, 5: 2}
