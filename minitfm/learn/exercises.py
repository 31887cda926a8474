"""The exercises of `minitfm learn`: which functions of the book a learner writes, in order.

Each exercise is a function or method of the book, named as the book names it
(`attention`, `MultiHeadAttention.forward`), in the chapter file that holds it. A workbook
keeps the book's name, signature and docstring and replaces the body with a hint and a
`NotImplementedError`; `learn check` grades it with the checks of `minitfm.learn.checks`
(a test fails if an exercise has none). The order is the reading order of a course: what a
later exercise calls comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

CHAPTERS = ("attention", "layers", "positions", "model", "optim", "loop", "metrics")


@dataclass(frozen=True)
class Exercise:
    """One function of the book for a learner to write."""

    chapter: str  # the book's file, without .py
    name: str  # the function, or Class.method
    title: str  # what it is, in a few words
    teaches: str  # what writing it teaches (docs/learn.md and the workbook's README)
    minutes: int  # about how long it takes, reading the workbook's chapter (not the book's)
    hint: str  # written above the NotImplementedError, one or two sentences

    @property
    def key(self) -> str:
        """How a learner names it on the command line: its name (unique in the book)."""
        return self.name

    @property
    def file(self) -> str:
        return f"{self.chapter}.py"


EXERCISES = (
    Exercise("attention", "attention", "scaled dot-product attention",
             "softmax(QK^T / sqrt(d_k))V, masks as the lowest value, where bias and dropout go",
             20, "scores = q @ k^T / sqrt(d_k), plus bias; masked scores to the dtype's lowest "
             "value (not -inf); softmax over the keys (the last dim); dropout on the weights, "
             "but return them before dropout."),
    Exercise("model", "subsequent_mask", "the causal mask",
             "what a decoder position may see: itself and the positions before it", 5,
             "a (size, size) boolean matrix, True on and below the diagonal (torch.tril)."),
    Exercise("attention", "MultiHeadAttention.forward", "multi-head attention",
             "H heads side by side: project, split into heads, attend, concatenate, project",
             30, "q from q_proj(query) split into heads (split_heads), RoPE's rotation if any, k "
             "and v from project_kv, then attention(q, k, v, scope.mask, positions.bias, "
             "self.dropout); the heads through self.heads, back to (B, T_q, D), then out_proj."),
    Exercise("layers", "LayerNorm.forward", "layer normalisation",
             "normalise each position's features: the biased variance, ε inside the root", 10,
             "per position over the last dim: subtract the mean, divide by sqrt(variance + eps) "
             "with the biased variance (divide by D), then scale by weight and add bias."),
    Exercise("layers", "Dropout.scale", "dropout's mask",
             "inverted dropout: zero with probability p, scale the rest by 1/(1-p)", 10,
             "draw torch.rand(shape) in like's dtype and device; keep where it is >= p; divide "
             "the kept ones by 1 - p so that the mean is unchanged."),
    Exercise("layers", "FeedForward.forward", "the feed-forward block",
             "the same two-layer network at every position, with ReLU between", 5,
             "linear1, ReLU, dropout on the hidden layer, linear2."),
    Exercise("positions", "sinusoids", "sinusoidal positions",
             "the paper's table: sin on even features, cos on odd ones, wavelengths growing "
             "geometrically", 15,
             "angle(pos, i) = pos / 10000^(2i/D) for i = 0, 1, ...; column 2i gets its sin, "
             "column 2i + 1 its cos (an odd D has one sin more than cos); in torch's default "
             "dtype."),
    Exercise("positions", "Rotation.rotate", "rotary positions (RoPE)",
             "turning each pair of features by an angle, so scores see relative positions only",
             15, "pairs are adjacent features (x[..., 0::2], x[..., 1::2]); turn each pair by "
             "(cos, sin) of the last T positions: (a cos - b sin, a sin + b cos), interleaved "
             "back."),
    Exercise("model", "EncoderLayer.forward", "the encoder layer",
             "residual sub-layers, pre-LN or post-LN: where the norms go", 15,
             "pre-LN (norm_first): x + dropout(sublayer(norm(x))); post-LN: norm(x + "
             "dropout(sublayer(x))); self-attention first, then the feed-forward block."),
    Exercise("model", "DecoderLayer.forward", "the decoder layer",
             "masked self-attention, cross-attention to the memory, feed-forward, each cached",
             20, "as the encoder layer with three sub-layers: self-attention (self_scope, the "
             "self_attn cache), cross-attention to memory (cross_scope, the cross_attn cache), "
             "feed-forward; norm1, norm2, norm3 in that order."),
    Exercise("attention", "KVCache.append", "the KV cache",
             "keeping keys and values between decoding steps (the book's buffers double when "
             "full, so a step copies only its own keys; a torch.cat of the whole cache is right "
             "too)", 15,
             "copy this step's keys and values after the cached ones (grow the buffers when full, "
             "copying what is cached), then return views of everything cached so far."),
    Exercise("model", "greedy_decode", "greedy decoding",
             "decoding one token at a time from BOS until every row has written EOS", 20,
             "inside `with eval_mode(model):` (dropout off, the mode restored); encode once "
             "(or take `encoded`); start from BOS; each step feed the newest token (with the "
             "cache) or all so far, take the argmax of the last position, PAD for rows already "
             "done; stop when every row has written EOS, or after max_len tokens."),
    Exercise("optim", "AdamW.step", "AdamW",
             "moments, bias correction and weight decay decoupled from the gradient", 20,
             "the norm of g (returned, before clipping); clip g to max_norm; t += 1 first; "
             "θ -= lr λ θ; m, v as running means of g and g²; θ -= lr m̂ / (sqrt(v̂) + eps) "
             "with m̂ = m / (1 - β1^t), v̂ = v / (1 - β2^t)."),
    Exercise("loop", "lr_factor", "the learning-rate schedule",
             "linear warmup, then cosine decay to zero (or constant, or inverse square root)",
             10, "(step + 1) / warmup during warmup; then 1 for constant, sqrt(max(warmup, 1) / "
             "max(step, 1)) for inverse_sqrt, 0.5 (1 + cos(π min(progress, 1))) for cosine, "
             "progress going from 0 after warmup to 1 at cfg.steps."),
    Exercise("metrics", "LengthStats.add", "exact match and token accuracy",
             "honest scores: the whole sequence, length included; a missing token is wrong", 10,
             "exact when pred == target (lengths too); count matching positions, over "
             "max(len(pred), len(target)) tokens."),
)

BY_NAME = {exercise.name: exercise for exercise in EXERCISES}


def workbook_readme(folder: str) -> str:
    """The README of a new workbook: how to work through it, and the exercises in order."""
    rows = "\n".join(f"| {n} | `{e.name}` | `{e.file}` | {e.teaches} | {e.minutes} |"
                     for n, e in enumerate(EXERCISES, 1))
    hours = sum(e.minutes for e in EXERCISES) / 60
    return f"""# My minitfm workbook

Made by `minitfm learn start`: the seven chapters of minitfm's book (`minitfm/book/`, read in
the order of `minitfm/book/__init__.py`), with the bodies of {len(EXERCISES)} functions left for
you to write. Each keeps the book's name, signature and docstring; its body is a hint and a
`NotImplementedError`. Everything else is the book's code, so the chapters call your functions.

1. Read the exercise's docstring and hint here, and the paper section it cites. The book's
   own chapters (`minitfm/book/`) hold the answers: open them when stuck, or after you pass.
2. Write the body. Keep the name and the signature: the rest of the book calls it.
3. `minitfm learn check {folder} NAME` grades it against PyTorch and the book: the first
   check that fails, and a hint naming the likely mistake. `minitfm learn check {folder}`
   grades them all.
4. Whenever you like: `minitfm train --book {folder}` trains the default task (reverse) with
   your functions wherever written and the book's elsewhere, and says whose is whose;
   `minitfm visualize-attention --book {folder}` then draws what your attention learned.

Your files are yours: minitfm never writes over this folder. A function still raising
`NotImplementedError` runs the book's code, so you can train at any point.

| # | exercise | file | what it teaches | minutes |
|---|---|---|---|---|
{rows}

About {hours:.0f} hours in all, for someone who reads each chapter here as they go (its
docstrings, the code around each exercise, the paper section it cites), not the book's own
chapters, which hold the answers. The path and what each exercise teaches are in minitfm's
docs/learn.md.
"""
