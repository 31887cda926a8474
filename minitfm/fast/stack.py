"""Many runs of one model shape as one stacked model: every run's step in one pass.

R runs whose parameters have the same shapes keep them in one matrix (R, N): row r holds run
r's parameters, flat in `model.parameters()` order (as the book's AdamW lays out one run), and
run r's own model has views of its row as parameters, so its checkpoints, pictures and
instruments work as for a run alone. The book's modules compute all the rows at once under
`torch.func.vmap`, `functional_call` putting a row's parameters into one model of that shape:
one launch per operation for R runs instead of R (what makes a GPU worth it for small models).

Each run keeps what makes it itself: its seed (initial weights and data, drawn before the
stack is made), its learning rate, schedule, clipping and weight decay (`StackedAdamW` takes
them per row), and its evaluations (`evaluate_rows`, `predict_rows`: greedy decoding of all
the rows together, a fixed number of steps with a done mask, which vmap can take where the
book's early stop cannot). A row's numbers equal its run alone up to rounding: the losses and
gradients of the same batch match to float precision (tests/run/test_stack.py). Dropout and
randomized positions draw for every row from one stream under vmap: each row gets its own
draws, but not those its run would draw alone.

Shapes: R runs in the stack (R' those of one call), N parameters of one model, B batch, S
source len, T target len, V vocab size, L decoding steps.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from minitfm.book.metrics import EvalResult, length_chunks, score, strip_eos
from minitfm.book.model import Seq2SeqTransformer, eval_mode
from minitfm.config import EVAL_BATCH_SIZE
from minitfm.tasks.base import Batch, Pair, Task, make_batch


class Stack:
    """R models of one shape as one parameter matrix (R, N), computed together under vmap.

    `base` is a model of the same shape running the book's code (its own parameters are never
    used: each call puts rows of the matrix in their place).
    """

    def __init__(self, models: Sequence[nn.Module], base: Seq2SeqTransformer):
        self.base = base
        named = list(base.named_parameters())  # tied weights once, as model.parameters()
        self.names = [name for name, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.offsets = [0, *itertools.accumulate(p.numel() for _, p in named)]
        for model in models:
            theirs = [(name, p.shape) for name, p in model.named_parameters()]
            if theirs != list(zip(self.names, self.shapes)):
                raise ValueError("the stacked models must have the same parameters and shapes")
        self.flat = torch.stack([torch.cat([p.detach().reshape(-1) for p in m.parameters()])
                                 for m in models])  # (R, N)
        for row, model in enumerate(models):  # each run's model: views of its row
            for p, start, end in zip(model.parameters(), self.offsets, self.offsets[1:]):
                p.data = self.flat[row, start:end].view_as(p)
        self.flat.requires_grad_()
        self.matrices = torch.cat([torch.full((end - start,), len(shape) >= 2)
                                   for shape, start, end
                                   in zip(self.shapes, self.offsets, self.offsets[1:])])  # (N,)

    @property
    def size(self) -> int:
        return self.flat.size(0)

    def parameters(self, rows: Tensor | None = None) -> dict[str, Tensor]:
        """Name -> (R', ...) views of the matrix (`rows`: an index of rows, None: all)."""
        flat = self.flat if rows is None else self.flat[rows]  # (R', N)
        return {name: flat[:, start:end].view(flat.size(0), *shape)
                for name, shape, start, end
                in zip(self.names, self.shapes, self.offsets, self.offsets[1:])}

    def losses(self, batch: Batch, rows: Tensor | None, label_smoothing: float,
               autocast: bool = False) -> Tensor:
        """Each row's teacher-forced loss per target token on its batch (R', B, ...): (R',).

        As the book's `sequence_loss` of each run alone: cross-entropy in float32, PAD ignored,
        the mean over each row's own target tokens."""
        def logits_of(params: dict[str, Tensor], src: Tensor, tgt_in: Tensor) -> Tensor:
            return functional_call(self.base, params, (src, tgt_in))  # (B, T, V)

        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = vmap(logits_of, randomness="different")(
                self.parameters(rows), batch.src, batch.tgt_in)  # (R', B, T, V)
        pad = self.base.pad_id
        per_token = F.cross_entropy(logits.flatten(0, 2).float(), batch.tgt_out.flatten(),
                                    ignore_index=pad, label_smoothing=label_smoothing,
                                    reduction="none").view(batch.tgt_out.shape)  # (R', B, T)
        counts = (batch.tgt_out != pad).sum(dim=(1, 2))  # (R',)
        return per_token.sum(dim=(1, 2)) / counts.clamp(min=1)


def stack_batches(batches: Sequence[Batch], pad_id: int) -> Batch:
    """Each row's batch (B, S_r), (B, T_r) padded to the longest of them: (R', B, S), (R', B, T).

    Padding changes no row's numbers: the model masks source padding and the loss ignores PAD
    targets (the book's tests check both)."""
    S = max(b.src.size(1) for b in batches)
    T = max(b.tgt_in.size(1) for b in batches)

    def padded(tensors: list[Tensor], width: int) -> Tensor:
        return torch.stack([F.pad(t, (0, width - t.size(1)), value=pad_id) for t in tensors])

    return Batch(padded([b.src for b in batches], S), padded([b.tgt_in for b in batches], T),
                 padded([b.tgt_out for b in batches], T),
                 sum(b.n_target_tokens for b in batches))


class StackedAdamW:
    """The book's AdamW (`book/optim.py`) on every row at once, each with its own learning rate,
    weight decay and clipping; a row not in `active` keeps its parameters and moments."""

    def __init__(self, stack: Stack, weight_decay: Sequence[float],
                 betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-8):
        flat = stack.flat
        self.stack, self.betas, self.eps = stack, betas, eps
        decay = torch.tensor(weight_decay, dtype=flat.dtype, device=flat.device)  # (R,)
        self.decay = decay[:, None] * stack.matrices.to(flat.device, flat.dtype)  # (R, N)
        self.exp_avg = torch.zeros_like(flat, requires_grad=False)  # m, (R, N)
        self.exp_avg_sq = torch.zeros_like(flat, requires_grad=False)  # v, (R, N)
        self.t = torch.zeros(flat.size(0), dtype=torch.long)  # each row's step count

    @torch.no_grad()
    def step(self, lr: Tensor, max_norm: Tensor, active: Tensor) -> Tensor:
        """One update of the `active` rows from the matrix's gradient, each clipped to its
        `max_norm` (inf: not clipped), at its `lr` (all (R,)); each row's gradient norm before
        clipping: (R,)."""
        flat, beta1, beta2 = self.stack.flat, *self.betas
        g = flat.grad  # (R, N)
        norm = torch.linalg.vector_norm(g, dim=1)  # (R,)
        g = g * (max_norm / (norm + 1e-6)).clamp(max=1.0)[:, None]  # g · min(1, c / ‖g‖)
        self.t += active.cpu().long()
        t = self.t.to(flat.device, flat.dtype).clamp(min=1)  # (R,)
        keep = active[:, None]  # (R, 1)
        lr = lr[:, None]  # (R, 1)
        decayed = flat - lr * self.decay * flat  # θ − η λ θ
        m = torch.where(keep, self.exp_avg.lerp(g, 1 - beta1), self.exp_avg)
        v = torch.where(keep, self.exp_avg_sq * beta2 + (1 - beta2) * g * g, self.exp_avg_sq)
        correction1 = (1 - beta1**t)[:, None]
        correction2 = (1 - beta2**t)[:, None]
        update = (lr / correction1) * m / (v.sqrt() / correction2.sqrt() + self.eps)
        flat.copy_(torch.where(keep, decayed - update, flat))
        self.exp_avg.copy_(m)
        self.exp_avg_sq.copy_(v)
        return norm

    def row_state(self, row: int) -> dict:
        """Row `row`'s moments as the book's AdamW saves them (`AdamW.state_dict`)."""
        return {"step": int(self.t[row]), "exp_avg": self.exp_avg[row].clone(),
                "exp_avg_sq": self.exp_avg_sq[row].clone()}

    def load_row(self, row: int, state: dict) -> None:
        """Row `row`'s moments from a run's AdamW (`AdamW.state_dict`)."""
        self.exp_avg[row].copy_(state["exp_avg"])
        self.exp_avg_sq[row].copy_(state["exp_avg_sq"])
        self.t[row] = int(state["step"])


class RowOptimizer:
    """One row of a `StackedAdamW` as a run's optimizer: what its checkpoints save and load,
    and the learning rate its schedule sets (the stack reads it for the row's step)."""

    def __init__(self, stacked: StackedAdamW, row: int, lr: float):
        self.stacked, self.row, self.lr = stacked, row, lr

    def state_dict(self) -> dict:
        return self.stacked.row_state(self.row)

    def load_state_dict(self, state: dict) -> None:
        self.stacked.load_row(self.row, state)


# --- greedy decoding of every row at once ---

class Decoding(nn.Module):
    """Greedy decoding (and the teacher-forced loss) as one module's forward, so that
    `functional_call` can run it on a row's parameters under vmap."""

    def __init__(self, model: Seq2SeqTransformer, bos_id: int, eos_id: int):
        super().__init__()
        self.model, self.bos_id, self.eos_id = model, bos_id, eos_id

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                steps: int) -> tuple[Tensor, Tensor]:
        """src (B, S) -> tokens (B, L = steps), EOS kept, PAD after it; and the loss summed
        over tgt_out's non-PAD tokens, teacher-forced on tgt_in (B, T) (0 when it is all PAD).

        The book's `greedy_decode` without its early stop: each step appends the most likely
        next token, and a row that has ended gets PAD."""
        model = self.model
        memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
        B = src.size(0)
        tokens = torch.full((B, 1), self.bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        cache = model.new_cache()
        for _ in range(steps):
            logits, _, _ = model.decode(tokens[:, -1:], memory, src_mask, cache)  # (B, 1, V)
            next_token = logits[:, -1].argmax(dim=-1)  # (B,)
            next_token = torch.where(done, torch.full_like(next_token, model.pad_id),
                                     next_token)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, t + 1)
            done = done | (next_token == self.eos_id)
        logits, _, _ = model.decode(tgt_in, memory, src_mask)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(),
                               ignore_index=model.pad_id, reduction="none").sum()
        return tokens[:, 1:], loss


@torch.no_grad()
def evaluate_rows(stack: Stack, rows: Sequence[int], tasks: Sequence[Task],
                  pair_sets: Sequence[Sequence[Pair]], device,
                  batch_size: int = EVAL_BATCH_SIZE) -> list[EvalResult]:
    """The book's `evaluate` of each row in `rows` on its pairs, every row decoded at once."""
    decoded = decode_rows(stack, rows, tasks, pair_sets, device, batch_size)
    results = []
    for task, pairs, (predictions, loss_sum) in zip(tasks, pair_sets, decoded):
        tokens = sum(len(target) + 1 for _, target in pairs)  # + EOS
        total, per_length = score(list(pairs), predictions, task.input_length)
        results.append(EvalResult(loss_sum / max(tokens, 1), total, per_length, predictions))
    return results


@torch.no_grad()
def predict_rows(stack: Stack, rows: Sequence[int], tasks: Sequence[Task],
                 source_sets: Sequence[Sequence[list[int]]], device,
                 batch_size: int = EVAL_BATCH_SIZE) -> list[list[list[int]]]:
    """The book's `predict` for each row in `rows` on its sources, every row decoded at once."""
    pair_sets = [[(src, []) for src in sources] for sources in source_sets]
    return [predictions for predictions, _ in
            decode_rows(stack, rows, tasks, pair_sets, device, batch_size)]


def decode_rows(stack: Stack, rows: Sequence[int], tasks: Sequence[Task],
                pair_sets: Sequence[Sequence[Pair]], device,
                batch_size: int) -> list[tuple[list[list[int]], float]]:
    """Each row's predictions (in its pairs' order, without EOS) and summed loss.

    Each row's pairs go in length chunks as the book's `evaluate` makes them; the rows' c-th
    chunks are decoded together, padded to the widest (whole rows of PAD where a row has fewer
    pairs), for as many steps as the longest cap among them; each prediction is then cut at
    its own cap (decoding is causal: what a longer run appends changes none of its first
    tokens)."""
    chunk_sets = [length_chunks([len(src) for src, _ in pairs], batch_size)
                  for pairs in pair_sets]
    predictions = [[[] for _ in pairs] for pairs in pair_sets]
    loss_sums = [0.0] * len(rows)
    vocab = tasks[0].vocab
    decoding = Decoding(stack.base, vocab.bos_id, vocab.eos_id)
    for c in range(max((len(chunks) for chunks in chunk_sets), default=0)):
        members = [i for i, chunks in enumerate(chunk_sets) if c < len(chunks)]
        batches = [make_batch([pair_sets[i][j] for j in chunk_sets[i][c]], vocab)
                   for i in members]
        caps = [[tasks[i].max_target_len(len(pair_sets[i][j][0])) + 1 for j in chunk_sets[i][c]]
                for i in members]  # + EOS
        batch = stack_batches(pad_rows(batches, vocab.pad_id), vocab.pad_id).to(device)
        index = torch.tensor([rows[i] for i in members], device=stack.flat.device)
        tokens, losses = decode_together(stack, decoding, index, batch, max(map(max, caps)))
        for m, i in enumerate(members):
            for j, row, cap in zip(chunk_sets[i][c], tokens[m].tolist(), caps[m]):
                predictions[i][j] = strip_eos(row[:cap], vocab.eos_id)
            loss_sums[i] += float(losses[m])
    return list(zip(predictions, loss_sums))


def decode_together(stack: Stack, decoding: Decoding, rows: Tensor, batch: Batch,
                    steps: int) -> tuple[Tensor, Tensor]:
    """`Decoding` of each row on its batch (R', B, ...): tokens (R', B, L), losses (R',)."""
    def one(params: dict[str, Tensor], src: Tensor, tgt_in: Tensor, tgt_out: Tensor):
        named = {f"model.{name}": p for name, p in params.items()}
        return functional_call(decoding, named, (src, tgt_in, tgt_out, steps))

    with eval_mode(stack.base):  # dropout off: decoding is deterministic
        return vmap(one)(stack.parameters(rows), batch.src, batch.tgt_in, batch.tgt_out)


def pad_rows(batches: list[Batch], pad_id: int) -> list[Batch]:
    """Batches of fewer pairs than the largest, given whole rows of PAD (decoded, never read)."""
    B = max(b.src.size(0) for b in batches)

    def grown(t: Tensor) -> Tensor:
        return F.pad(t, (0, 0, 0, B - t.size(0)), value=pad_id)

    return [Batch(grown(b.src), grown(b.tgt_in), grown(b.tgt_out), b.n_target_tokens)
            for b in batches]

