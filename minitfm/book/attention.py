"""Attention (Vaswani et al. 2017, "Attention Is All You Need", §3.2), the book's first chapter.

In reading order: `attention`, the readable reference of scaled dot-product attention in a few
lines; `additive_mask` and `scaled_dot_product_attention`, the one the model runs (it calls the
speed appendix, `fast/kernels.py`); `KVCache`, the keys and values kept between decoding steps;
`AttentionScope`, what one call attends over; and `MultiHeadAttention` (§3.2.2), H heads side
by side.

Shapes: B batch, S source len, T target len, D d_model, H n_heads, K d_head (= D / H);
T_q and T_k are the query and key lengths of one attention call (T and S in cross-attention,
T and T in decoder self-attention).

Masks are boolean with True meaning "may attend", broadcastable to (B, H, T_q, T_k).

A user's values are checked by the config, with messages naming its keys; the asserts here
only state each primitive's own invariants (d_model a multiple of n_heads).

Positions reach attention as an `AttentionPositions` (RoPE rotations, an ALiBi bias), made by
the schemes in `positions.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from minitfm.book.layers import Dropout
from minitfm.book.positions import NO_POSITIONS, AttentionPositions, Rotation
from minitfm.fast.kernels import AttentionFunction
from minitfm.fast.packing import NO_PACKING, AttentionPacking, Packing


def attention(q: Tensor, k: Tensor, v: Tensor,
              mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, Vaswani et al. 2017, §3.2.1, eq. 1; returns (output, weights).

    The readable reference, as the Annotated Transformer writes it; the model runs
    `scaled_dot_product_attention`, tested equal to it (values and gradients).
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T_q, T_k)
    if mask is not None:  # the lowest value, not -inf: a fully masked row stays finite
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (B, H, T_q, T_k), each row a distribution over keys
    return weights @ v, weights  # (B, H, T_q, K), (B, H, T_q, T_k)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean mask (True = may attend) -> 0 where allowed, the dtype's lowest value elsewhere.

    Added to the scores, the lowest value swamps any score, so a masked key gets exp(min - max)
    = 0 exactly; unlike -inf, a row with every key masked becomes uniform instead of 0/0 = NaN.
    Adding costs one pass over the scores and nothing in backward (torch.where costs one each
    way), and the mask itself is small: (B, 1, 1, T_k) or (T_q, T_k).
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout: Dropout | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, Vaswani et al. 2017, §3.2.1; returns (output, weights).

    `attention` above, plus dropout on the weights and ALiBi's distance penalty `bias`
    (broadcast to (B, H, T_q, T_k), added after scaling). The weights are returned before
    dropout, so each row is a distribution over the keys. The sums are those of
    `AttentionFunction` in `fast/kernels.py`: the same maths with its backward written out,
    which keeps fewer (T_q, T_k) intermediates than autograd would (docs/speed.md).
    """
    additive = bias  # (B or 1, H, T_q, T_k) or None: whatever is added to the scores
    if mask is not None:
        masked = additive_mask(mask, q.dtype)  # (B, 1, 1, T_k) or (T_q, T_k)
        additive = masked if additive is None else additive + masked
    keep = None  # dropout on the weights: Z / (1 - p) per weight, drawn here
    if dropout is not None and dropout.active:
        keep = dropout.scale(q.shape[:-1] + (k.size(-2),), q)  # (B, H, T_q, T_k)
    return AttentionFunction.apply(q, k, v, additive, keep)


@dataclass
class KVCache:
    """Projected keys and values of one attention layer, kept between decoding steps.

    Self-attention appends each step's new keys and values (`grow=True`); cross-attention
    projects the encoder memory once and reuses it (`grow=False`). The appended keys and
    values go into buffers with room to spare, doubled when full, so that a step copies only
    its own keys, not all of them again (`k` and `v` are views of the buffers' filled part).
    """

    grow: bool = True
    k: Tensor | None = None  # (B, H, T_k, K)
    v: Tensor | None = None  # (B, H, T_k, K)
    buffers: tuple[Tensor, Tensor] | None = field(default=None, repr=False)  # (B, H, room, K)

    @property
    def length(self) -> int:
        """Number of cached key positions (0 when empty)."""
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values (B, H, T_new, K); returns all of them so far."""
        start, end = self.length, self.length + k.size(2)
        if self.buffers is None or end > self.buffers[0].size(2):
            room = max(end, 2 * start, 16)  # doubling: O(1) copies per step on average
            self.buffers = tuple(new.new_empty(*new.shape[:2], room, new.size(3))
                                 for new in (k, v))
            if start:
                self.buffers[0][:, :, :start] = self.k
                self.buffers[1][:, :, :start] = self.v
        keys, values = self.buffers
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.k, self.v = keys[:, :, :end], values[:, :, :end]  # (B, H, T_k, K) views
        return self.k, self.v


@dataclass(frozen=True)
class AttentionScope:
    """What one attention call attends over: the keys it may see, positions, packed inputs.

    Built once per encode or decode call and shared by every layer, as its parts are the same
    in each: the mask (None: every key), what positions do inside attention (RoPE, ALiBi, from
    `positions.py`) and which inputs hold only their real tokens (`fast/packing.py`).
    """

    mask: Tensor | None = None  # (B, 1, 1, T_k) padding or (T_q, T_k) causal, True = may attend
    positions: AttentionPositions = NO_POSITIONS
    packing: AttentionPacking = NO_PACKING


EVERY_KEY = AttentionScope()  # frozen, so one shared instance is safe: no mask, nothing else


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017, §3.2.2: H heads of width K = D / H.

    `heads` is a hook point: a named identity applied to the head outputs (B, H, T_q, K) before
    they are concatenated and projected by W^O. Instruments attach forward hooks to it from
    outside, as TransformerLens does, instead of adding parameters here (`minitfm ablate`).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        assert d_model % n_heads == 0, \
            f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})"
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)
        self.heads = nn.Identity()  # the hook point on the head outputs, see above

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, scope: AttentionScope = EVERY_KEY,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from `query` (B, T_q, D) to `key`/`value` (B, T_k, D); returns output, weights.

        `scope` holds the mask, what RoPE or ALiBi do here, and which inputs hold only their
        real tokens, (N, D) (the output is then packed as `query`); `cache` keeps the keys and
        values between decoding steps.
        """
        positions, packing = scope.positions, scope.packing
        q = self.q_proj(query)  # (B, T_q, D), or (N_q, D) packed
        if packing.queries is not None:
            q = packing.queries.unpack(q)  # (B, T_q, D), zeros at the padding
        B, T_q, D = q.shape
        q = self.split_heads(q)  # (B, H, T_q, K)
        if positions.queries is not None:
            q = positions.queries.rotate(q)  # (B, H, T_q, K), RoPE
        k, v = self.project_kv(key, value, cache, positions.keys, packing.keys)  # (B, H, T_k, K)
        out, weights = scaled_dot_product_attention(q, k, v, scope.mask, self.dropout,
                                                    positions.bias)
        out = self.heads(out)  # (B, H, T_q, K): the hook point, the identity unless hooked
        out = out.transpose(1, 2).reshape(B, T_q, D)  # (B, T_q, D): heads concatenated
        if packing.queries is not None:
            out = packing.queries.pack(out)  # (N_q, D)
        return self.out_proj(out), weights  # (B, T_q, D) or (N_q, D), (B, H, T_q, T_k)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, K): one slice of width K per head, each head's (T, K) matrix
        contiguous, as the batched matmuls of attention read them (copied once, here)."""
        B, T, _ = x.shape
        heads = x.view(B, T, self.n_heads, self.d_head)  # (B, T, H, K)
        return heads.transpose(1, 2).contiguous()  # (B, H, T, K)

    def project_kv(
        self, key: Tensor, value: Tensor, cache: KVCache | None, rotation: Rotation | None = None,
        packing: Packing | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Keys and values for this call, read from or written to `cache` when one is given."""
        if cache is not None and not cache.grow and cache.k is not None:
            return cache.k, cache.v  # cross-attention: the memory was projected at step 0
        k, v = self.k_proj(key), self.v_proj(value)  # (B, T_new, D), or (N_k, D) packed
        if packing is not None:
            k, v = packing.unpack(k), packing.unpack(v)  # (B, T_new, D), zeros at the padding
        k, v = self.split_heads(k), self.split_heads(v)  # (B, H, T_new, K) each
        if rotation is not None:  # RoPE: rotated before caching, so a cached key never changes
            k = rotation.rotate(k)  # (B, H, T_new, K)
        if cache is None:
            return k, v
        if not cache.grow:  # cross-attention, step 0: keep the memory's keys and values
            cache.k, cache.v = k, v
            return k, v
        return cache.append(k, v)  # (B, H, T_cached + T_new, K) each
