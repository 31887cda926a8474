"""The bench's torch AdamW, checkpoints of minitfm 0.1, and the deferred reading of the losses."""

import json
from unittest import mock

import pytest
import torch

from minitfm.book.optim import AdamW
from minitfm.config import TrainConfig, load_config
from minitfm.errors import RunFailed
from minitfm.lab.measure.bench import torch_adamw as bench_adamw
from minitfm.run.checkpoint import load_checkpoint, optimizer_state
from tests.book.test_optim import loss_of, small_model, torch_adamw
from tests.helpers import TINY
from tests.helpers import train_bare as train


def tiny(*overrides: str):
    return load_config(None, [*TINY, "threads=1", *overrides])


def test_the_bench_sets_up_torchs_adamw_as_the_reference_here():
    """The bench races minitfm's AdamW against torch's: the same groups and settings."""
    model = small_model()
    bench = bench_adamw(model, TrainConfig(lr=0.01, weight_decay=0.1))
    ref = torch_adamw(model, lr=0.01, weight_decay=0.1)
    assert len(bench.param_groups) == len(ref.param_groups) == 2
    for ours, theirs in zip(bench.param_groups, ref.param_groups, strict=True):
        assert {id(p) for p in ours["params"]} == {id(p) for p in theirs["params"]}
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
            assert ours[key] == theirs[key], key


def test_state_of_torch_adamw_continues_exactly():
    """A minitfm 0.1 checkpoint holds torch.optim.AdamW's state: resuming from it must
    continue as torch's would have."""
    ours_model, ref_model = small_model(), small_model()
    ref = torch_adamw(ref_model, lr=0.01, weight_decay=0.1)
    for step in range(3):
        ref.zero_grad()
        loss_of(ref_model, step).backward()
        ref.step()
    ours_model.load_state_dict(ref_model.state_dict())
    ours = AdamW(ours_model, lr=0.01, weight_decay=0.1)
    ours.load_state_dict(optimizer_state(ref.state_dict(), ours))
    assert ours.t == 3
    for model, step in ((ours_model, ours.step), (ref_model, ref.step)):
        model.zero_grad()
        loss_of(model, 3).backward()
        step()
    for a, b in zip(ours_model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_nan_loss_is_reported_at_its_exact_step_though_read_later(tmp_path):
    """The losses are read every log.log_every steps; the report still names the first bad
    step, and nothing trained after it is saved."""
    import minitfm.book.loop as loop

    real = loop.sequence_loss
    calls = []

    def nan_at_step_7(*args, **kwargs):
        calls.append(1)
        loss = real(*args, **kwargs)
        return loss * float("nan") if len(calls) == 7 else loss

    run_dir = tmp_path / "run"
    with mock.patch.object(loop, "sequence_loss", nan_at_step_7), \
            pytest.raises(RunFailed, match=r"loss became nan at step 7: .*no checkpoint"):
        train(tiny("train.steps=40", "log.log_every=20", "train.eval_every=20",
                   "train.checkpoint_every=0", "log.tensorboard=false"), run_dir=run_dir)
    assert not list((run_dir / "checkpoints").glob("*.pt"))
    assert not (run_dir / "metrics.jsonl").exists()  # no train line was written either


def test_the_logged_loss_is_the_mean_of_the_steps_since_the_last_line(tmp_path):
    run_dir = tmp_path / "run"
    train(tiny("train.steps=6", "log.log_every=3", "train.eval_every=0",
               "log.tensorboard=false"), run_dir=run_dir)
    every = tiny("train.steps=6", "log.log_every=1", "train.eval_every=0",
                 "log.tensorboard=false")
    train(every, run_dir=tmp_path / "every")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").open()]
    singles = [json.loads(x)["loss"] for x in (tmp_path / "every" / "metrics.jsonl").open()
               if json.loads(x)["split"] == "train"]
    losses = [r["loss"] for r in lines if r["split"] == "train"]
    assert losses == pytest.approx([sum(singles[:3]) / 3, sum(singles[3:]) / 3], rel=1e-6)
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 6


@pytest.mark.cuda  # conftest skips it where no CUDA device is present
def test_a_cuda_training_step_never_waits_for_the_gpu(tmp_path):
    """No host sync in the step: any would raise under sync debug mode "error"."""
    from minitfm.book.loop import train_step
    from minitfm.run.schedule import LossMeter
    from minitfm.run.state import init_state
    from minitfm.tasks.base import make_batch

    state = init_state(tiny("device=cuda"), torch.device("cuda"))
    meter = LossMeter(0, state.cfg.train)
    batches = [make_batch(state.task.sample(16, state.data_rng), state.task.vocab)
               for _ in range(3)]
    train_step(state, batches[0].to("cuda"))  # first step: lazy CUDA initialisation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[1:]:
            loss, _ = train_step(state, batch.to("cuda"))
            meter.add(loss, batch.n_target_tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    meter.read()
    assert len(meter.losses) == 2 and all(x == x for x in meter.losses)
