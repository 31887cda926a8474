"""Training with torchrun on one machine: 2 CPU processes (gloo), real launches.

Two launches, as torchrun's start-up is the slow part. The CLI as a user runs it
(`torchrun --no-python minitfm train ...`), stopped by a SIGTERM sent to torchrun. And this
file as the worker script (`python -m torch.distributed.run ... -m tests.run.test_distributed OUT
CKPT`) for the rest: one step keeps the ranks identical and equals a single-process step on the
same data; a run learns in one run directory; an exact resume; a single-process checkpoint
resumed; NaN and a signal on one rank only. Each rank writes what it saw; the tests read it.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch

from minitfm.app.api import train_run as train  # with TensorBoard and the attention recorder
from minitfm.book.loop import train_step
from minitfm.config import load_config
from minitfm.errors import MinitfmError
from minitfm.run.checkpoint import load_checkpoint
from minitfm.run.state import init_state
from minitfm.tasks.base import make_batch
from tests.helpers import TINY, given_once, run_cli

pytestmark = pytest.mark.slow  # torchrun launches: several seconds each

ROOT = Path(__file__).resolve().parents[2]
NPROC = 2
CHECKS = ("one_step", "learn", "resume", "single", "nan", "signal")  # what `worker` records
HANG_S = 600  # a hang guard, not a speed limit: far past any launch here on a busy machine


def tiny(*overrides: str):
    return load_config(None, [*TINY, "device=cpu", *overrides])


def metrics(run_dir: Path, split: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def launch_command(*args: str) -> list[str]:
    """`python -m torch.distributed.run`: 2 processes on this machine, rendezvous on localhost."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={NPROC}", *args]


def launch_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def skip_without_torchrun() -> None:
    """Skip (with the reason) where torchrun cannot work: no gloo, no loopback TCP, no TCPStore
    (the rendezvous of `--standalone`). Past these checks a launch that fails is a failure."""
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
        store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True,
                                           timeout=datetime.timedelta(seconds=60))
        store.set("probe", "ok")
        del store
    except (OSError, RuntimeError) as err:
        pytest.skip(f"cannot open a TCP port or a TCPStore on 127.0.0.1 for torchrun ({err})")


def start(*args: str) -> subprocess.Popen:
    skip_without_torchrun()
    return subprocess.Popen(launch_command(*args), cwd=ROOT, env=launch_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def give_up(proc: subprocess.Popen, why: str) -> None:
    """SIGTERM a hung torchrun (it ends its workers; a SIGKILL would leave them) and fail."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    pytest.fail(f"{why}: {err[-3000:]}")


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    """Wait for a torchrun job to end; one still running after HANG_S seconds fails."""
    try:
        return proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        give_up(proc, f"torchrun job still running after {HANG_S} s")


# --- the CLI as a user runs it, stopped by a signal to torchrun (which forwards it) ---


def test_cli_under_torchrun_reports_once_and_stops_every_rank_on_sigterm(tmp_path):
    run_dir = tmp_path / "run"
    script = Path(sys.executable).with_name("minitfm")
    entry = ["--no-python", str(script)] if script.exists() else ["-m", "minitfm"]
    # device=cpu: two ranks on gloo anywhere (on a machine with one GPU, device auto would ask
    # for cuda:1 in rank 1, which minitfm refuses in one line; seen on an H100 machine)
    proc = start(*entry, *given_once(["train", *TINY, "train.steps=100000", "train.eval_every=0",
                                      "log.log_every=1", "log.tensorboard=false", "device=cpu",
                                      "--run-dir", run_dir]))
    deadline = time.monotonic() + HANG_S
    log = run_dir / "metrics.jsonl"
    while not (log.exists() and len(log.read_text().splitlines()) >= 5):
        if proc.poll() is not None:  # a launch failure (rendezvous included) fails the test
            _, stderr = proc.communicate()
            pytest.fail(f"torchrun exited with code {proc.returncode} before training logged "
                        f"5 steps: {stderr[-3000:]}")
        if time.monotonic() > deadline:
            give_up(proc, f"training under torchrun logged no 5 steps in {HANG_S} s")
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = finish(proc)
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
    assert 5 <= saved < 100000
    assert len(metrics(run_dir, "train")) == saved  # rank 0 logged up to the saved step
    assert stdout.count("run directory:") == 1, stdout  # rank 0 alone reports
    assert "2 ranks × train.batch_size 64 = global batch 128 sequences per step" in stdout
    assert stderr.count("interrupted: ") == 1, stderr[-3000:]  # one line for all ranks
    assert f"interrupted: SIGTERM at step {saved}: saved" in stderr and "error:" not in stderr
    assert f"interrupted at step {saved} of 100000" in stdout  # rank 0's summary


# --- library-level checks, this file run as the worker script ---


def shared_batch(task):
    """The same 16 sequences on every rank."""
    return make_batch(task.sample(16, torch.Generator().manual_seed(7)), task.vocab)


@pytest.fixture(scope="module")
def worker_out(tmp_path_factory):
    """A single-process checkpoint at step 20 of 40, then one launch of `worker` below."""
    out = tmp_path_factory.mktemp("ddp")
    train(tiny("train.steps=40", "train.eval_every=20", "log.tensorboard=false"),
          run_dir=out / "single", stop_at=20)
    proc = start("-m", __name__, str(out),  # tests.run.test_distributed
                 str(out / "single" / "checkpoints" / "last.pt"))
    _, stderr = finish(proc)
    assert proc.returncode == 0, stderr[-3000:]  # each rank records its own outcomes
    missing = [f"{name}-{r}.json" for name in CHECKS for r in range(NPROC)
               if not (out / f"{name}-{r}.json").exists()]
    assert not missing, (missing, stderr[-3000:])
    return out


def outcome(out: Path, name: str, rank: int) -> dict:
    return json.loads((out / f"{name}-{rank}.json").read_text())


def test_torchrun_learns_in_one_run_directory_and_stops_early_together(worker_out):
    seen = [outcome(worker_out, "learn", r) for r in range(NPROC)]
    assert seen[0]["exact_match"] >= 0.9 and seen[0]["step"] < 200, seen
    per_process = {"wall_s": 0, "peak_rss_mb": 0}  # each rank's own clock and memory
    assert seen[1] | per_process == seen[0] | per_process  # the same stop, the same metrics
    run_dirs = list((worker_out / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs  # rank 0 named it, the other rank used that name
    run_dir = run_dirs[0]
    assert seen[1]["run_dir"] == str(run_dir)
    steps, stop = [r["step"] for r in metrics(run_dir, "eval")], seen[0]["step"]
    # every 50 steps, and those a quick check (every 10 steps) called, the last one the stop
    assert set(range(50, stop + 1, 50)) <= set(steps) and steps[-1] == stop
    assert all(step % 10 == 0 for step in steps)
    assert [r["step"] for r in metrics(run_dir, "train")] == list(range(10, steps[-1] + 1, 10))
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1  # one writer: rank 0


def test_a_ddp_checkpoint_evaluates_in_one_process(worker_out):
    run_dir = next((worker_out / "runs").iterdir())
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert not [k for k in state["model"] if k.startswith("module.")]
    assert len(state["rng"]["ranks"]) == NPROC
    result = run_cli("eval", run_dir, "--checkpoint", "last", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["exact_match"] >= 0.9


def test_one_step_keeps_ranks_identical_on_different_data(worker_out):
    own = [torch.load(worker_out / f"own-{r}.pt", weights_only=True) for r in range(NPROC)]
    assert not torch.equal(own[0]["src"], own[1]["src"])  # seed + rank: different batches
    for name, tensor in own[0]["model"].items():
        assert torch.equal(tensor, own[1]["model"][name]), name


def test_one_ddp_step_equals_one_single_process_step_on_the_same_data(worker_out):
    state = init_state(tiny(), torch.device("cpu"))
    train_step(state, shared_batch(state.task))
    for r in range(NPROC):
        ddp = torch.load(worker_out / f"shared-{r}.pt", weights_only=True)["model"]
        for name, tensor in state.model.state_dict().items():
            torch.testing.assert_close(ddp[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_under_ddp_is_exact(worker_out):
    straight = [r["loss"] for r in metrics(worker_out / "straight", "train")]
    resumed = [r["loss"] for r in metrics(worker_out / "split", "train")]
    assert len(straight) == len(resumed) == 30
    assert straight == resumed
    evals = [r["exact_match"] for r in metrics(worker_out / "split", "eval")]
    assert evals == [r["exact_match"] for r in metrics(worker_out / "straight", "eval")]


def test_a_single_process_checkpoint_resumes_under_ddp(worker_out):
    for r in range(NPROC):
        result = outcome(worker_out, "single", r)
        assert result["step"] == 40 and not result["paused"], result
    run_dir = worker_out / "single"
    assert [r["step"] for r in metrics(run_dir, "train")] == list(range(10, 41, 10))
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 40


def test_nan_on_one_rank_stops_every_rank(worker_out):
    seen = [outcome(worker_out, "nan", r) for r in range(NPROC)]
    assert all(s["error"] == "RunFailed" and "loss became nan at step 1" in s["message"]
               for s in seen), seen
    assert [s["silent"] for s in seen] == [False, True]  # the CLI prints rank 0's line only
    assert not list((worker_out / "nan" / "checkpoints").glob("*.pt"))


def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step(worker_out):
    seen = [outcome(worker_out, "signal", r) for r in range(NPROC)]
    assert all(s["error"] == "Interrupted" and s["code"] == 143 for s in seen), seen
    assert all("SIGTERM at step 5:" in s["message"] for s in seen), seen
    assert load_checkpoint(worker_out / "signal" / "checkpoints" / "last.pt")["step"] == 5


def test_a_ddp_checkpoint_resumes_in_one_process(worker_out, tmp_path):
    """Another process count on resume (2 -> 1): the run goes on from the step it stopped at,
    with rank 0's random streams, and finishes in the same run directory."""
    import shutil

    run_dir = tmp_path / "signal"
    shutil.copytree(worker_out / "signal", run_dir)  # the module's run stays as the others read it
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert len(saved["rng"]["ranks"]) == NPROC
    # in one process the checkpoint's streams are rank 0's: dropout and batches go on from them
    state = init_state(tiny(), torch.device("cpu"))
    state.load_state_dict(saved)
    rank0 = saved["rng"]["ranks"][0]
    assert torch.equal(state.data_rng.get_state(), rank0["data"])
    assert torch.equal(torch.get_rng_state(), rank0["torch"])
    summary = train(None, resume=run_dir / "checkpoints" / "last.pt",
                    overrides=["train.steps=30"])
    assert summary["status"] == "finished" and summary["step"] == 30, summary
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["step"] == 30 and "ranks" not in state["rng"]  # a one-process checkpoint now
    losses = [r["loss"] for r in metrics(run_dir, "train")]
    assert [r["step"] for r in metrics(run_dir, "train")][-2:] == [20, 30]
    assert all(map(torch.isfinite, torch.tensor(losses)))


def record(out: Path, name: str, rank: int, fn) -> None:
    """Run `fn` and write what happened on this rank: a summary or the error."""
    try:
        result = fn() or {}
    except MinitfmError as err:
        result = {"error": type(err).__name__, "message": str(err), "code": err.exit_code,
                  "silent": getattr(err, "silent", False)}
    (out / f"{name}-{rank}.json").write_text(json.dumps(result))


def one_step(out: Path, rank: int) -> None:
    """One step on this rank's own data, then one on data all ranks share; save each."""
    from minitfm.run import distributed
    with distributed.session("cpu") as dist:
        state = init_state(tiny(), dist.device, dist)
        batch = make_batch(state.task.sample(16, state.data_rng), state.task.vocab)
        train_step(state, batch)
        torch.save({"model": state.model.state_dict(), "src": batch.src}, out / f"own-{rank}.pt")
        state = init_state(tiny(), dist.device, dist)
        train_step(state, shared_batch(state.task))
        torch.save({"model": state.model.state_dict()}, out / f"shared-{rank}.pt")


def resume_exactly(out: Path) -> None:
    cfg = tiny("model.dropout=0.1", "train.steps=30", "log.log_every=1", "train.eval_every=10",
               "train.target_exact_match=null", "log.tensorboard=false")
    train(cfg, run_dir=out / "straight")
    train(cfg, run_dir=out / "split", stop_at=15)
    return train(None, resume=out / "split" / "checkpoints" / "last.pt")


def nan_on_rank_1(out: Path, rank: int) -> None:
    from minitfm.book.model import sequence_loss as real

    def poisoned(*args, **kwargs):
        return real(*args, **kwargs) * (float("nan") if rank == 1 else 1.0)

    with mock.patch("minitfm.book.loop.sequence_loss", poisoned):
        train(tiny("train.steps=20", "train.eval_every=0"), run_dir=out / "nan")


def signal_on_rank_1(out: Path, rank: int) -> None:
    import minitfm.book.loop as loop

    real = loop.train_step

    def step_then_signal(state, batch):
        result = real(state, batch)
        if rank == 1 and state.step == 5:  # only this rank gets it, between two steps
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    with mock.patch.object(loop, "train_step", step_then_signal):
        train(tiny("train.steps=200", "train.eval_every=0", "log.tensorboard=false"),
              run_dir=out / "signal")


def worker(out: Path, single_checkpoint: Path) -> None:
    """Each rank of the launch: run every check in turn and write what it saw into `out`."""
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    # One process group for all the checks: `session` uses it rather than making one per call.
    torch.distributed.init_process_group("gloo")
    record(out, "one_step", rank, lambda: one_step(out, rank))
    record(out, "learn", rank, lambda: train(tiny("train.target_exact_match=0.9",
                                                  f"log.dir={out / 'runs'}")))
    record(out, "resume", rank, lambda: resume_exactly(out))
    record(out, "single", rank, lambda: train(None, resume=single_checkpoint))
    record(out, "nan", rank, lambda: nan_on_rank_1(out, rank))
    record(out, "signal", rank, lambda: signal_on_rank_1(out, rank))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
