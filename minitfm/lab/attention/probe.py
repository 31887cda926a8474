"""One input through the model, and how every cross-attention head aligns.

A `Probe` is one input run through the model: greedy decoding first, then one teacher-forced
pass on BOS + the decoded tokens. With a causal decoder that pass gives exactly the maps of
free decoding, so the row of query position t shows where the model looked to write output t.

The alignment score of a cross-attention head is the mean weight it puts on the ideal source
position (`task.alignment`) over the real target positions (EOS excluded); its hard form counts
the rows whose strongest key is the ideal one. Both are measured on teacher-forced maps of the
*true* target: the ideal positions are defined for the true target, so a wrong prediction cannot
shift which row is scored against which position. On the same maps, a head's attention entropy
is the mean over its rows of -sum_j a_j ln a_j (nats): ln S for uniform attention over S keys, 0
for a single key. `head_scores` gives all three from one pass.

A probe's maps are drawn as `MapBlock`s, one per kind of attention: its weights with the tokens
on both axes, as the PNG figures (`figures.py`), TensorBoard's pictures (`mapgrid.py`) and the
terminal's heatmaps (`app/commands/visualize_attention.py`) show them.

Shapes: B batch, L layers, H n_heads, S source len, T target len (+1 for BOS), T_q and T_k
query and key len (as in book/attention.py, where K is the head width).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from minitfm.book.metrics import strip_eos
from minitfm.book.model import AttentionMaps, eval_mode, greedy_decode
from minitfm.tasks.base import EOS_ID, Batch, Pair, Task, make_batch

KINDS = ("encoder", "decoder", "cross")  # the three kinds of attention, in the model's order
KIND_TITLES = {
    "encoder": "encoder self-attention (query: source, key: source)",
    "decoder": "decoder self-attention (query: decoder input, key: decoder input)",
    "cross": "cross-attention (query: decoder input, key: source)",
}
PROBE_MAX_TOKENS = 16  # longer probes make unreadable axis labels
ALIGNMENT_SAMPLES = 200  # held-out pairs the alignment score is averaged over


@dataclass
class Probe:
    """One input run through the model: its tokens and per-layer maps (H, T_q, T_k) on the CPU."""

    src: list[int]
    decoded: list[int]  # the greedy output, EOS included when the model wrote it
    decoder_input: list[int]  # BOS + decoded[:-1]: what the decoder read at each step
    maps: AttentionMaps

    @property
    def prediction(self) -> list[int]:
        return strip_eos(self.decoded, EOS_ID)


@torch.no_grad()
def run_probe(model, task: Task, src: list[int], teacher: list[int] | None = None,
              output: list[int] | None = None) -> Probe:
    """Greedy-decode `src`, then teacher-force BOS + the output to get the maps of decoding.

    With `teacher` (e.g. the true target) the maps are teacher-forced on it instead: their axes
    stay the same whatever the model writes, as TensorBoard's frames of one probe need. With
    `output` (EOS stripped, as an evaluation that just decoded `src` has it), no decoding.
    """
    vocab, device = task.vocab, next(model.parameters()).device
    with eval_mode(model):
        source = torch.tensor([src], device=device)  # (1, S)
        if output is None:
            cap = task.max_target_len(len(src)) + 1  # + EOS
            decoded = greedy_decode(model, source, vocab, cap)[0].tolist()
        else:
            decoded = [*output, vocab.eos_id]
        read = decoded if teacher is None else [*teacher, vocab.eos_id]
        decoder_input = ([vocab.bos_id] + read)[:len(read)]  # the last output is not read
        _, maps = model(source, torch.tensor([decoder_input], device=device),
                        return_attention=True)
    first = AttentionMaps(*([m[0].float().cpu() for m in layer_maps]  # (H, T_q, T_k) each
                            for layer_maps in (maps.encoder, maps.decoder, maps.cross)))
    return Probe(src, decoded, decoder_input, first)


def pick_probe(pairs: list[Pair], max_tokens: int = PROBE_MAX_TOKENS) -> Pair:
    """The first pair of the longest size that fits `max_tokens` (deterministic, informative)."""
    def size(pair: Pair) -> int:
        return max(len(pair[0]), len(pair[1]) + 1)  # source, or BOS + target

    fitting = [pair for pair in pairs if size(pair) <= max_tokens] or pairs
    longest = max(size(pair) for pair in fitting)
    return next(pair for pair in fitting if size(pair) == longest)


# --- alignment score ---

def alignment_score(cross: Tensor, ideal: Tensor, hard: bool = False) -> Tensor:
    """Mean weight on the ideal source: cross (B, H, T, S), ideal (B, T) with -1 = skip -> (H,).

    `hard` scores each row's argmax instead (1 if the strongest key is the ideal one).
    """
    if hard:
        cross = F.one_hot(cross.argmax(dim=-1), cross.size(-1))  # (B, H, T, S)
    valid = ideal >= 0  # (B, T)
    index = ideal.clamp(min=0)[:, None, :, None].expand(-1, cross.size(1), -1, 1)  # (B, H, T, 1)
    mass = cross.float().gather(-1, index).squeeze(-1)  # (B, H, T)
    mass = mass * valid[:, None, :]  # rows that are no target position (EOS, PAD) count 0
    return mass.sum(dim=(0, 2)) / valid.sum().clamp(min=1)  # (H,)


def attention_entropy(weights: Tensor, valid: Tensor) -> Tensor:
    """Mean entropy, in nats, of each query's attention distribution: weights (B, H, T_q, T_k),
    valid (B, T_q) the query rows to count -> (H,). Uniform over n keys gives ln n; one key, 0."""
    per_row = -torch.special.xlogy(weights.float(), weights.float()).sum(-1)  # (B, H, T_q)
    per_row = per_row * valid[:, None, :]  # 0 log 0 = 0: masked (PAD) keys add nothing
    return per_row.sum(dim=(0, 2)) / valid.sum().clamp(min=1)  # (H,)


def has_alignment(task: Task, pairs: list[Pair]) -> bool:
    """Whether every one of `pairs` (at least one) has an ideal alignment."""
    return bool(pairs) and all(task.alignment(src) is not None for src, _ in pairs)


def ideal_positions(task: Task, pairs: list[Pair], T: int) -> Tensor:
    """Each target position's ideal source position (B, T), -1 past the target."""
    return torch.tensor([(a := task.alignment(src)) + [-1] * (T - len(a)) for src, _ in pairs])


@dataclass
class HeadScores:
    """Scores of every cross-attention head, each (L, H), from one pass teacher-forced on the
    true targets (see the module docstring)."""

    soft: Tensor | None  # alignment score: mean weight on the ideal source (None: no ideal)
    hard: Tensor | None  # the same with each row's argmax: share of rows on the ideal source
    entropy: Tensor  # attention entropy (nats), over the rows that write a token or EOS


def alignment_scores(model, task: Task, pairs: list[Pair]) -> HeadScores | None:
    """The scores of every cross-attention head on `pairs`; None, before running the model,
    when they have no ideal alignment."""
    if not has_alignment(task, pairs):
        return None
    return head_scores(model, task, pairs)


def head_scores(model, task: Task, pairs: list[Pair]) -> HeadScores:
    """Alignment scores, soft and hard (None without an ideal), and attention entropy of every
    cross-attention head on `pairs`, from one teacher-forced pass."""
    return scores_of(teacher_pass(model, task, pairs), task, pairs)


@torch.no_grad()
def scores_of(forced: TeacherPass, task: Task, pairs: list[Pair]) -> HeadScores:
    """`head_scores` from the teacher-forced pass of `pairs` (`teacher_pass`)."""
    batch, cross = forced.batch, forced.maps.cross  # per layer (B, H, T, S)
    T = batch.tgt_in.size(1)  # BOS + longest target; its row t writes target token t
    valid = batch.tgt_out != task.vocab.pad_id  # (B, T)
    entropy = torch.stack([attention_entropy(c, valid) for c in cross]).cpu()  # (L, H)
    if not has_alignment(task, pairs):
        return HeadScores(None, None, entropy)
    ideal = ideal_positions(task, pairs, T).to(batch.src.device)  # (B, T)
    soft = torch.stack([alignment_score(c, ideal) for c in cross]).cpu()  # (L, H)
    hard = torch.stack([alignment_score(c, ideal, hard=True) for c in cross]).cpu()  # (L, H)
    return HeadScores(soft, hard, entropy)


# --- one teacher-forced pass, read twice ---

@dataclass
class TeacherPass:
    """A teacher-forced pass with attention over a batch of pairs, in eval mode, no gradient."""

    batch: Batch
    logits: Tensor  # (B, T, V)
    maps: AttentionMaps


@torch.no_grad()
def teacher_pass(model, task: Task, pairs: list[Pair]) -> TeacherPass:
    """`model` teacher-forced on `pairs` (their targets), with its attention maps."""
    batch = make_batch(pairs, task.vocab).to(next(model.parameters()).device)
    with eval_mode(model):
        logits, maps = model(batch.src, batch.tgt_in, return_attention=True)  # (B, T, V)
    return TeacherPass(batch, logits, maps)


class LatestPass:
    """The latest `teacher_pass`, handed again to whoever asks for it on the same pairs at the
    same step of a run, the weights unchanged: the gauges (every 10 steps) and the attention
    snapshot (every 25) both read the first 200 held-out pairs, and fall on the same step every
    50 steps. The same computation twice gives the same numbers, so the second is skipped."""

    def __init__(self) -> None:
        self.made: tuple | None = None  # (step, model, task, pairs, weights' versions)
        self.latest: TeacherPass | None = None

    def at(self, step: int, model, task: Task, pairs: list[Pair]) -> TeacherPass:
        """The pass of `model` on `pairs` at `step`: the latest one if it is that, else made."""
        # Parameters' version counters move with every in-place change (an optimizer step,
        # loading weights): a guard besides the step, which names the weights in a run.
        made = (step, model, task, pairs, tuple(p._version for p in model.parameters()))
        if self.latest is None or self.made != made:  # a module equals only itself
            self.latest, self.made = teacher_pass(model, task, pairs), made
        return self.latest


# --- the maps, as drawn ---

@dataclass
class MapBlock:
    """Maps of one kind drawn as a grid: weights (L, H, T_q, T_k), tokens on both axes."""

    kind: str
    layers: list[int]
    heads: list[int]
    weights: np.ndarray
    queries: list[str]
    keys: list[str]
    head_notes: np.ndarray | None = None  # (L, H) a line under each head's title, if any
    note: str | None = None  # a line under the block's title: how to read `head_notes`


def map_blocks(probe: Probe, task: Task, kinds: tuple[str, ...] = KINDS,
               written: bool = False) -> list[MapBlock]:
    """Every layer and head of a probe's maps, of the kinds asked for (`only` narrows a block).

    With `written` (a probe decoded freely, not teacher-forced), the decoder's query rows say
    which token each read and which it wrote, `<bos>→3`, as the explorer's rows do: row t
    reads the output before it and writes output t, so a reverse model's anti-diagonal starts
    on the `<bos>` row."""
    source = [task.vocab.token(i) for i in probe.src]
    decoder = [task.vocab.token(i) for i in probe.decoder_input]
    rows = [f"{read}→{task.vocab.token(out)}" for read, out in
            zip(decoder, probe.decoded, strict=True)] if written else decoder
    axes = {"encoder": (source, source), "decoder": (rows, decoder), "cross": (rows, source)}
    note = "rows: the token each step read → the token it wrote" if written else None
    blocks = []
    for kind in kinds:
        weights = torch.stack(getattr(probe.maps, kind))  # (L, H, T_q, T_k)
        n_layers, n_heads = weights.shape[:2]
        blocks.append(MapBlock(kind, list(range(n_layers)), list(range(n_heads)),
                               weights.numpy(), *axes[kind],
                               note=None if kind == "encoder" else note))
    return blocks


def only(block: MapBlock, layer: int | None = None, head: int | None = None) -> MapBlock:
    """`block` with only layer `layer` and head `head` (None: all of them)."""
    layers = block.layers if layer is None else [layer]
    heads = block.heads if head is None else [head]
    return replace(block, layers=layers, heads=heads,
                   weights=block.weights[np.ix_(layers, heads)])  # (L', H', T_q, T_k)
