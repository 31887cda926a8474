"""Hand-written transformer primitives (Vaswani et al. 2017, "Attention Is All You Need").

Attention, multi-head attention, layer norm, dropout, the feed-forward block and positional
encodings, written from tensor operations so each line can be read against the paper and the
seed notes (`shared/seeds/000_*`: layer norm gain γ and shift δ, Bernoulli dropout).

Shapes: B batch, S source len, T target len, D d_model, H n_heads, K d_head (= D / H),
F d_ff; T_q and T_k are the query and key lengths of one attention call (T and S in
cross-attention, T and T in decoder self-attention).

Masks are boolean with True meaning "may attend", broadcastable to (B, H, T_q, T_k).

Positions. A positional scheme either adds a vector to each token embedding (sinusoidal,
learned) or acts inside attention (RoPE rotates queries and keys, ALiBi adds a bias to the
scores); `PositionalEncoding` has one hook for each, so the model treats all schemes alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitfm.errors import MinitfmError

POSITIONAL_KINDS = ("sinusoidal", "learned", "rope", "alibi", "none")


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout: nn.Module | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, Vaswani et al. 2017, §3.2.1; returns (output, weights).

    The weights are returned before dropout, so each row is a distribution over the keys.
    `bias` (broadcast to (B, H, T_q, T_k)) is ALiBi's distance penalty, added after scaling.
    """
    scores = q @ k.transpose(-2, -1) * (q.size(-1) ** -0.5)  # (B, H, T_q, T_k)
    if bias is not None:
        scores = scores + bias  # (B, H, T_q, T_k)
    if mask is not None:
        scores = scores + additive_mask(mask, scores.dtype)  # (B, H, T_q, T_k)
    weights = scores.softmax(dim=-1)  # (B, H, T_q, T_k), rows sum to 1
    dropped = dropout(weights) if dropout is not None else weights
    return dropped @ v, weights  # (B, H, T_q, K), (B, H, T_q, T_k)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean mask (True = may attend) -> 0 where allowed, the dtype's lowest value elsewhere.

    Added to the scores, the lowest value swamps any score, so a masked key gets exp(min - max)
    = 0 exactly; unlike -inf, a row with every key masked becomes uniform instead of 0/0 = NaN.
    Adding costs one pass over the scores and nothing in backward (torch.where costs one each
    way), and the mask itself is small: (B, 1, 1, T_k) or (T_q, T_k).
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min)


@dataclass
class KVCache:
    """Projected keys and values of one attention layer, kept between decoding steps.

    Self-attention appends each step's new keys and values (`grow=True`); cross-attention
    projects the encoder memory once and reuses it (`grow=False`).
    """

    grow: bool = True
    k: Tensor | None = None  # (B, H, T_k, K)
    v: Tensor | None = None  # (B, H, T_k, K)

    @property
    def length(self) -> int:
        """Number of cached key positions (0 when empty)."""
        return 0 if self.k is None else self.k.size(2)


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


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017, §3.2.2: H heads of width K = D / H."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise MinitfmError(f"model.d_model ({d_model}) must be divisible by "
                               f"model.n_heads ({n_heads})")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        positions: AttentionPositions | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from `query` (B, T_q, D) to `key`/`value` (B, T_k, D); returns output, weights.

        `positions` is set only for schemes that act inside attention (RoPE, ALiBi).
        """
        B, T_q, D = query.shape
        positions = positions or NO_POSITIONS
        q = self.split_heads(self.q_proj(query))  # (B, H, T_q, K)
        if positions.queries is not None:
            q = positions.queries.rotate(q)  # (B, H, T_q, K), RoPE
        k, v = self.project_kv(key, value, cache, positions.keys)  # (B, H, T_k, K) each
        out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout, positions.bias)
        out = out.transpose(1, 2).reshape(B, T_q, D)  # (B, T_q, D): heads concatenated
        return self.out_proj(out), weights  # (B, T_q, D), (B, H, T_q, T_k)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, K): one slice of width K per head."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, K)

    def project_kv(
        self, key: Tensor, value: Tensor, cache: KVCache | None, rotation: Rotation | None = None
    ) -> tuple[Tensor, Tensor]:
        """Keys and values for this call, read from or written to `cache` when one is given."""
        if cache is not None and not cache.grow and cache.k is not None:
            return cache.k, cache.v  # cross-attention: the memory was projected at step 0
        k = self.split_heads(self.k_proj(key))  # (B, H, T_new, K)
        if rotation is not None:  # RoPE: rotated before caching, so a cached key never changes
            k = rotation.rotate(k)  # (B, H, T_new, K)
        v = self.split_heads(self.v_proj(value))  # (B, H, T_new, K)
        if cache is not None:
            if cache.k is not None:
                k = torch.cat([cache.k, k], dim=2)  # (B, H, T_cached + T_new, K)
                v = torch.cat([cache.v, v], dim=2)  # (B, H, T_cached + T_new, K)
            cache.k, cache.v = k, v
        return k, v


class LayerNormFunction(torch.autograd.Function):
    """Layer norm with its backward written out: half the ops of autograd's, ~1.5x faster on CPU."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # X - mean, (..., D)
        var = centred.square().mean(dim=-1, keepdim=True)  # s², the biased variance, (..., 1)
        rstd = torch.rsqrt(var + eps)  # 1 / sqrt(s² + ε), (..., 1)
        x_hat = centred * rstd  # (..., D)
        ctx.save_for_backward(x_hat, rstd, weight)
        return torch.addcmul(bias, x_hat, weight)  # δ + γ ⊙ x_hat, (..., D)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        x_hat, rstd, weight = ctx.saved_tensors
        D = grad.size(-1)
        grad_weight = (grad * x_hat).reshape(-1, D).sum(dim=0)  # dL/dγ, (D,)
        grad_bias = grad.reshape(-1, D).sum(dim=0)  # dL/dδ, (D,)
        g = grad * weight  # dL/dx_hat, (..., D)
        # x_hat = (X - mean) * rstd depends on every X_j through mean and s²; its Jacobian
        # gives dL/dX = rstd * (g - mean(g) - x_hat * mean(g ⊙ x_hat)).
        proj = (g * x_hat).mean(dim=-1, keepdim=True)  # (..., 1)
        grad_x = (g - g.mean(dim=-1, keepdim=True) - x_hat * proj) * rstd  # (..., D)
        return grad_x, grad_weight, grad_bias, None


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016), seed notes §5.1: γ (X - mean) / sqrt(s² + ε) + δ."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # γ, the gain
        self.bias = nn.Parameter(torch.zeros(d_model))  # δ, the shift

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each position's D features to mean 0 and variance 1, then scale and shift."""
        return LayerNormFunction.apply(x, self.weight, self.bias, self.eps)


class Dropout(nn.Module):
    """Dropout (Srivastava et al. 2014), seed notes §5.2: Z ⊙ X / (1 - p), Z ~ Bernoulli(1 - p)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise MinitfmError(f"model.dropout ({p}) must be in [0, 1)")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """Zero each element with probability p in training, scaling the rest to keep the mean."""
        if not self.training or self.p == 0.0:
            return x
        # Z = 1[U >= p] for U ~ Uniform[0, 1) is Bernoulli(1 - p); on CPU one uniform draw and a
        # comparison are ~2x faster than bernoulli_. Inverted scaling: divide by 1 - p now, so
        # evaluation is the identity. Draws from torch's global RNG, which checkpoints save.
        scale = torch.rand_like(x).ge_(self.p).div_(1.0 - self.p)  # Z / (1 - p), (...)
        return x * scale

    def extra_repr(self) -> str:
        return f"p={self.p}"


class FeedForward(nn.Module):
    """Position-wise feed-forward, Vaswani et al. 2017, §3.3: Linear, ReLU, dropout, Linear.

    The dropout on the hidden layer is the tensor2tensor / Annotated Transformer variant
    (the paper's eq. 2 has none); nn.TransformerEncoderLayer does the same.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., F) -> (..., D), the same weights at every position."""
        hidden = torch.relu(self.linear1(x))  # (..., F)
        return self.linear2(self.dropout(hidden))


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
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (D/2,)
    angles = position * inv_freq  # (L, ceil(D/2))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table  # (L, D)


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
        if positions is not None:  # (B, T), below model.max_len (the config checks it)
            return x + self.weight[positions]  # (B, T, D)
        end = offset + x.size(1)
        if end > self.max_len:
            raise MinitfmError(f"sequence length {end} exceeds model.max_len ({self.max_len}) of "
                               f"learned positions; retrain with a larger model.max_len or use "
                               f"positional: sinusoidal")
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
        if d_head % 2:
            raise MinitfmError(f"positional rope needs an even d_head (d_model / n_heads), "
                               f"not {d_head}")
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


def make_positional(kind: str, max_len: int, d_model: int, n_heads: int = 1) -> PositionalEncoding:
    """The positional scheme for `model.positional`: sinusoidal, learned, rope, alibi or none."""
    if kind == "sinusoidal":
        return SinusoidalPositions(max_len, d_model)
    if kind == "learned":
        return LearnedPositions(max_len, d_model)
    if kind == "rope":
        return RotaryPositions(d_model // n_heads)
    if kind == "alibi":
        return ALiBiPositions(n_heads)
    if kind == "none":
        return NoPositions()
    raise MinitfmError(f"model.positional ({kind!r}) must be one of {', '.join(POSITIONAL_KINDS)}")


def sample_positions(lengths: Tensor, width: int, limit: int) -> Tensor:
    """Randomized positions, after Ruoss et al. 2023: per row, a sorted random subset of [0, limit).

    Row b's first n = lengths[b] slots get n distinct positions, sorted, drawn uniformly from
    [0, span) where the span itself is uniform in [n, limit]: span n gives exactly 0..n-1, the
    positions of evaluation, span `limit` the paper's draw from the whole range. (The paper
    draws from the whole range only, and at test time too; evaluated at 0..n-1 instead, such
    models did worse on the trained lengths, as 0..n-1 never came up in training; see README.)
    Padding slots get limit - 1 (never attended to). Drawn from torch's global RNG, which
    checkpoints save, so a resumed run draws what a straight run would. Returns (B, width).
    """
    if width > limit:
        raise MinitfmError(f"model.random_positions ({limit}) is smaller than the {width} "
                           f"positions of a training sequence: raise it above the longest one")
    B, device = lengths.size(0), lengths.device
    span = lengths + (torch.rand(B, device=device) * (limit - lengths + 1)).long()  # (B,)
    # Random keys, those past the span made the largest: sorting them puts a random
    # permutation of [0, span) first, and its first n entries are a uniform n-subset.
    keys = torch.rand(B, limit, device=device)  # (B, L)
    keys = keys.masked_fill(torch.arange(limit, device=device) >= span[:, None], 2.0)
    chosen = keys.argsort(dim=-1)[:, :width]  # (B, width): distinct, in random order
    padding = torch.arange(width, device=device) >= lengths[:, None]  # (B, width)
    # Padding takes the largest value, so after sorting the real tokens come first, in order.
    return chosen.masked_fill(padding, limit - 1).sort(dim=-1).values  # (B, width)
