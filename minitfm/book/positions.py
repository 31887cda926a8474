"""Positional encodings: where each token is, for a model that otherwise sees a set.

A scheme adds a vector to each token embedding (sinusoidal, Vaswani et al. 2017, §3.5;
learned) or acts inside attention (RoPE rotates queries and keys, Su et al. 2021; ALiBi adds a
bias to the scores, Press et al. 2022); `PositionalEncoding` has one hook for each, so the
model treats all schemes alike; a scheme acting inside attention hands it an
`AttentionPositions`. `sample_positions` draws randomized positions (Ruoss et al. 2023).
`SCHEMES` builds each scheme by its name in `minitfm.catalog`, which states what the name fixes
before a model exists (learned positions end at model.max_len; RoPE needs an even d_head).

Shapes: B batch, T positions, D d_model, H n_heads, K d_head (= D / H).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitfm.catalog import POSITIONALS

POSITIONAL_KINDS = tuple(POSITIONALS)  # sinusoidal, learned, rope, alibi, none


# What a scheme acting inside attention hands to it: `MultiHeadAttention` turns queries and
# keys by a `Rotation` (RoPE) and adds a bias to the scores (ALiBi).


@dataclass(frozen=True)
class Rotation:
    """RoPE angles of a run of positions (Su et al. 2021, §3.4.2): cos and sin per feature pair."""

    cos: Tensor  # (T, K/2), or (B, 1, T, K/2) for per-row positions
    sin: Tensor  # same shape as cos

    def rotate(self, x: Tensor) -> Tensor:
        """Turn each pair (x_2i, x_2i+1) of x (B, H, T_x, K) by the last T_x positions' angles.

        The last ones, because new keys come after the cached ones: with a KV cache the rotation
        holds every key position while x holds only the keys of this step.
        """
        T = x.size(-2)
        cos, sin = self.cos[..., -T:, :], self.sin[..., -T:, :]  # (..., T, K/2)
        even, odd = x[..., 0::2], x[..., 1::2]  # (B, H, T, K/2) each
        turned = (even * cos - odd * sin, even * sin + odd * cos)  # (B, H, T, K/2) each
        return torch.stack(turned, dim=-1).flatten(-2)  # (B, H, T, K): pairs back in place


@dataclass(frozen=True)
class AttentionPositions:
    """What positions do inside one attention call: RoPE rotations, an ALiBi bias (None: none)."""

    queries: Rotation | None = None  # angles of the query positions
    keys: Rotation | None = None  # angles of every key position, cached ones first
    bias: Tensor | None = None  # (H, T_q, T_k) or (B, H, T_q, T_k), added to the scores


NO_POSITIONS = AttentionPositions()  # frozen, so one shared instance is safe: nothing to do


# Positional encodings. A scheme adds position vectors to the token embeddings (`forward`:
# sinusoidal, learned) or acts inside attention (`attention`: RoPE, ALiBi). Positions are
# offset..offset+T-1, where `offset` counts the tokens already decoded with a KV cache, unless
# explicit `positions` are given: randomized positions in training (Ruoss et al. 2023).


class PositionalEncoding(nn.Module):
    """The two hooks of a positional scheme; the defaults do nothing (NoPE, Kazemnejad 2023)."""

    in_attention = False  # True: the model hands position indices to `attention`

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """x (B, T, D) plus the encodings of its positions; here x unchanged."""
        return x

    def attention(
        self, q_positions: Tensor, k_positions: Tensor, cross: bool = False
    ) -> AttentionPositions | None:
        """What positions (T_q,)/(B, T_q) and (T_k,)/(B, T_k) do inside attention; here nothing."""
        return None


def sinusoids(length: int, d_model: int) -> Tensor:
    """The sinusoid table PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...), §3.5."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (length, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (D/2,)
    angles = position * inv_freq  # (length, ceil(D/2))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table  # (length, D)


class SinusoidalPositions(PositionalEncoding):
    """Fixed sinusoidal positional encoding, Vaswani et al. 2017, §3.5; works at any length."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.d_model = d_model
        # A cache, not a parameter: persistent=False keeps it out of checkpoints.
        self.register_buffer("table", sinusoids(max_len, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """x (B, T, D) plus the encodings of positions offset..offset+T-1 (or of `positions`)."""
        if positions is not None:  # (B, T), below the table's length (the model sizes it)
            return x + self.table[positions]  # (B, T, D)
        end = offset + x.size(1)
        if end > self.table.size(0):  # longer than ever seen: grow the cache, doubling (so
            # decoding n tokens past it rebuilds the table log(n) times, not n times)
            size = max(end, 2 * self.table.size(0))
            self.table = sinusoids(size, self.d_model).to(self.table)
        return x + self.table[offset:end]  # (B, T, D)


class LearnedPositions(PositionalEncoding):
    """Learned absolute position embeddings (Vaswani et al. 2017, §3.5; Gehring et al. 2017)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        # Same scale as the sinusoids (rms 1/sqrt(2)) so either kind meets the embeddings alike.
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.5**0.5)  # (max_len, D)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """x (B, T, D) plus the learned vectors of positions offset..offset+T-1 (or `positions`)."""
        if positions is not None:  # (B, T), below max_len (the config checks it)
            return x + self.weight[positions]  # (B, T, D)
        end = offset + x.size(1)
        assert end <= self.max_len, f"position {end - 1} is past the {self.max_len} learned ones"
        return x + self.weight[offset:end]  # (B, T, D)


class RotaryPositions(PositionalEncoding):
    """Rotary position embedding (RoPE), Su et al. 2021: q·k depends on positions only via i - j.

    Each pair of features (2i, 2i+1) of a query or key at position p turns by the angle
    p θ_i, θ_i = 10000^(-2i/K) (§3.2.2). A dot product of two turned vectors depends on
    the difference of their angles, so scores see relative positions only. RoPE acts in every
    attention: in cross-attention queries turn by their target position and keys by their
    source position, so target i attending to source i (copy) is the relative offset 0.
    Decoding with a KV cache stores keys already turned; each new query and key turns by its
    absolute position (the cache length), so cached and fresh keys agree.
    """

    in_attention = True

    def __init__(self, d_head: int, base: float = 10000.0):
        super().__init__()
        assert d_head % 2 == 0, f"RoPE turns pairs of features: d_head ({d_head}) must be even"
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)  # (K/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # θ_i, not in checkpoints

    def rotation(self, positions: Tensor) -> Rotation:
        """The angles p θ_i of positions (T,) or (B, T)."""
        angles = positions[..., None].to(self.inv_freq) * self.inv_freq  # (T, K/2) or (B, T, K/2)
        if angles.dim() == 3:
            angles = angles.unsqueeze(1)  # (B, 1, T, K/2): the same angles in every head
        return Rotation(angles.cos(), angles.sin())

    def attention(
        self, q_positions: Tensor, k_positions: Tensor, cross: bool = False
    ) -> AttentionPositions:
        """Queries turn by their positions, keys by theirs (in cross-attention: source ones)."""
        queries = self.rotation(q_positions)
        keys = queries if k_positions is q_positions else self.rotation(k_positions)
        return AttentionPositions(queries=queries, keys=keys)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's head slopes m_h = 2^(-8h/H), h = 1..H (Press et al. 2022, §3), as its code does."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    # H not a power of 2: the slopes of the power of 2 below, then every other slope of twice it.
    below = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(geometric(below) + geometric(2 * below)[0::2][: n_heads - below])  # (H,)


class ALiBiPositions(PositionalEncoding):
    """Attention with linear biases (ALiBi), Press et al. 2022: scores minus m_h times distance.

    Every attention gets the bias -m_h |i - j| for query position i and key position j. In the
    decoder the causal mask leaves j <= i, where it is the paper's -m_h (i - j); the encoder,
    bidirectional, gets the same penalty on both sides. Cross-attention gets it too, with i the
    target position and j the source position. Without that the model could not tell a source
    from its reverse: a symmetric bias is unchanged when the source is read backwards, so the
    encoder's outputs just come out in reverse order, and cross-attention with no positions
    ignores the order of its keys. (Steep heads then favour the diagonal, source i for target
    i; heads with small slopes stay free to look far, as reverse needs.)
    """

    in_attention = True

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # (H,)

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """-m_h |i - j|: (H, T_q, T_k) for positions (T,), (B, H, T_q, T_k) for (B, T)."""
        distance = (q_positions[..., :, None] - k_positions[..., None, :]).abs()  # (.., T_q, T_k)
        distance = distance.unsqueeze(-3).to(self.slopes)  # (..., 1, T_q, T_k)
        return -self.slopes[:, None, None] * distance  # (..., H, T_q, T_k)

    def attention(
        self, q_positions: Tensor, k_positions: Tensor, cross: bool = False
    ) -> AttentionPositions:
        """The bias, in self- and cross-attention alike."""
        return AttentionPositions(bias=self.bias(q_positions, k_positions))


class NoPositions(PositionalEncoding):
    """No positional encoding (NoPE): only the decoder's causal mask carries order.

    The encoder is then permutation-invariant: it sees the source as a multiset, which is enough
    for sort but not for copy or reverse.
    """


# Each scheme by its name in the catalog, built from (max_len, d_model, n_heads).
SCHEMES: dict[str, Callable[[int, int, int], PositionalEncoding]] = {
    "sinusoidal": lambda max_len, d_model, n_heads: SinusoidalPositions(max_len, d_model),
    "learned": lambda max_len, d_model, n_heads: LearnedPositions(max_len, d_model),
    "rope": lambda max_len, d_model, n_heads: RotaryPositions(d_model // n_heads),
    "alibi": lambda max_len, d_model, n_heads: ALiBiPositions(n_heads),
    "none": lambda max_len, d_model, n_heads: NoPositions(),
}


def make_positional(kind: str, max_len: int, d_model: int, n_heads: int = 1) -> PositionalEncoding:
    """The positional scheme `kind`: sinusoidal, learned, rope, alibi or none."""
    assert kind in SCHEMES, f"positional scheme {kind!r} is not one of {POSITIONAL_KINDS}"
    return SCHEMES[kind](max_len, d_model, n_heads)


def sample_positions(lengths: Tensor, width: int, limit: int) -> Tensor:
    """Randomized positions, after Ruoss et al. 2023: per row, a sorted random subset of [0, limit).

    Row b's first n = lengths[b] slots get n distinct positions, sorted, drawn uniformly from
    [0, span) where the span itself is uniform in [n, limit]: span n gives exactly 0..n-1, the
    positions of evaluation, span `limit` the paper's draw from the whole range. (The paper
    draws from the whole range only, and at test time too; evaluated at 0..n-1 instead, such
    models did worse on the trained lengths, as 0..n-1 never came up in training; see
    docs/experiments.md, "Length generalisation".)
    Padding slots get limit - 1 (never attended to). Drawn from torch's global RNG, which
    checkpoints save, so a resumed run draws what a straight run would. Returns (B, width).
    """
    assert width <= limit, f"{width} distinct positions cannot be drawn from [0, {limit})"
    B, device = lengths.size(0), lengths.device
    span = lengths + (torch.rand(B, device=device) * (limit - lengths + 1)).long()  # (B,)
    # Random keys, those past the span made the largest: sorting them puts a random
    # permutation of [0, span) first, and its first n entries are a uniform n-subset.
    keys = torch.rand(B, limit, device=device)  # (B, limit)
    keys = keys.masked_fill(torch.arange(limit, device=device) >= span[:, None], 2.0)
    chosen = keys.argsort(dim=-1)[:, :width]  # (B, width): distinct, in random order
    padding = torch.arange(width, device=device) >= lengths[:, None]  # (B, width)
    # Padding takes the largest value, so after sorting the real tokens come first, in order.
    return chosen.masked_fill(padding, limit - 1).sort(dim=-1).values  # (B, width)
