"""Grokking's task: modadd (its rule, its split, its text) and its config (the gauges of
minitfm/lab/watch/grokking.py: tests/lab/watch/test_grokking.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minitfm.config import TaskConfig, load_config
from minitfm.errors import ConfigError, TaskInputError
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set
from tests.helpers import assert_clean_error, run_cli, train_bare

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "grokking.yaml"
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


