"""Stacked runs (#48): many runs of one model shape as one stacked model, each equal to its run
alone; `minitfm sweep --stack` and `minitfm stack`."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
import torch

from minitfm.book.metrics import evaluate, predict
from minitfm.book.model import Seq2SeqTransformer, sequence_loss
from minitfm.book.optim import AdamW
from minitfm.config import load_config
from minitfm.errors import Interrupted, MinitfmError
from minitfm.fast.stack import (
    Stack,
    StackedAdamW,
    evaluate_rows,
    predict_rows,
    stack_batches,
)
from minitfm.lab.many import stacking
from minitfm.lab.many.grid import RunSpec
from minitfm.run.checkpoint import load_checkpoint
from minitfm.run.instruments import Instrument
from minitfm.run.stack import StackMember, train_stack
from minitfm.run.stack_key import stack_differences, stack_key
from minitfm.run.summary import read_summary
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set, make_batch
from tests.helpers import TINY, assert_clean_error, run_cli, train_bare

# A loss of a stacked run within this of its run alone (relative), step by step: the same
# numbers up to float rounding (the stack runs the book's modules, a run alone the fast code).
LOSS_TOLERANCE = 1e-3
# A CUDA device named in a config or a torch.device, never used: the tests naming it run without
# one (tests/test_suite.py asks a test that uses a GPU for the `cuda` marker).
NAMED_GPU = "cuda:0"
STEPS = 50
SETTINGS = [*TINY, f"train.steps={STEPS}", "train.eval_every=20", "train.eval_samples=60",
            "log.tensorboard=false", "threads=1", "train.checkpoint_every=20"]


def models_of(cfg, seeds):
    task = make_task(cfg.task)
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(Seq2SeqTransformer(cfg.model, len(task.vocab), task.vocab.pad_id))
    base = Seq2SeqTransformer(cfg.model, len(task.vocab), task.vocab.pad_id)
    return task, models, base


def copies(models):
    """Models alone, with the same weights (the stack takes the originals' parameters)."""
    alone = []
    for model in models:
        twin = Seq2SeqTransformer(model.config, model.vocab_size, model.pad_id)
        twin.load_state_dict(model.state_dict())
        alone.append(twin)
    return alone


def test_a_stacks_losses_and_gradients_are_each_runs_alone():
    """Each row's loss and gradient on its own batch (batches of other lengths padded to the
    longest) are its model's alone, to float precision; a subset of rows likewise."""
    cfg = load_config(None, TINY)
    task, models, base = models_of(cfg, [0, 1, 2])
    alone = copies(models)
    stack = Stack(models, base)
    batches = [make_batch(task.sample(16, torch.Generator().manual_seed(s)), task.vocab)
               for s in (3, 4, 5)]
    for rows in (None, torch.tensor([0, 2])):
        chosen = [0, 1, 2] if rows is None else rows.tolist()
        stack.flat.grad = None
        losses = stack.losses(stack_batches([batches[i] for i in chosen], task.vocab.pad_id),
                              rows, 0.0)
        losses.sum().backward()
        for i, row in enumerate(chosen):
            model, batch = alone[row], batches[row]
            model.zero_grad()
            loss = sequence_loss(model(batch.src, batch.tgt_in), batch.tgt_out, task.vocab.pad_id)
            loss.backward()
            grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            assert torch.allclose(losses[i], loss, atol=1e-6, rtol=1e-5)
            assert torch.allclose(stack.flat.grad[row], grad, atol=1e-6, rtol=1e-4)
        if rows is not None:
            assert not stack.flat.grad[1].any()  # a row not stepped gets no gradient


def test_stacked_adamw_steps_each_row_as_the_books_adamw_with_its_own_settings():
    """Given each model's gradient, each row steps as the book's AdamW on that model with the
    row's own lr, weight decay and clipping; a row not active keeps its parameters and moments.
    (The same gradient: Adam divides by sqrt(v), so gradients that differ by rounding where
    they are near zero would move such weights apart by up to lr a step.)"""
    cfg = load_config(None, TINY)
    task, models, base = models_of(cfg, [0, 1, 2])
    alone = copies(models)
    settings = [(1e-2, 0.01, 1.0), (3e-3, 0.1, None), (1e-2, 0.0, 1e-3)]  # lr, decay, clip
    stack = Stack(models, base)
    stacked = StackedAdamW(stack, [decay for _, decay, _ in settings])
    books = [AdamW(model, lr, decay) for model, (lr, decay, _) in zip(alone, settings)]
    active = torch.tensor([True, True, False])
    before = stack.flat[2].detach().clone()
    for step in range(3):
        batch = make_batch(task.sample(16, torch.Generator().manual_seed(step)), task.vocab)
        gradients = []
        for book, model in zip(books, alone):
            book.zero_grad()
            sequence_loss(model(batch.src, batch.tgt_in), batch.tgt_out,
                          task.vocab.pad_id).backward()
            gradients.append(book.gradient())
        stack.flat.grad = torch.stack(gradients)
        clip = torch.tensor([c if c is not None else float("inf") for _, _, c in settings])
        norms = stacked.step(torch.tensor([lr for lr, _, _ in settings]), clip, active)
        for row in (0, 1):
            assert torch.allclose(norms[row], books[row].step(settings[row][2]), rtol=1e-6)
            assert torch.allclose(stack.flat[row].detach(), books[row].flat, atol=1e-6)
            assert torch.allclose(stacked.exp_avg[row], books[row].exp_avg, atol=1e-8)
    assert torch.equal(stack.flat[2].detach(), before) and not stacked.exp_avg[2].any()
    assert stacked.row_state(0)["step"] == 3 and stacked.row_state(2)["step"] == 0


def test_decoding_every_row_at_once_gives_each_rows_answers_alone():
    """Greedy decoding and the loss of rows with different held-out sets (other lengths,
    other counts: the rows padded to each other) are the book's `evaluate` and `predict` of
    each model alone."""
    cfg = load_config(None, TINY)
    task, models, base = models_of(cfg, [0, 1, 2])
    alone = copies(models)
    stack = Stack(models, base)
    pair_sets = [eval_set(task, 30, 1), eval_set(task, 7, 2, 1, 3), eval_set(task, 45, 3)]
    rows = [2, 0, 1]  # any order of rows
    results = evaluate_rows(stack, rows, [task] * 3, pair_sets, "cpu", batch_size=16)
    decoded = predict_rows(stack, rows, [task] * 3, [[s for s, _ in p] for p in pair_sets],
                           "cpu", batch_size=16)
    for row, pairs, result, predictions in zip(rows, pair_sets, results, decoded):
        expected = evaluate(alone[row], task, pairs, "cpu", batch_size=16)
        assert result.predictions == expected.predictions == predictions
        assert result.exact_match == expected.exact_match
        assert result.per_length.keys() == expected.per_length.keys()
        assert result.loss == pytest.approx(expected.loss, rel=1e-5)
        assert predictions == predict(alone[row], task, [s for s, _ in pairs], "cpu", 16)


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def configs(extra: dict[int, list[str]]):
    """Seeds 0..2 of SETTINGS, each with its own extra overrides."""
    return {seed: load_config(None, [*SETTINGS, f"seed={seed}", *extra.get(seed, [])])
            for seed in (0, 1, 2)}


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """Seeds 0..2 trained as one stack and alone: seeds 0 and 1 with their own lr and warmup,
    seed 0 (the stack's first row) with a target it reaches early: it stops there while the
    others go on, so that each later row's place among the rows still stepping is no longer
    its row (a run handed another's figures would show)."""
    root = tmp_path_factory.mktemp("stack")
    cfgs = configs({0: ["train.lr=8e-3", "train.warmup_steps=5", "train.eval_every=10",
                        "train.target_exact_match=0.1"],
                    1: ["train.lr=2e-3", "train.warmup_steps=5"]})
    said = []
    summaries = train_stack([StackMember(cfg, root / f"stacked{s}") for s, cfg in cfgs.items()],
                            lambda: [], said.append)
    for seed, cfg in cfgs.items():
        train_bare(cfg, run_dir=root / f"alone{seed}")
    return root, cfgs, summaries, said


def test_each_stacked_run_trains_as_its_run_alone(three_runs):
    """Each run's logged training losses and gradient norms are its own alone within
    LOSS_TOLERANCE, its evaluations the same, its own lr schedule; the early-stopped run stops
    where it did alone, and the rows after it keep their own figures."""
    root, cfgs, summaries, said = three_runs
    for seed in cfgs:
        stacked, alone = metrics(root / f"stacked{seed}"), metrics(root / f"alone{seed}")
        assert [(r["step"], r["split"]) for r in stacked] == \
            [(r["step"], r["split"]) for r in alone]
        for a, b in zip(stacked, alone):
            assert a["loss"] == pytest.approx(b["loss"], rel=LOSS_TOLERANCE), (seed, a, b)
            if a["split"] == "train":
                assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)
                assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=LOSS_TOLERANCE), \
                    (seed, a, b)
            else:
                assert a["exact_match"] == pytest.approx(b["exact_match"], abs=0.02)
    early = read_summary(root / "stacked0")
    assert early["status"] == "stopped at target" and early["step"] < STEPS
    assert early["step"] == read_summary(root / "alone0")["step"] and early["stack"] == 3
    assert [s["status"] for s in summaries] == ["stopped at target", "finished", "finished"]
    assert any(r["step"] > early["step"] for r in metrics(root / "stacked1"))


def test_a_stacks_log_says_its_steps_time_left_and_each_runs_end(three_runs):
    """A stack's log reads as a run's: a line at each train line (every log.log_every steps:
    the steps, the runs still training, their losses and exact match, the time left), and a
    line for each run as it ends, saying how, in the words `minitfm train` ends with."""
    root, cfgs, summaries, said = three_runs
    assert said[0] == "stack of 3 runs on cpu, 1 thread (1)"
    progress = [re.fullmatch(r"step (\d+)/50: (\d) of 3 runs training, loss [\d.]+(-[\d.]+)?"
                             r"(, exact match [\d.]+(-[\d.]+)?%)?(, about \d+ (s|min) left)?",
                             line) for line in said[1:] if line.startswith("step ")]
    assert all(progress), said
    assert [int(found[1]) for found in progress] == list(range(10, STEPS + 1, 10))
    assert all(found[6] for found in progress[:-1]) and not progress[-1][6]  # time left
    early = read_summary(root / "stacked0")["step"]
    assert [int(found[2]) for found in progress] == \
        [3 if int(found[1]) < early else 2 for found in progress[:-1]] + [0]
    ends = [line for line in said[1:] if not line.startswith("step ")]
    assert ends == [f"stacked0: reached the 10% target at step {early} of {STEPS}, exact match "
                    f"{summaries[0]['exact_match']:.1%}",
                    *(f"stacked{s}: finished all {STEPS} steps (best exact match "
                      f"{summaries[s]['best_exact_match']:.1%}, short of the 99% target)"
                      for s in (1, 2))]
    assert said.index(ends[0]) < len(said) - 3  # said as it ended, before the others went on


def test_a_stacked_runs_directory_is_a_run_alone(three_runs):
    """The same files; checkpoints of one run's size, in the same format (`--resume` and the
    lab commands take them); the weights of the early-stopped run did not change after."""
    root, _, _, _ = three_runs
    run_dir = root / "stacked0"
    names = {p.name for p in (root / "alone0").iterdir()}
    assert {p.name for p in run_dir.iterdir()} == names
    last, alone = load_checkpoint(run_dir / "checkpoints" / "last.pt"), \
        load_checkpoint(root / "alone0" / "checkpoints" / "last.pt")
    assert last.keys() == alone.keys() and last["step"] == alone["step"]
    assert last["optimizer"]["exp_avg"].shape == alone["optimizer"]["exp_avg"].shape
    sizes = [(d / "checkpoints" / "last.pt").stat().st_size for d in (run_dir, root / "alone0")]
    assert sizes[0] < 1.2 * sizes[1]  # a row's copy, not the whole stack
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    assert all(torch.equal(best["model"][k], last["model"][k]) for k in last["model"])
    result = run_cli("eval", root / "stacked1", "--checkpoint", "last", "--json", "--samples", "20")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["step"] == STEPS


def test_a_stacked_run_goes_on_alone_with_resume(three_runs, tmp_path):
    import shutil

    root, _, _, _ = three_runs
    shutil.copytree(root / "stacked1", tmp_path / "run")
    result = run_cli("train", "--resume", tmp_path / "run", f"train.steps={STEPS + 10}")
    assert result.exit_code == 0, result.stderr
    assert read_summary(tmp_path / "run")["step"] == STEPS + 10


class SignalAt(Instrument):
    """Sends this process SIGINT after step `at` (as a Ctrl-C would)."""

    def __init__(self, at: int):
        self.at = at

    def on_step(self, stepped) -> None:
        if stepped.step == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_pauses_every_run_of_a_stack_and_the_same_call_goes_on_exactly(tmp_path):
    """SIGINT after step 9 (in the first run's events): every run pauses after the same step,
    10, with its last.pt, `interrupted`; the same call goes on from them, and each run's losses
    (a train line every 10 steps: those after 10 average the same steps) are those of the
    stack trained straight through."""
    cfgs = configs({1: ["train.lr=5e-3"]})
    straight = [StackMember(cfg, tmp_path / f"straight{s}") for s, cfg in cfgs.items()]
    train_stack(straight, lambda: [], lambda text: None)
    members = [StackMember(cfg, tmp_path / f"run{s}") for s, cfg in cfgs.items()]
    signalled = iter([SignalAt(9)])
    with pytest.raises(Interrupted) as stopped:
        train_stack(members, lambda: [next(signalled, Instrument())], lambda text: None)
    assert stopped.value.exit_code == 130
    assert "each of the 3 runs saved its checkpoints/last.pt" in str(stopped.value)
    for member in members:
        assert read_summary(member.run_dir)["status"] == "interrupted"
        assert load_checkpoint(member.checkpoint)["step"] == 10
    train_stack(members, lambda: [], lambda text: None)
    for member, whole in zip(members, straight):
        assert metrics(member.run_dir)[-1]["step"] == STEPS
        assert [r["loss"] for r in metrics(member.run_dir)] == \
            [r["loss"] for r in metrics(whole.run_dir)]


def test_a_stacks_dropout_is_drawn_from_its_first_runs_seed(tmp_path):
    """With dropout (vmap's "different" randomness: a mask per row), a stack draws from a stream
    seeded by its first run: the stack trained twice gives the same losses, and its first run's
    losses do not depend on the seed of the run beside it. (All sequences of one length, so
    that the masks have one shape whatever the other row's batch.)"""
    settings = [*SETTINGS, "model.dropout=0.1", "task.min_len=6", "train.steps=20"]

    def stack(name: str, seeds: tuple[int, int]) -> list[list[float]]:
        members = [StackMember(load_config(None, [*settings, f"seed={seed}"]),
                               tmp_path / f"{name}{seed}") for seed in seeds]
        train_stack(members, lambda: [], lambda text: None)
        return [[r["loss"] for r in metrics(m.run_dir) if r["split"] == "train"]
                for m in members]

    first, again, beside = stack("a", (0, 1)), stack("b", (0, 1)), stack("c", (0, 2))
    assert len(first[0]) == 2 and first == again
    assert beside[0] == pytest.approx(first[0], rel=1e-6) and beside[1] != first[1]


def test_runs_of_other_shapes_or_batches_never_share_a_stack(tmp_path):
    a = load_config(None, SETTINGS)
    assert stack_differences(a, load_config(None, [*SETTINGS, "seed=3", "train.lr=1"])) == []
    assert stack_differences(a, load_config(None, [*SETTINGS, "model.d_ff=16",
                                                   "train.batch_size=8"])) == \
        ["model.d_ff", "train.batch_size"]
    assert stack_key(load_config(None, [*SETTINGS, f"model.code={tmp_path}"])) is None
    members = [StackMember(a, tmp_path / "a"),
               StackMember(load_config(None, [*SETTINGS, "model.d_ff=16"]), tmp_path / "b")]
    with pytest.raises(MinitfmError, match="model.d_ff differ; stack only runs of one model"):
        train_stack(members, lambda: [], lambda text: None)


def spec(run_id: str, overrides: list[str]) -> RunSpec:
    return RunSpec(run_id, {}, overrides, load_config(None, [*SETTINGS, *overrides]))


def test_the_sweep_stacks_where_it_pays_and_as_asked():
    """On the CPU it does not stack unless asked (a stack is no faster there), on a GPU it does;
    each answer says why; a grid with no two runs of one shape has nothing to stack."""
    seeds = [spec(f"seed={s}", [f"seed={s}"]) for s in range(3)]
    assert stacking.choose_stacking(seeds, None) == (False, (
        "on the CPU a stack is no faster than its runs one by one (docs/speed.md); --stack "
        "stacks them"))
    assert stacking.choose_stacking(seeds, True) == (True, "as asked (--stack)")
    assert stacking.choose_stacking(seeds, False) == (False, "as asked (--no-stack)")
    gpu = [spec(f"seed={s}", [f"seed={s}", f"device={NAMED_GPU}"]) for s in range(3)]
    assert stacking.choose_stacking(gpu, None)[0] is True
    shapes = [spec(f"d_ff={d}", [f"model.d_ff={d}"]) for d in (16, 32)]
    assert stacking.choose_stacking(shapes, True) == \
        (False, "nothing to stack: no two runs share a model shape (--stack)")


def test_stacks_are_cut_by_shape_by_jobs_and_by_memory(monkeypatch):
    runs = [spec(f"d_ff={d},seed={s}", [f"model.d_ff={d}", f"seed={s}"])
            for d in (16, 32) for s in range(4)]
    cut = stacking.plan_stacks(runs, parallel=1)
    assert [[r.id for r in s] for s in cut] == [[r.id for r in runs[:4]], [r.id for r in runs[4:]]]
    assert [len(s) for s in stacking.plan_stacks(runs, parallel=2)] == [2, 2, 2, 2]
    # two runs or more a stack where a shape has them: fewer jobs than asked beat none stacked
    assert [len(s) for s in stacking.plan_stacks(runs, parallel=4)] == [2, 2, 2, 2]
    assert [len(s) for s in stacking.plan_stacks([*runs[:3], runs[4]], parallel=2)] == [2, 1, 1]
    per_run = sum(size for _, _, size in stacking.training_parts(runs[0].cfg))
    monkeypatch.setattr(stacking, "available_bytes",
                        lambda: stacking.PROCESS_BYTES + 3 * per_run + per_run // 2)
    assert [len(s) for s in stacking.plan_stacks(runs, parallel=1)] == [3, 1, 3, 1]


def test_the_stack_command_refuses_what_is_no_sweep_in_one_line(tmp_path):
    assert_clean_error(run_cli("stack", tmp_path, "seed=0"), 2, "holds no sweep")
    (tmp_path / "sweep.json").write_text(json.dumps(
        {"grid": {"config": None, "swept": [["seed", ["0", "1"]]], "fixed": SETTINGS},
         "base": {}}))
    assert_clean_error(run_cli("stack", tmp_path, "seed=7"), 2,
                       "'seed=7' is no run of the sweep")


@pytest.mark.slow
def test_a_stacked_sweep_equals_the_sweep_of_runs_alone(tmp_path):
    """`minitfm sweep --stack` (2 stacks of 2, as 2 jobs) says it stacked, and its table,
    evaluations and run directories are those of `--no-stack`'s, within the tolerance."""
    grid = [*SETTINGS[:-2], "--seeds", "0..3", "--eval-samples", "40", "--eval-lengths", "7..8"]
    stacked = run_cli("sweep", *grid, "--stack", "--out", tmp_path / "stacked")
    assert stacked.exit_code == 0, stacked.stdout + stacked.stderr
    assert "in 2 stacks of 2 runs, 2 at a time" in stacked.stdout
    assert "stacked: as asked (--stack)" in stacked.stdout
    alone = run_cli("sweep", *grid, "--out", tmp_path / "alone")
    assert "not stacked: on the CPU" in alone.stdout
    rows = [{r["run"]: r for r in map(json.loads, (tmp_path / name / "results.jsonl").open())}
            for name in ("stacked", "alone")]
    assert rows[0].keys() == rows[1].keys()
    for run, row in rows[0].items():
        other = rows[1][run]
        assert row["status"] == other["status"] and row["steps"] == other["steps"]
        for span, exact in row["exact_match"].items():
            assert exact == pytest.approx(other["exact_match"][span], abs=0.05)
        evals = [json.loads((tmp_path / name / run / "eval-7-8.json").read_text())
                 for name in ("stacked", "alone")]
        assert evals[0].keys() == evals[1].keys()
        assert [e["checkpoint"] for e in evals] == \
            [str(tmp_path / name / run / "checkpoints" / "last.pt")
             for name in ("stacked", "alone")]
    again = run_cli("sweep", *grid, "--stack", "--out", tmp_path / "stacked")
    assert again.exit_code == 0 and "4 already done" in again.stdout


def test_a_gpu_is_priced_by_its_own_free_memory(monkeypatch):
    """On a CUDA device the refusal counts the GPU's free memory (not the host's) and says so."""
    from minitfm.run import limits

    monkeypatch.setattr(limits, "gpu_free_bytes", lambda device: 1000)
    cfg = load_config(None, SETTINGS)
    with pytest.raises(MinitfmError, match=r"the GPU \(cuda:0\) has 1.0 KB available"):
        limits.check_fits(limits.training_parts(cfg), "training", torch.device(NAMED_GPU))
    limits.check_fits(limits.training_parts(cfg), "training", torch.device("cpu"))


@pytest.mark.cuda  # conftest skips it where no CUDA device is present
def test_a_stack_trains_on_cuda_and_each_row_decodes_as_its_model_alone(tmp_path):
    """On a GPU (bfloat16 autocast in the steps): three runs train to their end, and each row's
    evaluation equals its own model's, decoded alone, in float32."""
    cfgs = {s: load_config(None, [*SETTINGS, f"seed={s}", "device=cuda"]) for s in range(3)}
    summaries = train_stack([StackMember(cfg, tmp_path / f"run{s}") for s, cfg in cfgs.items()],
                            lambda: [], lambda text: None)
    assert [s["status"] for s in summaries] == ["finished"] * 3
    cfg = cfgs[0]
    task, models, base = models_of(cfg, [0, 1, 2])
    alone = [m.cuda() for m in copies(models)]
    stack = Stack([m.cuda() for m in models], base.cuda())
    pairs = eval_set(task, 40, 1)
    for row, result in enumerate(evaluate_rows(stack, [0, 1, 2], [task] * 3, [pairs] * 3,
                                               "cuda")):
        assert result.predictions == evaluate(alone[row], task, pairs, "cuda").predictions
