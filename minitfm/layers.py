"""Hand-written transformer primitives (Vaswani et al. 2017, "Attention Is All You Need").

Attention, multi-head attention, layer norm, dropout, the feed-forward block and positional
encodings, written from tensor operations so each line can be read against the paper and the
seed notes (`shared/seeds/000_*`: layer norm gain γ and shift δ, Bernoulli dropout).

Shapes: B batch, S source len, T target len, D d_model, H n_heads, K d_head (= D / H),
F d_ff; T_q and T_k are the query and key lengths of one attention call (T and S in
cross-attention, T and T in decoder self-attention).

Masks are boolean with True meaning "may attend", broadcastable to (B, H, T_q, T_k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitfm.errors import MinitfmError

POSITIONAL_KINDS = ("sinusoidal", "learned", "none")


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: nn.Module | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, Vaswani et al. 2017, §3.2.1; returns (output, weights).

    The weights are returned before dropout, so each row is a distribution over the keys.
    """
    scores = q @ k.transpose(-2, -1) * (q.size(-1) ** -0.5)  # (B, H, T_q, T_k)
    if mask is not None:
        # The dtype's lowest value rather than -inf: a masked key still gets exp(min - max) = 0
        # exactly, but a row with every key masked becomes uniform instead of 0/0 = NaN.
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)  # (B, H, T_q, T_k)
    weights = scores.softmax(dim=-1)  # (B, H, T_q, T_k), rows sum to 1
    dropped = dropout(weights) if dropout is not None else weights
    return dropped @ v, weights  # (B, H, T_q, K), (B, H, T_q, T_k)


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
    ) -> tuple[Tensor, Tensor]:
        """Attend from `query` (B, T_q, D) to `key`/`value` (B, T_k, D); returns output, weights."""
        B, T_q, D = query.shape
        q = self.split_heads(self.q_proj(query))  # (B, H, T_q, K)
        k, v = self.project_kv(key, value, cache)  # (B, H, T_k, K) each
        out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout)
        out = out.transpose(1, 2).reshape(B, T_q, D)  # (B, T_q, D): heads concatenated
        return self.out_proj(out), weights  # (B, T_q, D), (B, H, T_q, T_k)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, K): one slice of width K per head."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, K)

    def project_kv(
        self, key: Tensor, value: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """Keys and values for this call, read from or written to `cache` when one is given."""
        if cache is not None and not cache.grow and cache.k is not None:
            return cache.k, cache.v  # cross-attention: the memory was projected at step 0
        k = self.split_heads(self.k_proj(key))  # (B, H, T_new, K)
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
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


# Positional encodings. Each maps token embeddings x (B, T, D) to x plus the encoding of
# positions offset..offset+T-1; `offset` is the number of tokens already decoded when a KV cache
# is used. Schemes that act inside attention (RoPE, ALiBi) would return x unchanged here and
# hand a rotation or bias to MultiHeadAttention instead; none is implemented yet.


def sinusoids(length: int, d_model: int) -> Tensor:
    """The sinusoid table PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...), §3.5."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (D/2,)
    angles = position * inv_freq  # (L, ceil(D/2))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table  # (L, D)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positional encoding, Vaswani et al. 2017, §3.5; works at any length."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.d_model = d_model
        # A cache, not a parameter: persistent=False keeps it out of checkpoints.
        self.register_buffer("table", sinusoids(max_len, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, T, D) plus the encodings of positions offset..offset+T-1."""
        end = offset + x.size(1)
        if end > self.table.size(0):  # longer than ever seen: grow the cache
            self.table = sinusoids(end, self.d_model).to(self.table)
        return x + self.table[offset:end]  # (B, T, D)


class LearnedPositions(nn.Module):
    """Learned absolute position embeddings (Vaswani et al. 2017, §3.5; Gehring et al. 2017)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        # Same scale as the sinusoids (rms 1/sqrt(2)) so either kind meets the embeddings alike.
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.5**0.5)  # (max_len, D)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, T, D) plus the learned vectors of positions offset..offset+T-1."""
        end = offset + x.size(1)
        if end > self.max_len:
            raise MinitfmError(f"sequence length {end} exceeds model.max_len ({self.max_len}) of "
                               f"learned positions; retrain with a larger model.max_len or use "
                               f"positional: sinusoidal")
        return x + self.weight[offset:end]  # (B, T, D)


class NoPositions(nn.Module):
    """No positional information: attention alone is order-blind (a baseline to compare)."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x unchanged."""
        return x


def make_positional(kind: str, max_len: int, d_model: int) -> nn.Module:
    """The positional-encoding module for `model.positional` (sinusoidal, learned or none)."""
    if kind == "sinusoidal":
        return SinusoidalPositions(max_len, d_model)
    if kind == "learned":
        return LearnedPositions(max_len, d_model)
    if kind == "none":
        return NoPositions()
    raise MinitfmError(f"model.positional ({kind!r}) must be one of {', '.join(POSITIONAL_KINDS)}")
