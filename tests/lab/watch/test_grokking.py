"""Grokking: the modadd task (its rule, its split, its text), its config, and the gauges of
minitfm/lab/watch/grokking.py (after Nanda et al. 2023)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minitfm.config import TaskConfig, load_config
from minitfm.errors import ConfigError, TaskInputError
from minitfm.lab.watch.grokking import (
    GAUGES,
    KEY_FREQUENCIES,
    answer_logits,
    draw_phases,
    fourier_sparsity,
    key_frequencies,
    modadd_gauges,
    phase_steps,
    read_phases,
    restricted_and_excluded,
)
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set
from tests.helpers import assert_clean_error, run_cli, train_bare

CONFIG = Path(__file__).parent.parent / "configs" / "grokking.yaml"
TINY_MODADD = ["task.name=modadd", "task.n_symbols=7", "task.train_fraction=0.5",
               "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
               "model.n_encoder_layers=1", "model.n_decoder_layers=1", "train.steps=20",
               "train.batch_size=24", "train.warmup_steps=2", "train.eval_every=10",
               "train.eval_samples=25", "log.tensorboard=false", "log.attention_every=0",
               "threads=1"]


def modadd(p: int = 11, fraction: float = 0.3, **kw):
    return make_task(TaskConfig(name="modadd", n_symbols=p, train_fraction=fraction, **kw))


def numbers(task, src: list[int]) -> tuple[int, int]:
    a, b = task.format(src).split(" + ")
    return int(a), int(b)


# --- the task ---

def test_the_target_is_the_sum_mod_p_for_every_pair():
    task = modadd(p=13)
    for src, target in task.pairs("train") + task.pairs("eval"):
        a, b = numbers(task, src)
        assert task.format(target) == str((a + b) % 13)
        assert task.target(src) == target and len(target) == 1
    assert task.alignment(task.parse("3 + 5")) is None  # the answer reads both operands


def test_a_fixed_share_of_the_pairs_is_trained_on_and_the_rest_held_out():
    task = modadd(p=11, fraction=0.3)
    train = {tuple(src) for src, _ in task.pairs("train")}
    held_out = {tuple(src) for src, _ in task.pairs("eval")}
    assert len(train) == round(0.3 * 121) == 36 and len(held_out) == 121 - 36
    assert not train & held_out and len(train | held_out) == 121
    assert not any(task.is_held_out(list(src)) for src in train)
    assert all(task.is_held_out(list(src)) for src in held_out)
    # The split follows task.eval_seed, not the run's seed: the same for every run seed.
    assert task.pairs("train") == modadd(p=11, fraction=0.3).pairs("train")
    assert task.pairs("train") != modadd(p=11, fraction=0.3, eval_seed=7).pairs("train")


def test_training_draws_training_pairs_and_evaluation_held_out_ones():
    task = modadd(p=11, fraction=0.3)
    train = {tuple(src) for src, _ in task.pairs("train")}
    generator = torch.Generator().manual_seed(0)
    stream = [tuple(src) for _ in range(5) for src, _ in task.sample(50, generator)]
    assert set(stream) <= train
    held = [tuple(src) for src, _ in eval_set(task, 200, seed=3)]
    assert not set(held) & train and len(set(held)) == 85  # every held-out pair, then again
    # A batch of every training pair is each of them once: full-batch training.
    batch = [tuple(src) for src, _ in task.sample(36, generator)]
    assert sorted(batch) == sorted(train)


def test_the_sizes_the_memory_check_reads_are_the_tasks():
    from minitfm import catalog
    from minitfm.run.limits import sequence_lengths

    task, spec = modadd(p=43), catalog.TASKS["modadd"]
    sources = [src for src, _ in task.pairs("train")]
    assert {len(src) for src in sources} == {3} == {spec.longest_source(1), task.max_source_len(1)}
    assert {len(target) for _, target in task.pairs("eval")} == {1} == {spec.longest_target(1)}
    assert len(task.vocab) == spec.vocab_size(43) == 3 + 1 + 43
    assert sequence_lengths("modadd", 1) == (3, 2)  # the source; BOS + answer, answer + EOS
    assert spec.positions_for_inputs(1) == task.positions_for_source(3) == 3


def test_text_reads_and_writes_sums():
    task = modadd(p=43)
    for text in ("40 + 25", "40+25", " 40 +25 "):
        src = task.parse(text)
        assert task.format(src) == "40 + 25"
        assert task.format_like(task.target(src), text) == "22"
    assert make_task(TaskConfig(name="modadd")).example() == ("7 + 5", "2")
    for text, problem in [("40", "has no '\\+'"), ("1+2+3", "has 2 '\\+' signs"),
                          ("3 4 + 5", "one number on each side"), ("+5", "one number on each"),
                          ("43 + 1", "'43' is not a symbol")]:
        with pytest.raises(TaskInputError, match=problem):
            task.parse(text)


# --- its settings ---

@pytest.mark.parametrize("overrides, message", [
    (["task.train_fraction=0.5"], "task.train_fraction (0.5) applies only to task 'modadd'"),
    (["task.name=modadd", "task.train_fraction=1.5"], "must be between 0 and 1"),
    (["task.name=modadd", "task.train_fraction=0"], "must be between 0 and 1"),
    (["task.name=modadd", "task.n_symbols=3", "task.train_fraction=0.05"],
     "trains on no pair of the 9 (task.n_symbols 3, squared): raise it to at least 0.111"),
    (["task.name=modadd", "task.n_symbols=3", "task.train_fraction=0.99"],
     "trains on every pair of the 9 (task.n_symbols 3, squared): lower it to at most 0.889"),
    (["task.name=modadd", "task.max_len=4"], "do not apply to task 'modadd'"),
    (["task.name=modadd", "task.n_symbols=5000"], "must be at most 1000 for task 'modadd'"),
])
def test_bad_settings_are_one_line_naming_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_cli_refuses_a_bad_fraction_with_exit_code_2(tmp_path):
    result = run_cli("train", "task.name=modadd", "task.train_fraction=1.5",
                     "--run-dir", tmp_path / "run")
    assert_clean_error(result, 2, "task.train_fraction (1.5) must be between 0 and 1")
    assert not (tmp_path / "run").exists()


def test_the_grokking_config_trains_full_batch_and_evaluates_every_held_out_pair():
    cfg = load_config(CONFIG)
    task = make_task(cfg.task)
    assert cfg.task.name == "modadd" and cfg.train.weight_decay >= 0.5
    assert cfg.train.batch_size == len(task.pairs("train"))
    assert cfg.train.eval_samples == len(task.pairs("eval"))
    assert 0 < cfg.train.target_exact_match <= 1


def test_tasks_lists_modadd():
    result = run_cli("tasks")
    assert result.exit_code == 0 and "modadd" in result.stdout and "7 + 5" in result.stdout


def test_predict_reads_a_sum_and_refuses_a_bad_one(tmp_path):
    run_dir = tmp_path / "run"
    train_bare(load_config(None, TINY_MODADD), run_dir=run_dir)
    result = run_cli("predict", run_dir, "3 + 5", "6+6")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.strip() in {str(v) for v in range(7)} for line in lines)
    assert_clean_error(run_cli("predict", run_dir, "3 4 + 5"), 2, "one number on each side")
    # M4: a number after the second is no part of a sum, never read as 3 + 4 and dropped.
    assert_clean_error(run_cli("predict", run_dir, "3 + 4 5"), 2,
                       "input 1 ('3 + 4 5'): '3 + 4 5' needs one number on each side of '+'")
    # An input that begins with '-' is an input (minitfm has no one-letter options), in its
    # place among the others, the options around it honoured.
    assert_clean_error(run_cli("predict", run_dir, "-1+2"), 2,
                       "input 1 ('-1+2'): '-' is not a symbol of task 'modadd'")
    result = run_cli("predict", run_dir, "3 + 5", "-1+2", "--json")
    assert_clean_error(result, 2, "input 2 ('-1+2'): '-' is not a symbol")
    assert json.loads(result.stdout)["input"] == "3 + 5"
    assert_clean_error(run_cli("predict", run_dir, "-1+2", "--checkpoint"), 2,
                       "'--checkpoint': needs a value")
    assert_clean_error(run_cli("predict", run_dir, "--jsn", "-1+2"), 2, "No such option: --jsn")
    assert_clean_error(run_cli("eval", run_dir, "--max-len", "4"), 2,
                       "lengths 1..4 do not apply to task 'modadd'")
    assert run_cli("eval", run_dir, "--samples", "20").exit_code == 0


# --- the gauges ---

def wave_logits(p: int, keys: list[int], vocab: int, first: int) -> torch.Tensor:
    """Logits (p², vocab) that are exactly key-frequency sums: Σ_k 3 cos(w_k (a + b - c)) for
    the answer symbols c, 0 elsewhere (the output's mean over the inputs is 0)."""
    a = torch.arange(p, dtype=torch.float64)
    total = (a[:, None] + a[None, :]).flatten()  # (P,)
    logits = torch.zeros(p * p, vocab, dtype=torch.float64)
    for k in keys:
        logits[:, first:first + p] += 3 * torch.cos(2 * math.pi * k * (total[:, None] - a) / p)
    return logits


def test_restricted_loss_of_key_frequency_logits_is_their_loss():
    p, keys, vocab, first = 17, [2, 5, 7], 21, 4
    logits = wave_logits(p, keys, vocab, first)
    a = torch.arange(p)
    answers = ((a[:, None] + a[None, :]) % p).flatten() + first
    train = torch.rand(p * p, generator=torch.Generator().manual_seed(0)) < 0.3
    assert key_frequencies(logits, p, count=3) == keys
    restricted, excluded = restricted_and_excluded(logits, answers, train, p, keys)
    assert restricted == pytest.approx(F.cross_entropy(logits, answers).item(), abs=1e-9)
    assert excluded == pytest.approx(math.log(vocab), abs=1e-9)  # nothing left: uniform
    # Kept without a key frequency, the loss is worse; taken out without it, better.
    worse, better = restricted_and_excluded(logits, answers, train, p, keys[:2])
    assert worse > restricted and better < excluded


def test_the_excluded_loss_is_the_training_pairs_and_the_restricted_keeps_each_outputs_bias():
    """K3: a memorised bump at the answer of each training pair, which no key frequency
    carries: with the keys taken out the training pairs are still answered (below log V), the
    held-out ones are not. K2: a constant per output (a bias) is no wave: the restricted logits
    keep it, so their loss is still the logits' own."""
    p, keys, vocab, first = 17, [2, 5, 7], 21, 4
    a = torch.arange(p)
    answers = ((a[:, None] + a[None, :]) % p).flatten() + first
    train = torch.rand(p * p, generator=torch.Generator().manual_seed(0)) < 0.3
    bumped = wave_logits(p, keys, vocab, first)
    bumped[train, answers[train]] += 6.0  # memory of the training pairs
    _, excluded = restricted_and_excluded(bumped, answers, train, p, keys)
    _, held_out = restricted_and_excluded(bumped, answers, ~train, p, keys)
    assert excluded < 0.5 < math.log(vocab) < held_out
    biased = wave_logits(p, keys, vocab, first)
    biased[:, [0, first, first + 3]] += 2.0  # the same for every input: each output's bias
    restricted, _ = restricted_and_excluded(biased, answers, train, p, keys)
    assert restricted == pytest.approx(F.cross_entropy(biased, answers).item(), abs=1e-9)


def test_sparsity_of_a_few_waves_is_one_and_of_noise_is_low():
    p = 31
    a = torch.arange(p, dtype=torch.float64)
    waves = torch.stack([torch.cos(2 * math.pi * 4 * a / p), torch.sin(2 * math.pi * 9 * a / p),
                         torch.ones(p)], dim=1)  # (p, 3): two frequencies and a constant
    assert fourier_sparsity(waves) == pytest.approx(1.0, abs=1e-9)
    noise = torch.randn(p, 64, generator=torch.Generator().manual_seed(0))
    assert fourier_sparsity(noise) < 2 * KEY_FREQUENCIES / (p // 2)
    # K7: the share is that of the 5 strongest frequencies, as many as Nanda et al.'s model used.
    def equal_waves(*frequencies):  # (p, len): a cosine each, all of the same energy
        return torch.stack([torch.cos(2 * math.pi * k * a / p) for k in frequencies], dim=1)

    assert fourier_sparsity(equal_waves(1, 3, 4, 6, 8)) == pytest.approx(1.0, abs=1e-9)
    assert fourier_sparsity(equal_waves(1, 2, 3, 4, 6, 8)) == pytest.approx(5 / 6, abs=1e-9)


def test_the_gauges_of_a_tiny_model_are_those_of_its_own_logits(tmp_path):
    """Each pair (a, b) through the model alone, its answer's logits a row: `answer_logits`
    holds them in the order a * p + b (K4), on both sides of the split; the restricted and
    excluded losses are those of these logits, their key-frequency waves projected out by hand."""
    from minitfm import load_run
    from minitfm.book.metrics import predict

    run_dir = tmp_path / "run"
    train_bare(load_config(None, TINY_MODADD), run_dir=run_dir)
    run = load_run(run_dir, checkpoint="last")
    model, task, p, first = run.model, run.task, run.task.n_symbols, run.task.first_data_id
    model.eval()
    with torch.no_grad():
        alone = torch.stack([model(torch.tensor([task.parse(f"{a} + {b}")]),
                                   torch.tensor([[task.vocab.bos_id]]))[0, 0]
                             for a in range(p) for b in range(p)]).double()  # (P, V)
    assert task.held_out.any() and (~task.held_out).any()  # both sides of the split
    assert torch.allclose(answer_logits(model, task).double(), alone, atol=1e-5)
    gauges = modadd_gauges(model, task)
    assert set(gauges) == {"train_exact", "restricted_loss", "excluded_loss", "fourier_sparsity"}
    keys = key_frequencies(alone, p)
    total = torch.tensor([(a + b) % p for a in range(p) for b in range(p)], dtype=torch.float64)
    keyed = torch.zeros_like(alone)
    for k in keys:
        angle = 2 * math.pi * k * total / p
        for wave in (torch.cos(angle), torch.sin(angle)):
            wave = wave / wave.norm()
            keyed += wave[:, None] * (wave @ alone)[None, :]  # the logits' part along it
    answers = total.long() + first
    train = ~task.held_out
    assert gauges["restricted_loss"] == pytest.approx(
        F.cross_entropy(alone.mean(dim=0) + keyed, answers).item(), rel=1e-4)
    assert gauges["excluded_loss"] == pytest.approx(
        F.cross_entropy((alone - keyed)[train], answers[train]).item(), rel=1e-4)
    assert gauges["fourier_sparsity"] == pytest.approx(1.0)  # p = 7: 3 frequencies, all kept
    pairs = task.pairs("train")
    decoded = predict(model, task, [src for src, _ in pairs], "cpu")
    right = sum(pred == target for pred, (_, target) in zip(decoded, pairs, strict=True))
    assert gauges["train_exact"] == right / len(pairs)
    model.train()
    modadd_gauges(model, task)
    assert model.training  # measured in eval mode, given back as it was


# --- the figure of the three phases ---

def write_metrics(run_dir: Path, lines: list) -> None:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(
        (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def test_the_phases_are_read_from_the_eval_and_gauge_lines(tmp_path):
    gauges = {"exact": 0.1, "loss": 2.0, "token_accuracy": 0.5,  # every reading's own
              "restricted_loss": 2.0, "excluded_loss": 0.01, "fourier_sparsity": 0.3}
    lines = [{"step": 100, "split": "train", "loss": 1.0},
             {"step": 100, "split": "gauges", "train_exact": 0.5, **gauges},
             {"step": 100, "split": "eval", "loss": 3.0, "exact_match": 0.1},
             {"step": 200, "split": "gauges", "train_exact": 1.0, **gauges},
             {"step": 200, "split": "eval", "loss": 3.0, "exact_match": 0.1},
             {"step": 300, "split": "eval", "loss": 2.0, "exact_match": 0.3},
             "not json", {"step": "x", "split": "eval", "exact_match": 0.9},
             {"step": 400, "split": "eval", "loss": 1.0, "exact_match": 0.6},
             {"step": 500, "split": "gauges", "train_exact": 1.0, **gauges,
              "restricted_loss": 0.1},
             {"step": 500, "split": "eval", "loss": 0.1, "exact_match": 0.995}]
    write_metrics(tmp_path / "run", lines)
    curves = read_phases(tmp_path / "run")
    assert curves["held_out"] == [(100, 0.1), (200, 0.1), (300, 0.3), (400, 0.6), (500, 0.995)]
    assert curves["restricted_loss"] == [(100, 2.0), (200, 2.0), (500, 0.1)]
    assert phase_steps(curves) == {"memorised": 200, "jump_begins": 300, "grokked": 500}
    found = draw_phases(tmp_path / "run", tmp_path / "phases.png")
    assert found["phases"] == phase_steps(curves)
    assert found["gauges"]["grokked"]["restricted_loss"] == 0.1
    assert (tmp_path / "phases.png").read_bytes().startswith(b"\x89PNG")


def test_a_modadd_run_writes_its_gauges_in_metrics_jsonl(tmp_path):
    result = run_cli("train", *TINY_MODADD, "log.gauge_every=10", "log.log_every=10",
                     "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    readings = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text()
                               .splitlines()) if r["split"] == "gauges"]
    assert [r["step"] for r in readings] == [10, 20]
    assert all(set(GAUGES) <= set(r) and "weight_norm" in r for r in readings)
    curves = read_phases(tmp_path / "run")
    assert [step for step, _ in curves["restricted_loss"]] == [10, 20]
    # the progress line shows the gauge that moves in grokking's plateau, not the alignment
    line = next(line for line in result.stdout.splitlines() if line.startswith("step "))
    assert f"sparsity {readings[0]['fourier_sparsity']:.2f}" in line, line
