"""Grokking's gauges on modular addition, after Nanda et al. 2023 ("Progress measures for
grokking via mechanistic interpretability", ICLR 2023), adapted to this encoder-decoder.

A model that groks a + b mod p memorises its training pairs, then builds a circuit that adds
by rotating: each number a embedded as waves cos(w_k a), sin(w_k a) of a few key frequencies
w_k = 2πk/p, the answer c read off cos(w_k (a + b - c)); weight decay then cleans the memorised
part away. These gauges read the hidden middle phase, on the model as it is (eval mode, no
gradient, one forward pass over the p² pairs):

- `train_exact`: greedy exact match on the training pairs (the answer and its EOS).
- `restricted_loss`: the answer's cross-entropy over all p² pairs with its logits kept to their
  key-frequency components (and their mean over the pairs): low once the circuit alone answers.
- `excluded_loss`: the answer's cross-entropy on the training pairs with those components taken
  out of the logits: it rises as the training set comes to rest on the circuit, not on memory.
- `fourier_sparsity`: the share of the number embeddings' Fourier energy over 0..p-1 (k =
  1..p//2, the constant left out) in their KEY_FREQUENCIES strongest frequencies: about
  KEY_FREQUENCIES / (p // 2) for a random embedding, near 1 once the embedding is a few waves.

What is adapted. The paper's model is a one-layer decoder whose logits at "=" are the answer;
here the answer is the decoder's first output (after BOS), teacher-forced, and the embedding is
the shared embedding's rows of the data symbols 0..p-1 (what the source reads: the paper's
W_E). The key frequencies are found anew at each call from the logits, not by hand from the
embedding: the KEY_FREQUENCIES frequencies whose waves cos(w_k (a + b)), sin(w_k (a + b)) over
the p² inputs hold the most of the logits' energy (the logits are what a loss reads, and
attention and the feed-forward block mix the embedding's frequencies). A component of the
logits is the paper's: the projection of each output's logit over the p² inputs onto those two
waves. The restricted logits keep each output's mean over the inputs too: its bias, which holds
nothing of a and b, and without which the restricted loss would be that of a model with no bias.

Shapes: P = p² pairs, V vocab_size, D d_model, F frequencies 1..p//2.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from minitfm.book.metrics import evaluate
from minitfm.book.model import eval_mode
from minitfm.lab.watch.phases import KEY_FREQUENCIES
from minitfm.tasks.base import Task, make_batch


def fourier_basis(p: int) -> Tensor:
    """The orthonormal Fourier basis over 0..p-1, (1 + 2F, p) rows: the constant, then
    cos(2πka/p) and sin(2πka/p) for k = 1..p//2 (for an even p the sine of k = p/2 is 0: a zero
    row, kept so that rows 2k - 1 and 2k are always frequency k)."""
    a = torch.arange(p, dtype=torch.float64)
    rows = [torch.ones(p, dtype=torch.float64)]
    for k in range(1, p // 2 + 1):
        rows += [torch.cos(2 * math.pi * k * a / p), torch.sin(2 * math.pi * k * a / p)]
    basis = torch.stack(rows)  # (1 + 2F, p)
    return basis / basis.norm(dim=1, keepdim=True).clamp_min(1e-9)


def frequency_energy(coefficients: Tensor) -> Tensor:
    """Energy (squared norm) per frequency k = 1..F of Fourier coefficients (1 + 2F, ...)."""
    squares = coefficients[1:].pow(2).flatten(1).sum(dim=1)  # (2F,)
    return squares.view(-1, 2).sum(dim=1)  # (F,): the cosine and sine of each k together


def fourier_sparsity(embedding: Tensor, count: int = KEY_FREQUENCIES) -> float:
    """The share of a (p, D) embedding's Fourier energy over its p rows (frequencies 1..p//2)
    in its `count` strongest frequencies."""
    energy = frequency_energy(fourier_basis(embedding.shape[0]) @ embedding.double())  # (F,)
    strongest = energy.topk(min(count, len(energy))).values
    return float(strongest.sum() / energy.sum().clamp_min(1e-30))


def sum_waves(p: int) -> Tensor:
    """The Fourier basis over a + b for the P inputs (a, b), rows in order a * p + b: row j of
    `fourier_basis(p)` at (a + b) mod p, made unit again, (1 + 2F, P)."""
    a = torch.arange(p)
    total = ((a[:, None] + a[None, :]) % p).flatten()  # (P,)
    waves = fourier_basis(p)[:, total]  # (1 + 2F, P)
    return waves / waves.norm(dim=1, keepdim=True).clamp_min(1e-9)


def key_frequencies(logits: Tensor, p: int, count: int = KEY_FREQUENCIES) -> list[int]:
    """The `count` frequencies k whose waves cos(w_k (a + b)), sin(w_k (a + b)) hold most of
    the energy of `logits` (P, V) over the P inputs."""
    energy = frequency_energy(sum_waves(p) @ logits.double())  # (F,)
    return sorted((energy.topk(min(count, len(energy))).indices + 1).tolist())


def key_components(logits: Tensor, p: int, keys: list[int]) -> Tensor:
    """The part of `logits` (P, V) along cos(w_k (a + b)) and sin(w_k (a + b)) over the P
    inputs, for the frequencies k in `keys`: (P, V)."""
    rows = [j for k in keys for j in (2 * k - 1, 2 * k)]  # frequency k's cosine and sine
    waves = sum_waves(p)[rows]  # (2K, P)
    return waves.T @ (waves @ logits.double())  # (P, 2K) @ (2K, V) -> (P, V)


def restricted_and_excluded(logits: Tensor, answers: Tensor, train: Tensor, p: int,
                            keys: list[int]) -> tuple[float, float]:
    """The answer's loss (P, V logits, P answers) with the logits' key-frequency components and
    their mean over the inputs only, on all P pairs; and without those components, on the
    pairs where `train` (P,) is True."""
    logits = logits.double()
    keyed = key_components(logits, p, keys)  # (P, V)
    restricted = logits.mean(dim=0, keepdim=True) + keyed  # (P, V)
    excluded = logits - keyed  # (P, V)
    return (F.cross_entropy(restricted, answers).item(),
            F.cross_entropy(excluded[train], answers[train]).item())


@torch.no_grad()
def answer_logits(model, task: Task) -> Tensor:
    """The logits of the first decoder output (the answer) for all p² sources, in order of
    a * p + b, teacher-forced after BOS: (P, V)."""
    pairs = task.pairs("train") + task.pairs("eval")
    order = sorted(range(len(pairs)), key=lambda i: pairs[i][0])  # ids rise with a, then b
    batch = make_batch([pairs[i] for i in order], task.vocab)
    device = next(model.parameters()).device
    with eval_mode(model):
        logits = model(batch.src.to(device), batch.tgt_in[:, :1].to(device))  # (P, 1, V)
    return logits[:, 0].float().cpu()


@torch.no_grad()
def modadd_gauges(model, task: Task) -> dict[str, float]:
    """Nanda et al. 2023's progress measures of a modadd model (see the module docstring):
    train_exact, restricted_loss, excluded_loss and fourier_sparsity."""
    p, first = task.n_symbols, task.first_data_id
    embedding = model.embedding.weight[first:first + p].detach().float().cpu()  # (p, D)
    logits = answer_logits(model, task)  # (P, V)
    keys = key_frequencies(logits, p)
    numbers = torch.arange(p)
    answers = ((numbers[:, None] + numbers[None, :]) % p).flatten() + first  # (P,)
    train = ~task.held_out  # (P,), in the same order a * p + b
    restricted, excluded = restricted_and_excluded(logits, answers, train, p, keys)
    device = next(model.parameters()).device
    exact = evaluate(model, task, task.pairs("train"), device).exact_match
    return {"train_exact": exact, "restricted_loss": restricted, "excluded_loss": excluded,
            "fourier_sparsity": fourier_sparsity(embedding)}
