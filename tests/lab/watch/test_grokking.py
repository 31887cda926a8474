"""Grokking's gauges (minitfm/lab/watch/grokking.py, after Nanda et al. 2023) and the
figure of its three phases (the modadd task and its config: tests/tasks/test_grokking.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from minitfm.config import load_config
from minitfm.lab.watch.grokking import (
    KEY_FREQUENCIES,
    answer_logits,
    fourier_sparsity,
    key_frequencies,
    modadd_gauges,
    restricted_and_excluded,
)
from minitfm.lab.watch.phases import GAUGES, read_phases
from tests.helpers import run_cli, train_bare
from tests.tasks.test_grokking import TINY_MODADD

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
