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
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from minitfm.book.metrics import evaluate
from minitfm.book.model import eval_mode
from minitfm.lab.curves import is_number, read_metrics
from minitfm.lab.pictures import line_style, save_png
from minitfm.tasks.base import Task, make_batch

KEY_FREQUENCIES = 5  # as many as Nanda et al.'s model (p = 113) came to use


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


# --- the figure of the three phases (`make figures --only grokking`) ---

GAUGES = ("train_exact", "restricted_loss", "excluded_loss", "fourier_sparsity")
DRAWN = (*GAUGES, "weight_norm")  # and the norm of the weight matrices, every run's gauge


def read_phases(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """A run's curves from its metrics.jsonl (`curves.read_metrics`: records only):
    `held_out` (exact match at each evaluation) and each gauge of its `gauges` lines, as
    (step, value) in order of step (a resumed run's later line wins)."""
    curves: dict[str, dict[int, float]] = {name: {} for name in ("held_out", *DRAWN)}
    for record in read_metrics(Path(run_dir)):
        names = {"eval": {"exact_match": "held_out"},
                 "gauges": {name: name for name in DRAWN}}.get(record["split"], {})
        for key, name in names.items():
            if is_number(record.get(key)):
                curves[name][record["step"]] = float(record[key])
    return {name: sorted(points.items()) for name, points in curves.items()}


def phase_steps(curves: dict[str, list[tuple[int, float]]], level: float = 0.99) -> dict:
    """Where the phases end: memorisation at the first gauge line with train_exact >= `level`,
    circuit formation at the last evaluation before held-out exact match first reaches half
    of `level` (the jump begins), cleanup at the first evaluation with held-out exact match
    >= `level` (None: not reached)."""
    def first(points, test):
        return next((step for step, value in points if test(value)), None)

    memorised = first(curves["train_exact"], lambda v: v >= level)
    halfway = first(curves["held_out"], lambda v: v >= level / 2)
    before = [step for step, _ in curves["held_out"] if halfway is not None and step < halfway]
    return {"memorised": memorised, "jump_begins": before[-1] if before else halfway,
            "grokked": first(curves["held_out"], lambda v: v >= level)}


def phases_figure(curves: dict[str, list[tuple[int, float]]], title: str):
    """Four panels over steps, the phases shaded: exact match (training pairs, held-out
    pairs), restricted and excluded loss (log scale), Fourier sparsity, weight norm."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    fig = Figure(figsize=(11, 10), dpi=100, layout="constrained")
    exact_ax, loss_ax, sparse_ax, norm_ax = fig.subplots(4, 1, sharex=True)
    lines = [(exact_ax, "train_exact", "training pairs"), (exact_ax, "held_out", "held-out pairs"),
             (loss_ax, "restricted_loss", "restricted loss (key frequencies only, all pairs)"),
             (loss_ax, "excluded_loss", "excluded loss (key frequencies removed, training "
              "pairs)"),
             (sparse_ax, "fourier_sparsity", f"embedding's energy in its {KEY_FREQUENCIES} "
              f"strongest frequencies"),
             (norm_ax, "weight_norm", "L2 norm of the weight matrices")]
    for i, (ax, name, label) in enumerate(lines):
        steps, values = zip(*curves[name]) if curves[name] else ((), ())
        ax.plot(steps, values, label=label, **line_style(i % 2 if i < 4 else 0))
    shade_phases(fig.axes, phase_steps(curves), max(s for c in curves.values() for s, _ in c))
    exact_ax.set(ylabel="exact match", ylim=(-0.02, 1.02), title=title)
    exact_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    loss_ax.set(ylabel="loss per answer", yscale="log")
    sparse_ax.set(ylabel="Fourier sparsity", ylim=(0, 1.02))
    norm_ax.set(ylabel="weight norm", xlabel="step")
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        # beside the axes, not on them: the curves fill the width
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def shade_phases(axes, steps: dict, last: int) -> None:
    """Memorisation, circuit formation and cleanup shaded on each of `axes`, named on the
    first."""
    edges = [0, steps["memorised"], steps["jump_begins"], steps["grokked"] or last]
    if None in edges:
        return  # a run that never memorised or never jumped has no three phases to shade
    names = ("memorisation", "circuit formation", "cleanup")
    for i, name in enumerate(names):
        for ax in axes:
            ax.axvspan(edges[i], edges[i + 1], color=("#fde0c5", "#e8e8e8", "#d4ecd9")[i],
                       alpha=0.6, linewidth=0)
        narrow = edges[i + 1] - edges[i] < 0.15 * last  # a name across it would not fit
        axes[0].text((edges[i] + edges[i + 1]) / 2, 0.6, name, ha="center", va="center",
                     rotation=90 if narrow else 0, fontsize="small", color="#444444")


def draw_phases(run_dir: str | Path, out: str | Path, force: bool = True) -> dict:
    """The figure of a modadd run's three phases as a PNG (the picture rule); the steps that
    end them, and the gauges there."""
    run_dir, out = Path(run_dir), Path(out)
    curves = read_phases(run_dir)
    steps = phase_steps(curves)
    title = (f"grokking a + b mod p: memorised by step {steps['memorised']}, held-out 99% at "
             f"step {steps['grokked']}")
    save_png(phases_figure(curves, title), out, "--out", force)
    at = {name: dict(points) for name, points in curves.items()}
    return {"phases": steps,
            "gauges": {phase: {name: round(at[name][step], 4) for name in DRAWN
                               if step in at[name]}
                       for phase, step in steps.items() if step is not None}}
